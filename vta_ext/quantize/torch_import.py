"""PyTorch front end of the quantiser: BatchNorm folding, cross-layer equalisation, and the
``torch.export`` import that remembers which torch layer every Relax binding came from."""
from __future__ import annotations

import copy
import logging
import re
import warnings
from typing import Dict, List, Tuple

import numpy as np
import tvm
from tvm import relax

from .common import QuantizationError

__all__ = ["fold_batchnorm", "equalize_cross_layer", "import_torch", "import_exported_program",
           "normalise", "SOURCE_ATTR", "source_layers"]

logger = logging.getLogger("vta_ext.quantize")

#: function attribute of ``main``: Relax variable name -> [torch module path, aten operator]
SOURCE_ATTR = "vta_ext.source_layers"


def _traced(model):
    import torch.fx

    return torch.fx.symbolic_trace(model)


def fold_batchnorm(model):
    """Fold every eval-mode ``BatchNorm2d`` into the ``Conv2d`` that feeds only it.

    The model is traced with ``torch.fx`` only to find the conv -> BN pairs; the folding is done
    on a deep copy of the model itself (the conv takes the folded weights and bias, the BN becomes
    ``nn.Identity``), so the copy keeps the model's code and module paths, which name the layers
    in the quantiser's messages and records.

    Parameters
    ----------
    model : torch.nn.Module
        A model in eval mode.

    Returns
    -------
    torch.nn.Module
        The folded copy (the input model is not modified). If ``torch.fx`` cannot trace the model,
        the copy is returned unfolded; the quantiser then folds each BatchNorm that follows a
        convolution in Relax (the same arithmetic), and cross-layer equalisation is skipped.
    """
    import torch
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    if model.training:
        raise QuantizationError("fold_batchnorm needs a model in eval mode (call model.eval())")
    folded = copy.deepcopy(model)
    try:
        gm = _traced(folded)
    except Exception as err:  # noqa: BLE001 - tracing is an optimisation, reported in the log
        logger.warning("torch.fx cannot trace %s (%s: %s); BatchNorm is folded in Relax instead",
                       type(model).__name__, type(err).__name__, err)
        return folded
    modules = dict(folded.named_modules())
    calls: Dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), torch.nn.BatchNorm2d):
            continue
        prev = node.args[0]
        if not (isinstance(prev, torch.fx.Node) and prev.op == "call_module"
                and isinstance(modules.get(prev.target), torch.nn.Conv2d) and len(prev.users) == 1
                and calls[prev.target] == 1 and calls[node.target] == 1):
            continue
        fused = fuse_conv_bn_eval(modules[prev.target], modules[node.target])
        for path, module in ((prev.target, fused), (node.target, torch.nn.Identity())):
            parent, _, attr = path.rpartition(".")
            setattr(folded.get_submodule(parent) if parent else folded, attr, module)
            modules[path] = module
    return folded


def equalize_cross_layer(model, sweeps: int = 8) -> int:
    """Cross-layer weight equalisation (Nagel et al., 2019, "Data-free quantization") in place.

    For every ``Conv2d`` A whose only consumer is a ReLU whose only consumer is a ``Conv2d`` B
    (B plain, ``groups=1``, or depthwise; ``nn.Identity`` in between is skipped), output channel
    ``i`` of A is divided by ``s_i = sqrt(r1_i / r2_i)`` and input channel ``i`` of B multiplied by
    it, where ``r1_i`` and ``r2_i`` are the largest ``|w|`` of that channel in A and in B. ReLU
    commutes with a positive scale, so the float function is unchanged, while the per-channel
    weight ranges of both layers become equal — which is what a per-tensor weight scale needs
    (depthwise convolutions with folded BatchNorm otherwise have channels whose range is tens of
    times the median).

    Parameters
    ----------
    model : torch.nn.Module
        A model with BatchNorm already folded (:func:`fold_batchnorm`).
    sweeps : int
        Passes over all pairs (scales of a chain of pairs interact; a few passes settle them).

    Returns
    -------
    int
        The number of equalised pairs (0 if ``torch.fx`` cannot trace the model).
    """
    import torch

    try:
        gm = _traced(model)
    except Exception as err:  # noqa: BLE001
        logger.warning("torch.fx cannot trace %s (%s); no cross-layer equalisation",
                       type(model).__name__, err)
        return 0
    modules = dict(model.named_modules())

    def module_of(node, kind):
        if node.op == "call_module" and isinstance(modules.get(node.target), kind):
            return modules[node.target]
        return None

    def only_user(node):
        """The single user of ``node``, skipping ``nn.Identity`` modules."""
        while len(node.users) == 1:
            node = next(iter(node.users))
            if module_of(node, torch.nn.Identity) is None:
                return node
        return None

    def is_relu(node) -> bool:
        return (module_of(node, torch.nn.ReLU) is not None
                or (node.op == "call_function" and node.target in (torch.relu,
                                                                    torch.nn.functional.relu)))

    pairs = []
    for node in gm.graph.nodes:
        a = module_of(node, torch.nn.Conv2d)
        relu = only_user(node) if a is not None else None
        if relu is None or not is_relu(relu):
            continue
        consumer = only_user(relu)
        b = module_of(consumer, torch.nn.Conv2d) if consumer is not None else None
        if b is None or b.in_channels != a.out_channels:
            continue
        if b.groups == 1 or b.groups == b.in_channels == b.out_channels:
            pairs.append((a, b))
    with torch.no_grad():
        for _ in range(sweeps):
            for a, b in pairs:
                r1 = a.weight.abs().reshape(a.out_channels, -1).amax(1).double()
                wb = b.weight.abs()
                r2 = (wb.amax(dim=(0, 2, 3)) if b.groups == 1 else wb.reshape(b.out_channels, -1)
                      .amax(1)).double()
                s = torch.where((r1 > 0) & (r2 > 0), torch.sqrt(r1 / r2.clamp_min(1e-300)),
                                torch.ones_like(r1))
                a.weight.div_(s.reshape(-1, 1, 1, 1).to(a.weight.dtype))
                if a.bias is not None:
                    a.bias.div_(s.to(a.bias.dtype))
                shape = (1, -1, 1, 1) if b.groups == 1 else (-1, 1, 1, 1)
                b.weight.mul_(s.reshape(shape).to(b.weight.dtype))
    return len(pairs)


