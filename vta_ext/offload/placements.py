"""The build report of one run of the offload pass: every operator's placement and why.

VTA operators with their plans (what the rewriter recorded), then every operator left in the
module in program order: the host layout work around VTA operators (and its bytes), the concats,
splits and shuffles made on packed tensors (where their source stood), and every CPU operator with
its reason (a template's refusal, a frontend's note, why a candidate matched no pattern, or no
VTA template). Source layers come from the function attributes a frontend sets
(:data:`~vta_ext.report.LAYERS_ATTR`, :data:`~vta_ext.report.CPU_REASONS_ATTR`).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import tvm
from tvm import relax

from ..config import VTAConfig
from ..host import VIEW_OPS
from ..options import current_options
from ..quantize import op_macs
from ..quantize.common import op_name as _op_name
from ..report import CPU, CPU_REASONS_ATTR, LAYERS_ATTR, LAYOUT_REASON, VTA, BuildReport, config_label
from .match import CANDIDATE_REASONS
from .names import PACK_PREFIX, UNPACK_PREFIX
from .rewrite import Offloader

__all__ = ["build_report"]


def build_report(mod: tvm.IRModule, new_mod: tvm.IRModule, rewriter: Offloader,
                 config: VTAConfig) -> BuildReport:
    """The :class:`~vta_ext.report.BuildReport` of ``rewriter``'s run over ``mod``, which gave
    ``new_mod`` (after dead-code elimination)."""
    layers, frontend_reasons = _source_notes(mod)
    report = BuildReport(config_label(config), current_options().strategy_name,
                         host=current_options().host, vta_keys=list(rewriter.op_keys))
    for op, what, detail, var, fields in rewriter.offloaded:
        report.add(op, VTA, what, detail, var, layers.get(var, ""), **fields)
    remaining = {var for func in new_mod.functions.values() if isinstance(func, relax.Function)
                 for _, var in _cpu_ops(func)}
    # the packed concat / split / shuffle entries go where their source stood in the input
    order = {var: i for func in mod.functions.values() if isinstance(func, relax.Function)
             for i, (_, var) in enumerate(_cpu_ops(func))}
    packed_entries = []
    for source, (op, text, packed) in rewriter.packed.packed_ops.items():
        if source in remaining:
            continue  # the NCHW version runs on the CPU too and is reported as such
        if op == "relax.concat":
            placed = rewriter.packed.placed_concats.get(packed, [])
            if packed in remaining:
                why = ("a CPU operator uses the packed concat" if packed in
                       rewriter.packed.concat_parts else "more than one batch block: the parts are "
                       "not contiguous in the concat, so they cannot be placed")
                text += f": one host copy of the packed tensors ({why}), no unpack/pack)"
            else:
                text += (f": placed in DRAM by its consumer {', '.join(placed)} "
                         "(vta_ext.run_placed writes each part where it starts in the "
                         "operand), no copy, no unpack/pack)")
        else:
            text += ", no unpack/pack)"
        packed_entries.append((order.get(source, len(order)), op, text, source))
    packed_entries.sort(key=lambda e: e[0])
    sizes = {var: n for func in new_mod.functions.values() if isinstance(func, relax.Function)
             for var, n in _binding_bytes(func).items()}

    def add_packed(before: int) -> None:
        while packed_entries and packed_entries[0][0] < before:
            _, op, text, source = packed_entries.pop(0)
            report.add(op, CPU, text, source, source, layers.get(source, ""))

    for func in new_mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for op, var in _cpu_ops(func):
            if op == "relax.call_dps_packed":
                continue
            if var in order:
                add_packed(order[var])
            if var.startswith((PACK_PREFIX, UNPACK_PREFIX)) or var in rewriter.unpack_vars:
                reason = LAYOUT_REASON
                if op not in VIEW_OPS:
                    report.layout_bytes += sizes.get(var, 0)
            elif var in rewriter.rejected:
                reason = rewriter.rejected[var]
            elif var in frontend_reasons:
                reason = frontend_reasons[var]
            elif op in CANDIDATE_REASONS:
                reason = CANDIDATE_REASONS[op]
            else:
                reason = "no VTA template for this operator"
            report.add(op, CPU, reason, var, var, layers.get(var, ""))
    add_packed(len(order) + 1)
    report.cpu_macs = _cpu_macs(mod, report)
    return report


def _binding_bytes(func: relax.Function) -> Dict[str, int]:
    """Var name -> bytes of its tensor value, for the bindings of ``func`` with a static shape."""
    out: Dict[str, int] = {}
    for block in getattr(func.body, "blocks", []):
        for binding in block.bindings:
            ty = getattr(binding.var, "ty", None)
            try:
                dims = [int(d) for d in ty.shape]
                bits = tvm.runtime.DataType(str(ty.dtype)).bits
            except (AttributeError, TypeError, ValueError):
                continue
            out[binding.var.name] = int(np.prod(dims, dtype=np.int64)) * max(1, bits // 8)
    return out


def _cpu_macs(mod: tvm.IRModule, report: BuildReport) -> int:
    """MACs of the conv2d / matmul operators of ``mod`` that the report leaves on the CPU."""
    try:
        macs = op_macs(mod)
    except Exception:  # noqa: BLE001 -- a module without a plain ``main``: nothing to attribute
        return 0
    return sum(macs[p.name][1] for p in report.on_cpu
               if p.reason != LAYOUT_REASON and p.name in macs and p.op == macs[p.name][0])


def _cpu_ops(func: relax.Function) -> List[Tuple[str, str]]:
    """(op, var name) of every operator call left in ``func``."""
    found: List[Tuple[str, str]] = []

    def visit(expr):
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for binding in block.bindings:
                    name = _op_name(binding.value)
                    if name is not None:
                        found.append((name, binding.var.name))
                    visit(binding.value)
            visit(expr.body)
        elif isinstance(expr, relax.If):
            visit(expr.true_branch)
            visit(expr.false_branch)

    visit(func.body)
    return found


def _source_notes(mod: tvm.IRModule) -> Tuple[Dict[str, str], Dict[str, str]]:
    """The :data:`LAYERS_ATTR` and :data:`CPU_REASONS_ATTR` maps of every Relax function."""
    layers: Dict[str, str] = {}
    reasons: Dict[str, str] = {}
    for func in mod.functions.values():
        attrs = func.attrs if isinstance(func, relax.Function) and func.attrs else {}
        for name, target in ((LAYERS_ATTR, layers), (CPU_REASONS_ATTR, reasons)):
            if name in attrs:
                target.update({str(k): str(v) for k, v in attrs[name].items()})
    return layers, reasons
