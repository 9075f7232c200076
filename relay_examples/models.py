"""Standard CNNs as plain PyTorch modules, with deterministic random weights.

No torchvision and no downloads: the architectures are written out here, following He et al.
(2016, ImageNet ResNet-18, BasicBlock) and Howard et al. (2017, MobileNet v1, width multiplier 1.0,
3x3 depthwise + 1x1 pointwise blocks, each followed by BatchNorm and ReLU), and, with torchvision's
module names, the 15 networks of issue 11 (:data:`ISSUE11_MODELS`: ResNet-50, MobileNetV2/V3-small,
SqueezeNet 1.1, ShuffleNetV2 x0.5, MNASNet 0.5, EfficientNet-B0, RegNetX 400MF/1.6GF, ResNeXt-50
32x4d, GoogLeNet, VGG11, DenseNet-121, AlexNet). :data:`SMALL` gives a small input size for each
(32x32 where the architecture allows) for fast runs.

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
from collections import OrderedDict
from typing import List, Tuple

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNet18", "MobileNetV1", "make_model", "MODELS", "ISSUE11_MODELS", "SMALL",
           "mac_placement", "quantized_example"]


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


# ------------------------------------------------------------------------------------------
# The torchvision architectures of issue 11, written out (torchvision does not import with the
# pinned CPU torch). Module names follow torchvision's, so layer paths in messages match.
# ------------------------------------------------------------------------------------------
def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvNormAct(nn.Sequential):
    """conv (no bias) -> BatchNorm -> activation (torchvision's ``Conv2dNormActivation``)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 act=nn.ReLU, eps: float = 1e-5) -> None:
        layers: List[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2,
                                             groups=groups, bias=False),
                                   nn.BatchNorm2d(cout, eps=eps)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class InvertedResidualV2(nn.Module):
    """MobileNetV2 block: [1x1 expand ReLU6] -> 3x3 depthwise ReLU6 -> 1x1 project [+ x]."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers: List[nn.Module] = []
        if expand != 1:
            layers.append(ConvNormAct(cin, hidden, 1, act=nn.ReLU6))
        layers += [ConvNormAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al., 2018), width 1.0: 17 inverted residual blocks, ReLU6."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: List[nn.Module] = [ConvNormAct(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidualV2(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(ConvNormAct(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class SqueezeExcitation(nn.Module):
    """x * gate(fc2(act(fc1(avgpool(x))))) (torchvision's ``SqueezeExcitation``)."""

    def __init__(self, channels: int, squeeze: int, act=nn.ReLU, gate=nn.Hardsigmoid) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = act()
        self.scale_activation = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return s * x


class InvertedResidualV3(nn.Module):
    """MobileNetV3 block: [1x1 expand] -> kxk depthwise -> [SE] -> 1x1 project [+ x]."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act,
                 stride: int) -> None:
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        layers: List[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormAct(cin, expanded, 1, act=act, eps=0.001))
        layers.append(ConvNormAct(expanded, expanded, kernel, stride, groups=expanded, act=act,
                                  eps=0.001))
        if se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4, 8)))
        layers.append(ConvNormAct(expanded, cout, 1, act=None, eps=0.001))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetV3Small(nn.Module):
    """MobileNetV3-small (Howard et al., 2019): Hardswish, squeeze-excitation with hard sigmoid."""

    RE, HS = nn.ReLU, nn.Hardswish
    SETTINGS = ((3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
                (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
                (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
                (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1))

    def __init__(self, num_classes: int = 1000, settings: Tuple[tuple, ...] = SETTINGS) -> None:
        super().__init__()
        layers: List[nn.Module] = [ConvNormAct(3, 16, 3, 2, act=nn.Hardswish, eps=0.001)]
        cin = 16
        for k, exp, cout, se, act, s in settings:
            layers.append(InvertedResidualV3(cin, k, exp, cout, se, act, s))
            cin = cout
        layers.append(ConvNormAct(cin, 576, 1, act=nn.Hardswish, eps=0.001))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class Fire(nn.Module):
    """SqueezeNet fire module: 1x1 squeeze, then concat(1x1 expand, 3x3 expand)."""

    def __init__(self, cin: int, squeeze: int, e1: int, e3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = nn.ReLU()
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU()
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    """SqueezeNet 1.1 (Iandola et al., 2016): fire modules, ceil-mode max pools, conv classifier."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(), pool(), Fire(64, 16, 64, 64),
            Fire(128, 16, 64, 64), pool(), Fire(128, 32, 128, 128), Fire(256, 32, 128, 128),
            pool(), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256),
            Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle: reshape to (N, g, C/g, H, W), swap, flatten back."""
    n, c, h, w = x.size()
    x = x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: split (stride 1) or two branches (stride 2), concat, channel shuffle."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        bf = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                nn.Conv2d(cin, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU())
        self.branch2 = nn.Sequential(
            nn.Conv2d(cin if stride > 1 else bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(),
            nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False), nn.BatchNorm2d(bf),
            nn.Conv2d(bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 (Ma et al., 2018), x0.5: stages of 4, 8, 4 units; 24-48-96-192-1024 channels."""

    def __init__(self, num_classes: int = 1000, repeats: Tuple[int, ...] = (4, 8, 4),
                 channels: Tuple[int, ...] = (24, 48, 96, 192, 1024)) -> None:
        super().__init__()
        self.conv1 = ConvNormAct(3, channels[0], 3, 2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = channels[0]
        for i, (n, cout) in enumerate(zip(repeats, channels[1:])):
            units = [ShuffleUnit(cin, cout, 2)] + [ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]
            setattr(self, f"stage{i + 2}", nn.Sequential(*units))
            cin = cout
        self.conv5 = ConvNormAct(cin, channels[-1], 1)
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        return self.fc(self.conv5(x).mean([2, 3]))


class MnasBlock(nn.Module):
    """MNASNet inverted residual: 1x1 expand -> kxk depthwise -> 1x1 project [+ x]."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.apply_residual = cin == cout and stride == 1
        self.layers = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
            nn.BatchNorm2d(mid), nn.ReLU(), nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x) + x if self.apply_residual else self.layers(x)


class MNASNet(nn.Module):
    """MNASNet (Tan et al., 2019) with depth multiplier ``alpha`` (0.5: MNASNet0.5)."""

    def __init__(self, num_classes: int = 1000, alpha: float = 0.5) -> None:
        super().__init__()
        d = [_make_divisible(c * alpha, 8) for c in (32, 16, 24, 40, 80, 96, 192, 320)]
        layers: List[nn.Module] = [
            nn.Conv2d(3, d[0], 3, 2, 1, bias=False), nn.BatchNorm2d(d[0]), nn.ReLU(),
            nn.Conv2d(d[0], d[0], 3, 1, 1, groups=d[0], bias=False), nn.BatchNorm2d(d[0]),
            nn.ReLU(), nn.Conv2d(d[0], d[1], 1, bias=False), nn.BatchNorm2d(d[1])]
        stacks = ((3, 2, 3, 3), (5, 2, 3, 3), (5, 2, 6, 3), (3, 1, 6, 2), (5, 2, 6, 4), (3, 1, 6, 1))
        for i, (k, s, e, n) in enumerate(stacks):
            layers.append(nn.Sequential(*[MnasBlock(d[i + 1] if j == 0 else d[i + 2], d[i + 2], k,
                                                    s if j == 0 else 1, e) for j in range(n)]))
        layers += [nn.Conv2d(d[7], 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU()]
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.layers(x).mean([2, 3]))


class MBConv(nn.Module):
    """EfficientNet block: [1x1 expand SiLU] -> kxk depthwise SiLU -> SE (SiLU, sigmoid) ->
    1x1 project [+ x]."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        mid = cin * expand
        layers: List[nn.Module] = []
        if mid != cin:
            layers.append(ConvNormAct(cin, mid, 1, act=nn.SiLU, eps=1e-3))
        layers += [ConvNormAct(mid, mid, kernel, stride, groups=mid, act=nn.SiLU, eps=1e-3),
                   SqueezeExcitation(mid, max(1, cin // 4), act=nn.SiLU, gate=nn.Sigmoid),
                   ConvNormAct(mid, cout, 1, act=None, eps=1e-3)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class EfficientNetB0(nn.Module):
    """EfficientNet-B0 (Tan & Le, 2019): MBConv stages, SiLU, squeeze-excitation."""

    STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
              (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: List[nn.Module] = [ConvNormAct(3, 32, 3, 2, act=nn.SiLU, eps=1e-3)]
        for e, k, s, cin, cout, n in self.STAGES:
            layers.append(nn.Sequential(*[MBConv(cin if i == 0 else cout, cout, k,
                                                 s if i == 0 else 1, e) for i in range(n)]))
        layers.append(ConvNormAct(320, 1280, 1, act=nn.SiLU, eps=1e-3))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class RegNetBlock(nn.Module):
    """RegNet X block: 1x1 -> 3x3 group conv (group width g) -> 1x1, projected shortcut, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, group_width: int) -> None:
        super().__init__()
        self.proj = ConvNormAct(cin, cout, 1, stride, act=None) \
            if cin != cout or stride != 1 else None
        self.f = nn.Sequential(ConvNormAct(cin, cout, 1), ConvNormAct(
            cout, cout, 3, stride, groups=cout // group_width), ConvNormAct(cout, cout, 1, act=None))
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.proj is None else self.proj(x)
        return self.activation(shortcut + self.f(x))


class RegNetX(nn.Module):
    """RegNetX (Radosavovic et al., 2020): 32-channel stem, 4 stages of X blocks, pool, FC.
    ``regnet_x_400mf``: depths (1, 2, 7, 12), widths (32, 64, 160, 384), group width 16;
    ``regnet_x_1_6gf``: depths (2, 4, 10, 2), widths (72, 168, 408, 912), group width 24."""

    def __init__(self, depths: Tuple[int, ...], widths: Tuple[int, ...], group_width: int,
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = ConvNormAct(3, 32, 3, 2)
        cin, stages = 32, []
        for depth, width in zip(depths, widths):
            stages.append(nn.Sequential(*[RegNetBlock(cin if i == 0 else width, width,
                                                      2 if i == 0 else 1, group_width)
                                          for i in range(depth)]))
            cin = width
        self.trunk_output = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.trunk_output(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride, groups) -> 1x1 (x4), projected shortcut."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, groups: int = 1,
                 base_width: int = 64) -> None:
        super().__init__()
        width = int(planes * base_width / 64) * groups
        cout = planes * self.expansion
        self.conv1, self.bn1 = _conv_bn(cin, width, 1, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride, groups=groups)
        self.conv3, self.bn3 = _conv_bn(width, cout, 1, 1)
        self.relu = nn.ReLU()
        self.downsample = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) \
            if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + identity)


class ResNetBottleneck(nn.Module):
    """ResNet-50 (``groups=1, base_width=64``) and ResNeXt-50 32x4d (``groups=32, base_width=4``)."""

    def __init__(self, layers: Tuple[int, ...] = (3, 4, 6, 3), groups: int = 1,
                 base_width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 64, 7, 2)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = 64, []
        for i, n in enumerate(layers):
            planes = 64 << i
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(cin, planes, 2 if (j == 0 and i > 0) else 1, groups,
                                         base_width))
                cin = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Inception(nn.Module):
    """GoogLeNet inception module: concat of 1x1, 1x1->3x3, 1x1->3x3, maxpool->1x1 branches."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool: int) -> None:
        super().__init__()
        conv = lambda a, b, k: ConvNormAct(a, b, k, eps=0.001)  # noqa: E731
        self.branch1 = conv(cin, c1, 1)
        self.branch2 = nn.Sequential(conv(cin, c3r, 1), conv(c3r, c3, 3))
        self.branch3 = nn.Sequential(conv(cin, c5r, 1), conv(c5r, c5, 3))  # 3x3, as torchvision
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv(cin, pool, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    """GoogLeNet (Szegedy et al., 2015) as torchvision defines it (BatchNorm, no aux heads)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        pool = lambda k=3: nn.MaxPool2d(k, 2, ceil_mode=True)  # noqa: E731
        self.conv1 = ConvNormAct(3, 64, 7, 2, eps=0.001)
        self.maxpool1 = pool()
        self.conv2 = ConvNormAct(64, 64, 1, eps=0.001)
        self.conv3 = ConvNormAct(64, 192, 3, eps=0.001)
        self.maxpool2 = pool()
        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = pool()
        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = pool(2)
        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        for name in ("4a", "4b", "4c", "4d", "4e"):
            x = getattr(self, f"inception{name}")(x)
        x = self.inception5b(self.inception5a(self.maxpool4(x)))
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


class VGG(nn.Module):
    """VGG (Simonyan & Zisserman, 2014), configuration A = VGG11, without BatchNorm.
    ``pool_out`` is the adaptive pool's output (7 at 224x224); ``hidden`` the classifier width."""

    CFG_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")

    def __init__(self, num_classes: int = 1000, pool_out: int = 7, hidden: int = 4096) -> None:
        super().__init__()
        layers: List[nn.Module] = []
        cin = 3
        for v in self.CFG_A:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU()]
                cin = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(pool_out)
        self.classifier = nn.Sequential(
            nn.Linear(512 * pool_out * pool_out, hidden), nn.ReLU(), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class DenseLayer(nn.Module):
    """DenseNet layer: concat of all previous features -> BN-ReLU-1x1 -> BN-ReLU-3x3 (growth)."""

    def __init__(self, cin: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU()
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: List[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    """``n`` dense layers, each fed the concat of the block input and all earlier outputs."""

    def __init__(self, n: int, cin: int, growth: int, bn_size: int) -> None:
        super().__init__({f"denselayer{i + 1}": DenseLayer(cin + i * growth, growth, bn_size)
                          for i in range(n)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    """DenseNet-121 (Huang et al., 2017): growth 32, blocks (6, 12, 24, 16), pre-activation
    BatchNorm-ReLU (not foldable into the preceding conv: it follows a concat)."""

    def __init__(self, num_classes: int = 1000, blocks: Tuple[int, ...] = (6, 12, 24, 16),
                 growth: int = 32, init_features: int = 64, bn_size: int = 4) -> None:
        super().__init__()
        layers = [("conv0", nn.Conv2d(3, init_features, 7, 2, 3, bias=False)),
                  ("norm0", nn.BatchNorm2d(init_features)), ("relu0", nn.ReLU()),
                  ("pool0", nn.MaxPool2d(3, 2, 1))]
        c = init_features
        for i, n in enumerate(blocks):
            layers.append((f"denseblock{i + 1}", DenseBlock(n, c, growth, bn_size)))
            c += n * growth
            if i != len(blocks) - 1:
                layers.append((f"transition{i + 1}", nn.Sequential(
                    nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                    nn.AvgPool2d(2, 2))))
                c //= 2
        layers.append(("norm5", nn.BatchNorm2d(c)))
        self.features = nn.Sequential(OrderedDict(layers))
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu(self.features(x))
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


class AlexNet(nn.Module):
    """AlexNet (Krizhevsky et al., 2012) as torchvision defines it. ``pool_out`` is the adaptive
    pool's output (6 at 224x224); ``hidden`` the classifier width."""

    def __init__(self, num_classes: int = 1000, pool_out: int = 6, hidden: int = 4096) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(), nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(), nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(pool_out)
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(256 * pool_out * pool_out, hidden), nn.ReLU(), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


MODELS = {
    "resnet18": ResNet18,
    "mobilenet_v1": MobileNetV1,
    "resnet50": ResNetBottleneck,
    "mobilenet_v2": MobileNetV2,
    "mobilenet_v3_small": MobileNetV3Small,
    "squeezenet1_1": SqueezeNet11,
    "shufflenet_v2_x0_5": ShuffleNetV2,
    "mnasnet0_5": MNASNet,
    "efficientnet_b0": EfficientNetB0,
    "regnet_x_400mf": functools.partial(RegNetX, (1, 2, 7, 12), (32, 64, 160, 384), 16),
    "regnet_x_1_6gf": functools.partial(RegNetX, (2, 4, 10, 2), (72, 168, 408, 912), 24),
    "resnext50_32x4d": functools.partial(ResNetBottleneck, groups=32, base_width=4),
    "googlenet": GoogLeNet,
    "vgg11": VGG,
    "densenet121": DenseNet,
    "alexnet": AlexNet,
}

#: the 15 networks of issue 11, in its order
ISSUE11_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "squeezenet1_1",
                  "shufflenet_v2_x0_5", "mnasnet0_5", "efficientnet_b0", "regnet_x_400mf",
                  "regnet_x_1_6gf", "resnext50_32x4d", "googlenet", "vgg11", "densenet121",
                  "alexnet")

#: small variants for fast runs: (input size, constructor arguments). Every network keeps its full
#: depth and widths; only the classifier of VGG/AlexNet shrinks, with the adaptive pool output
#: chosen so that it divides the smaller feature map.
SMALL = {name: (32, {}) for name in ISSUE11_MODELS}
SMALL.update(vgg11=(64, dict(pool_out=1, hidden=256)), alexnet=(96, dict(pool_out=1, hidden=256)))


def make_model(name: str, size: int = 224, seed: int = 0, **kwargs) -> nn.Module:
    """Build model ``name`` with deterministic random weights, BN statistics estimated at ``size``.

    Parameters
    ----------
    name : str
        A key of :data:`MODELS` (``"resnet18"``, ``"mobilenet_v2"``, ...).
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


def pt2e_quantized(name: str, size: int, per_channel: bool = True, seed: int = 0,
                   calibration: int = 2):
    """Model ``name`` quantised by PyTorch's own PT2E flow and mapped to int8 Relax.

    ``torch.export`` -> ``torchao``'s ``prepare_pt2e`` with
    :func:`vta_ext.quantize.symmetric_quantizer` (symmetric int8 activations, per-channel or
    per-tensor weights) -> calibration on ``calibration`` random inputs -> ``convert_pt2e`` ->
    :func:`vta_ext.quantize.quantize_pt2e` (the graph's own scales, fixed-point requantisation).

    Returns
    -------
    tuple
        ``(qmodel, data)``: the :class:`vta_ext.quantize.QuantizedModel` and an independent
        float32 input.
    """
    import numpy as np
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from vta_ext.quantize import quantize_pt2e, symmetric_quantizer

    model = make_model(name, size=size, seed=seed)
    rng = np.random.default_rng(seed)
    cal = [rng.standard_normal((1, 3, size, size)).astype(np.float32) for _ in range(calibration)]
    exported = torch.export.export(model, (torch.from_numpy(cal[0]),))
    prepared = prepare_pt2e(exported.module(), symmetric_quantizer(per_channel=per_channel))
    with torch.no_grad():
        for c in cal:
            prepared(torch.from_numpy(c))
    qm = quantize_pt2e(convert_pt2e(prepared), cal)
    return qm, rng.standard_normal((1, 3, size, size)).astype(np.float32)


def run_example(model_name: str, description: str, argv=None) -> int:
    """Quantise ``model_name``, build it for ``ext_vta`` (per configuration, once per strategy:
    ``stock`` and ``csp-relaxed`` by default) and ``llvm``, compare, report; the total cycles of
    the strategies are printed side by side.

    Returns the process exit status: 0 if every ``ext_vta`` build equals the llvm build bit for
    bit, 1 if one differs, 2 if a requested configuration preset or strategy does not exist.
    """
    import argparse
    import logging
    import time

    import numpy as np
    import tvm
    from tvm import relax

    import tvm_csp_embed  # noqa: F401  (registers csp-strict / csp-relaxed)
    import vta_ext
    from vta_ext.quantize import op_macs
    from vta_ext.strategy import registered_strategies

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="default",
                        help="VTA configuration preset(s), comma separated (e.g. default,pipelined)")
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    parser.add_argument("--strategies", default="stock,csp-relaxed",
                        help="strategies to build with, comma separated (default: stock,csp-relaxed)")
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
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in registered_strategies()]
    for s in unknown:
        print(f"!! strategy {s!r} is not registered (registered: "
              f"{', '.join(registered_strategies())}); skipping it")
    strategies = [s for s in strategies if s not in unknown]

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

    status = 2 if missing or unknown else 0
    wall = {"llvm": (llvm_build, llvm_run)}
    totals = []
    for config, strategy in ((c, s) for c in configs for s in strategies):
        start = time.perf_counter()
        with vta_ext.build_options(strategy=strategy):
            executable = relax.build(qmodel.mod, target=vta_ext.vta_target(config))
        build_s = time.perf_counter() - start
        report = vta_ext.last_build_report()
        vm = relax.VirtualMachine(executable, tvm.cpu())
        vta_ext.clear_run_log()
        start = time.perf_counter()
        out = vm["main"](tvm.runtime.tensor(data))[0].numpy()
        run_s = time.perf_counter() - start
        runs = vta_ext.run_log()
        wall[f"ext_vta/{config}/{strategy}"] = (build_s, run_s)

        print(f"\n== Build report (config {config!r}, strategy {strategy!r})")
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
            print(f"\n== VTA cycles (cycle model, config {config!r}, strategy {strategy!r}): "
                  f"{cycles:,} cycles = "
                  f"{cycles / (1e3 * mhz):.2f} ms at {mhz} MHz, {len(runs)} VTA calls; "
                  f"{report.floor_text()} (vta_ext.floor)")
            for op, (n, c) in sorted(by_op.items()):
                print(f"  {op:<18} {n:>3} calls {c:>14,} cycles")
        else:
            print("\n== VTA cycles: no VTA call ran")
        print(f"  functional simulation wall time {sim_s:.2f} s (of {run_s:.2f} s for the whole "
              f"ext_vta run)")
        equal = np.array_equal(out, reference)
        print(f"\n== Correctness ({config}, {strategy}): ext_vta output {out.shape} "
              f"{'EQUALS' if equal else 'DIFFERS FROM'} the llvm output bit for bit")
        if not equal:
            status = 1
        totals.append((config, strategy, len(runs), cycles, equal))
    print("\n== Total VTA cycles per configuration and strategy (cycle model, one inference)")
    print("  | config | strategy | VTA calls | total cycles | vs stock | equal to llvm |")
    print("  |---|---|---|---|---|---|")
    stock = {c: cyc for c, s, _, cyc, _ in totals if s == "stock"}
    for config, strategy, calls, cycles, equal in totals:
        ratio = f"x{stock[config] / cycles:.2f}" if stock.get(config) and cycles else "-"
        print(f"  | {config} | {strategy} | {calls} | {cycles:,} | {ratio} | "
              f"{'yes' if equal else 'NO'} |")
    print("\n== Wall time (this machine)")
    for name, (build_s, run_s) in wall.items():
        print(f"  {name:<28} build {build_s:7.2f} s   run {run_s:8.2f} s")
    return status