def _module_path(node) -> str:
    stack = list(node.meta.get("nn_module_stack", {}).values())
    if not stack:
        return ""
    path = str(stack[-1][0])
    path = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", path)
    return path


def _aten_name(node) -> str:
    name = getattr(node.target, "__module__", None) == "_operator" and node.target.__name__ \
        or str(node.target)
    return name[:-len(".default")] if name.endswith(".default") else name


#: the FutureWarning that torch 2.13 issues inside ``ExportedProgram.run_decompositions`` (a
#: regular expression for :func:`warnings.filterwarnings`)
LEAFSPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def import_exported_program(program, **kwargs) -> tvm.IRModule:
    """``from_exported_program`` that records the torch layer of every Relax binding.

    TVM 0.27's importer keeps no source information, so the importer's own node -> variable map
    is read after the import: every binding of ``main`` belongs to the torch node whose result is
    the next variable in the map (a node's helper bindings, such as a bias reshape, precede its
    result). The torch layer is the innermost module path of ``node.meta["nn_module_stack"]``.

    Returns
    -------
    tvm.IRModule
        The float module; ``main`` carries the attribute :data:`SOURCE_ATTR`: variable name ->
        ``[module path, aten operator]`` (module path ``""`` for a top-level functional call).
    """
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    with warnings.catch_warnings():
        # torch 2.13's run_decompositions deep-copies its own pytree LeafSpec objects, which warns
        # (from copyreg.py) on every call; nothing the caller can change: silence that one here
        warnings.filterwarnings("ignore", message=LEAFSPEC_WARNING, category=FutureWarning)
        program = program.run_decompositions()
    importer = ExportedProgramImporter()
    mod = importer.from_exported_program(program, kwargs.get("keep_params_as_input", False),
                                         False, False, kwargs.get("custom_convert_map"))
    result_of: Dict[str, object] = {}
    for node, value in importer.env.items():
        if isinstance(value, relax.Var) and node.op == "call_function":
            result_of.setdefault(value.name, node)
    layers: Dict[str, List[str]] = {}
    pending: List[str] = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            pending.append(binding.var.name)
            node = result_of.get(binding.var.name)
            if node is not None:
                path = _module_path(node) or f"(top level) {node.name}"
                for name in pending:
                    layers[name] = [path, _aten_name(node)]
                pending = []
    return tvm.IRModule({"main": mod["main"].with_attr(SOURCE_ATTR, layers)}, attrs=mod.attrs)


def source_layers(func: relax.Function) -> Dict[str, Tuple[str, str]]:
    """Variable name -> (torch module path, aten operator) recorded by the importer, or {}."""
    attrs = func.attrs
    if attrs is None or SOURCE_ATTR not in attrs:
        return {}
    return {str(k): (str(v[0]), str(v[1])) for k, v in attrs[SOURCE_ATTR].items()}


def normalise(mod: tvm.IRModule) -> tvm.IRModule:
    """FoldConstant, CanonicalizeBindings, DeadCodeElimination."""
    return tvm.transform.Sequential([
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ])(mod)


def import_torch(model, example: np.ndarray, equalize: bool = True) -> tvm.IRModule:
    """Fold BatchNorm, ``torch.export`` the model and import it as a float32 Relax module.

    Parameters
    ----------
    model : torch.nn.Module
        Float model in eval mode, one tensor input.
    example : numpy.ndarray
        An input of the shape the module is specialised to.
    equalize : bool
        Apply :func:`equalize_cross_layer` after folding (exact in float arithmetic).

    Returns
    -------
    tvm.IRModule
        Normalised float Relax module with the weights bound as constants, and the torch layer of
        every binding (:func:`source_layers`).
    """
    import torch

    folded = fold_batchnorm(model)
    if equalize:
        equalize_cross_layer(folded)
    with torch.no_grad():
        program = torch.export.export(folded, (torch.from_numpy(np.ascontiguousarray(example)),))
    return normalise(import_exported_program(program))
