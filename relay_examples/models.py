"""ResNet-18 and MobileNet-1.0 (v1) as plain PyTorch modules, with deterministic random weights.

No torchvision and no downloads: the architectures are written out here, following He et al.
(2016, ImageNet ResNet-18, BasicBlock) and Howard et al. (2017, MobileNet v1, width multiplier 1.0,
3x3 depthwise + 1x1 pointwise blocks, each followed by BatchNorm and ReLU).

Weights are random but reproducible (:func:`make_model`):

* convolutions and the classifier use He (Kaiming) normal initialisation from a seeded generator;
* BatchNorm affine parameters are random (gamma in [0.5, 1.5], beta in [-0.2, 0.2]);
* BatchNorm running statistics are *estimated* by one training-mode forward pass (momentum 1) on a
  fixed random batch of the requested input size, so every channel has its own non-trivial mean and
  variance and activations keep a sane range through the depth of the network, as in a trained one.

The models are returned in eval mode. Both end in a global average pool, so any input size that
survives the strides (32 for both networks) works; the reference size is 224x224.
"""
from __future__ import annotations

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
                module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=gen))
                module.bias.copy_((torch.rand(module.bias.shape, generator=gen) - 0.5) * 0.4)
                module.momentum = 1.0  # the single statistics pass below sets the running stats
        model.train()
        model(torch.randn((2, 3, size, size), generator=gen))
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.momentum = 0.1
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
