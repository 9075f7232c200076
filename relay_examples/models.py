"""ResNet-18 and MobileNet-1.0 (v1) as plain PyTorch modules, with deterministic random weights.

No torchvision and no downloads: the architectures are written out here, following He et al.
(2016, ImageNet ResNet-18, BasicBlock) and Howard et al. (2017, MobileNet v1, width multiplier 1.0,
3x3 depthwise + 1x1 pointwise blocks, each followed by BatchNorm and ReLU).

Weights are random but reproducible (:func:`make_model`):

* convolutions and the classifier use He (Kaiming) normal initialisation from a seeded generator;
* BatchNorm affine parameters are random, gamma in [0.5, 1.0] and beta in [0, 0.5]. A positive
  beta keeps most ReLUs active, which keeps the random network in the stable regime of a trained
  one; with zero-mean beta, random BN networks are chaotic (MobileNet at 64x64: 1 % input noise
  already drops the cosine similarity of the logits to 0.94), which would drown any
  quantisation error measurement;
* BatchNorm running statistics are *estimated* by one training-mode forward pass (momentum 1) on a
  fixed random batch of the requested input size (2 images at 224x224, more at smaller sizes), so every channel has its own non-trivial mean and
  variance and activations keep a sane range through the depth of the network, as in a trained one.

The models are returned in eval mode. Both end in a global average pool, so any input size that
survives the strides (32 for both networks) works; the reference size is 224x224.
"""
from __future__ import annotations

import functools
from typing import List, Tuple

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNet18", "MobileNetV1", "make_model", "MODELS"]


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> List[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, cout, 3, stride)
        self.conv2, self.bn2 = _conv_bn(cout, cout, 3, 1)
        self.relu = nn.ReLU()
        self.downsample = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) \
            if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + identity)


class ResNet18(nn.Module):
    """ImageNet ResNet-18: 7x7/2 stem, 3x3/2 max pool, 4 stages of 2 BasicBlocks, global pool, FC."""

    def __init__(self, num_classes: int = 1000, stages: Tuple[int, ...] = (2, 2, 2, 2)) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 64, 7, 2)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for i, blocks in enumerate(stages):
            cout = 64 << i
            for j in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


#: MobileNet v1 depthwise-separable blocks: (output channels of the pointwise conv, stride).
MOBILENET_V1_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                       (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))


class MobileNetV1(nn.Module):
    """MobileNet v1 (width 1.0): 3x3/2 stem, 13 depthwise-separable blocks, global pool, FC."""

    def __init__(self, num_classes: int = 1000,
                 blocks: Tuple[Tuple[int, int], ...] = MOBILENET_V1_BLOCKS) -> None:
        super().__init__()
        layers: List[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU()]
        cin = 32
        for cout, stride in blocks:
            layers += [*_conv_bn(cin, cin, 3, stride, groups=cin), nn.ReLU(),
                       *_conv_bn(cin, cout, 1, 1), nn.ReLU()]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.fc(torch.flatten(x, 1))


MODELS = {"resnet18": ResNet18, "mobilenet_v1": MobileNetV1}


def make_model(name: str, size: int = 224, seed: int = 0, **kwargs) -> nn.Module:
    """Build model ``name`` with deterministic random weights, BN statistics estimated at ``size``.

    Parameters
    ----------
    name : str
        ``"resnet18"`` or ``"mobilenet_v1"``.
    size : int
        Input height and width used to estimate the BatchNorm running statistics.
    seed : int
        Seed of every random draw (weights, BN affine parameters, the statistics batch).
    **kwargs
        Passed to the model constructor (``num_classes``, ``stages`` / ``blocks`` for reduced
        variants).

    Returns
    -------
    torch.nn.Module
        The model in eval mode, with ``requires_grad`` off.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    gen = torch.Generator().manual_seed(seed)
    model = MODELS[name](**kwargs)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                std = (2.0 / fan_in) ** 0.5
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
                if module.bias is not None:
                    module.bias.copy_((torch.rand(module.bias.shape, generator=gen) - 0.5) * 0.2)
            elif isinstance(module, nn.BatchNorm2d):
                module.weight.copy_(0.5 + 0.5 * torch.rand(module.weight.shape, generator=gen))
                module.bias.copy_(0.5 * torch.rand(module.bias.shape, generator=gen))
                module.momentum = 1.0  # the single statistics pass below sets the running stats
        model.train()
        # enough samples that even a 1x1 final feature map gives a meaningful variance
        batch = min(64, max(2, round(2 * (224 / size) ** 2)))
        model(torch.randn((batch, 3, size, size), generator=gen))
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.momentum = 0.1
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# ------------------------------------------------------------------------------------------
# The driver shared by the whole-network examples (resnet18.py, mobilenet_v1.py)
# ------------------------------------------------------------------------------------------
def _cosine(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def mac_placement(macs: dict, report) -> dict:
    """Attribute the MACs of every conv2d / matmul to VTA or the CPU, using a build report.

    Parameters
    ----------
    macs : dict
        ``vta_ext.quantize.op_macs`` of the module that was built: var name -> (op, MACs).
    report : vta_ext.BuildReport
        Its ``ext_vta`` build report. CPU placements of conv2d / matmul name their variable in
        ``detail``; every other conv2d / matmul of ``macs`` ran on VTA.

    Returns
    -------
    dict
        ``total``, ``vta`` and ``cpu`` MACs, ``cpu_ops`` (names), ``consistent`` (whether the
        number of VTA placements of these operators matches the operators not left on the CPU)
        and ``unknown`` (CPU placements naming a variable that is not in ``macs``).
    """
    ops = {op for op, _ in macs.values()}
    cpu_ops = [p.detail for p in report.on_cpu if p.op in ops and p.reason != "layout transform "
               "around a VTA operator"]
    unknown = [name for name in cpu_ops if name not in macs]
    cpu = sum(macs[name][1] for name in cpu_ops if name in macs)
    total = sum(m for _, m in macs.values())
    vta_count = sum(1 for p in report.on_vta if p.op in ops)
    return {"total": total, "cpu": cpu, "vta": total - cpu, "cpu_ops": cpu_ops,
            "unknown": unknown, "consistent": not unknown and vta_count == len(macs) - len(cpu_ops)}


@functools.lru_cache(maxsize=4)
def quantized_example(model_name: str, size: int, seed: int = 0, **kwargs):
    """The float model, its quantisation and two inputs, as the examples and tests use them.

    Parameters
    ----------
    model_name : str
        ``"resnet18"`` or ``"mobilenet_v1"``.
    size : int
        Input height and width.
    seed : int
        Seed of the weights and of both inputs.
    **kwargs
        Model constructor arguments (reduced variants).

    Returns
    -------
    tuple
        ``(model, qmodel, calibration, data)``: the float torch model, the
        :class:`vta_ext.quantize.QuantizedModel`, the calibration input and a second, independent
        input (both float32 NCHW). Cached per process, so do not modify the results.
    """
    import numpy as np

    from vta_ext.quantize import quantize_torch

    model = make_model(model_name, size=size, seed=seed, **kwargs)
    rng = np.random.default_rng(seed)
    calibration = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    data = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    return model, quantize_torch(model, calibration), calibration, data


def run_example(model_name: str, description: str, argv=None) -> int:
    """Quantise ``model_name``, build it for ``ext_vta`` and ``llvm``, compare, report.

    Returns the process exit status: 0 if every ``ext_vta`` build equals the llvm build bit for
    bit, 1 if one differs, 2 if a requested configuration preset does not exist.
    """
    import argparse
    import logging
    import time

    import numpy as np
    import tvm
    from tvm import relax

    import vta_ext
    from vta_ext.quantize import op_macs

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="default",
                        help="VTA configuration preset(s), comma separated (e.g. default,pipelined)")
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    parser.add_argument("--verbose", action="store_true", help="log every placement decision")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.size % 32:
        parser.error("--size must be a multiple of 32 (the networks downsample by 32)")
    configs = [c.strip() for c in args.config.split(",") if c.strip()]
    missing = [c for c in configs if c not in vta_ext.available_configs()]
    for c in missing:
        print(f"!! configuration preset {c!r} does not exist (available: "
              f"{', '.join(vta_ext.available_configs())}); skipping it")
    configs = [c for c in configs if c not in missing]

    print(f"== {model_name}, input 1x3x{args.size}x{args.size}, seed {args.seed}")
    start = time.perf_counter()
    model, qmodel, calibration, data = quantized_example(model_name, args.size, args.seed)
    print(f"quantised in {time.perf_counter() - start:.1f} s: {len(qmodel.nodes)} int8 tensors, "
          f"power-of-two scales (calibrated on one random input, evaluated on another)")

    macs = op_macs(qmodel.mod)
    total_macs = sum(m for _, m in macs.values())
    print(f"{len(macs)} conv2d/matmul operators, {total_macs / 1e6:,.1f} M MACs")

    # the CPU reference
    start = time.perf_counter()
    vm = relax.VirtualMachine(relax.build(qmodel.mod, target="llvm"), tvm.cpu())
    llvm_build = time.perf_counter() - start
    start = time.perf_counter()
    reference = vm["main"](tvm.runtime.tensor(data))[0].numpy()
    llvm_run = time.perf_counter() - start
    import torch

    with torch.no_grad():
        float_out = model(torch.from_numpy(data)).numpy()
        other = model(torch.from_numpy(calibration)).numpy()
    rel = np.linalg.norm(reference - float_out) / np.linalg.norm(float_out - other)
    print(f"\n== Quantisation accuracy (int8 on llvm vs the float torch model, test input)\n"
          f"  cosine similarity of the logits {_cosine(reference, float_out):.4f} "
          f"(float logits of two unrelated inputs: {_cosine(other, float_out):.4f}); error relative "
          f"to the input-dependent part |q(x)-f(x)|/|f(x)-f(x')| = {rel:.3f}; top-1 "
          f"{'agrees' if reference.argmax() == float_out.argmax() else 'DIFFERS'} "
          f"({int(reference.argmax())} vs {int(float_out.argmax())})")

    status = 2 if missing else 0
    wall = {"llvm": (llvm_build, llvm_run)}
    for config in configs:
        start = time.perf_counter()
        executable = relax.build(qmodel.mod, target=vta_ext.vta_target(config))
        build_s = time.perf_counter() - start
        report = vta_ext.last_build_report()
        vm = relax.VirtualMachine(executable, tvm.cpu())
        vta_ext.clear_run_log()
        start = time.perf_counter()
        out = vm["main"](tvm.runtime.tensor(data))[0].numpy()
        run_s = time.perf_counter() - start
        runs = vta_ext.run_log()
        wall[f"ext_vta/{config}"] = (build_s, run_s)

        print(f"\n== Build report (config {config!r})")
        print(report)
        placed = mac_placement(macs, report)
        print(f"\n== MACs on VTA: {placed['vta'] / 1e6:,.1f} M of {placed['total'] / 1e6:,.1f} M = "
              f"{100 * placed['vta'] / placed['total']:.1f} %  (CPU: {len(placed['cpu_ops'])} "
              f"operator(s), {placed['cpu'] / 1e6:,.1f} M MACs)")
        if not placed["consistent"]:
            print("!! the build report does not account for every conv2d/matmul one to one "
                  f"(unknown CPU entries: {placed['unknown']}); the VTA share above is an upper bound")
        cycles = sum(r.cycles.total_cycles for r in runs)
        by_op: dict = {}
        for r in runs:
            n, c = by_op.get(r.op, (0, 0))
            by_op[r.op] = (n + 1, c + r.cycles.total_cycles)
        sim_s = sum(r.seconds for r in runs)
        if runs:
            mhz = runs[0].cycles.config.CLOCK_MHZ
            print(f"\n== VTA cycles (cycle model, config {config!r}): {cycles:,} cycles = "
                  f"{cycles / (1e3 * mhz):.2f} ms at {mhz} MHz, {len(runs)} VTA calls")
            for op, (n, c) in sorted(by_op.items()):
                print(f"  {op:<18} {n:>3} calls {c:>14,} cycles")
        else:
            print("\n== VTA cycles: no VTA call ran")
        print(f"  functional simulation wall time {sim_s:.2f} s (of {run_s:.2f} s for the whole "
              f"ext_vta run)")
        equal = np.array_equal(out, reference)
        print(f"\n== Correctness ({config}): ext_vta output {out.shape} "
              f"{'EQUALS' if equal else 'DIFFERS FROM'} the llvm output bit for bit")
        if not equal:
            status = 1
    print("\n== Wall time (this machine)")
    for name, (build_s, run_s) in wall.items():
        print(f"  {name:<20} build {build_s:7.2f} s   run {run_s:8.2f} s")
    return status
