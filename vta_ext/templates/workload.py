"""The workloads of the GEMM templates (conv2d, group conv2d, dense) and the convolution geometry.

A workload is a frozen dataclass in NCHW terms, already padded by the caller (batch a multiple of
``BATCH``, channels multiples of ``BLOCK_IN`` / ``BLOCK_OUT``). This module is the one home of

* :func:`out_size` -- the output size of a convolution or pooling window along one axis;
* :func:`window_size` -- the input rows (or columns) one tile of output rows reads;
* :class:`ConvGeometry` -- the output size of a convolution workload (also the depthwise one);
* :class:`Conv2dWorkload`, :class:`GroupConv2dWorkload`, :class:`DenseWorkload` and
  :func:`dense_as_conv2d` (a dense layer is the 1x1 conv2d with the same packed layouts);
* :func:`check_conv2d_workload` / :func:`check_dense_workload`: the refusals
  (:class:`~vta_ext.templates.errors.Conv2dRefusal`) of workloads the GEMM templates do not
  implement.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import VTAConfig
from ..layout import MAX_DMA_PAD
from .errors import Conv2dRefusal

__all__ = ["out_size", "window_size", "ConvGeometry", "Conv2dWorkload", "GroupConv2dWorkload", "DenseWorkload",
           "groups_of", "dense_as_conv2d", "check_conv2d_workload", "check_dense_workload"]


def out_size(size: int, window: int, pad: int, stride: int) -> int:
    """Outputs along one axis of a sliding window: ``(size + 2 * pad - window) // stride + 1``.

    Parameters
    ----------
    size : int
        Input size along the axis (unpadded).
    window : int
        Kernel (or pooling window) size along the axis.
    pad : int
        Padding on each side.
    stride : int
        Window stride.
    """
    return (size + 2 * pad - window) // stride + 1


def window_size(tile: int, window: int, stride: int) -> int:
    """Input rows (or columns, padding included) that ``tile`` consecutive outputs read:
    ``(tile - 1) * stride + window``."""
    return (tile - 1) * stride + window


class ConvGeometry:
    """The output size of a workload with fields ``height, width, kernel_h, kernel_w, pad_h, pad_w,
    stride_h, stride_w`` (a mixin of the convolution workloads)."""

    @property
    def out_height(self) -> int:
        """Output rows (:func:`out_size`)."""
        return out_size(self.height, self.kernel_h, self.pad_h, self.stride_h)

    @property
    def out_width(self) -> int:
        """Output columns (:func:`out_size`)."""
        return out_size(self.width, self.kernel_w, self.pad_w, self.stride_w)


@dataclass(frozen=True)
class Conv2dWorkload(ConvGeometry):
    """A conv2d in NCHW terms. Channels must be multiples of BLOCK_IN / BLOCK_OUT and the batch a
    multiple of BATCH (the caller pads)."""

    batch: int
    height: int
    width: int
    in_channels: int
    out_channels: int
    kernel_h: int
    kernel_w: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int


@dataclass(frozen=True)
class GroupConv2dWorkload(Conv2dWorkload):
    """A grouped conv2d in NCHW terms (``1 < groups < in_channels``; channels per group multiples
    of ``BLOCK_IN`` / ``BLOCK_OUT``)."""

    groups: int = 1


@dataclass(frozen=True)
class DenseWorkload:
    """``out (batch, out_features) = data (batch, in_features) @ weight (out_features,
    in_features).T``; batch a multiple of ``BATCH``, features multiples of the blocks."""

    batch: int
    in_features: int
    out_features: int


def groups_of(wl: Conv2dWorkload) -> int:
    """Channel groups of a conv2d workload (1 unless it is a :class:`GroupConv2dWorkload`)."""
    return int(getattr(wl, "groups", 1))


def dense_as_conv2d(wl: DenseWorkload) -> Conv2dWorkload:
    """The 1x1-image, 1x1-kernel conv2d with the same packed memory layouts as ``wl``."""
    return Conv2dWorkload(wl.batch, 1, 1, wl.in_features, wl.out_features, 1, 1, 0, 0, 1, 1)


def check_conv2d_workload(cfg: VTAConfig, wl: Conv2dWorkload) -> None:
    """Refuse a conv2d (or group conv2d) the templates do not implement.

    Raises
    ------
    Conv2dRefusal
        Naming the field and what the caller must change (pad the channels, ...).
    """
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    for name in ("batch", "height", "width", "in_channels", "out_channels", "kernel_h", "kernel_w",
                 "stride_h", "stride_w"):
        if getattr(wl, name) < 1:
            raise Conv2dRefusal(f"{name}={getattr(wl, name)} must be >= 1")
    if wl.in_channels % BI:
        raise Conv2dRefusal(f"in_channels={wl.in_channels} is not a multiple of BLOCK_IN={BI}; pad "
                            "the input channels (and the kernel) to a multiple of the block")
    if wl.out_channels % BO:
        raise Conv2dRefusal(f"out_channels={wl.out_channels} is not a multiple of BLOCK_OUT={BO}; "
                            "pad the output channels (kernel and bias) to a multiple of the block")
    if wl.batch % B:
        raise Conv2dRefusal(f"batch={wl.batch} is not a multiple of BATCH={B}; pad the batch")
    if wl.pad_h < 0 or wl.pad_w < 0:
        raise Conv2dRefusal(f"padding {wl.pad_h}x{wl.pad_w} must be >= 0")
    if wl.pad_h > MAX_DMA_PAD or wl.pad_w > MAX_DMA_PAD:
        raise Conv2dRefusal(f"padding {wl.pad_h}x{wl.pad_w} exceeds the 4-bit DMA pad fields "
                            f"(max {MAX_DMA_PAD})")
    if wl.out_height < 1 or wl.out_width < 1:
        raise Conv2dRefusal(f"empty output ({wl.out_height}x{wl.out_width})")
    g = groups_of(wl)
    if g != 1:
        if g < 1 or wl.in_channels % g or wl.out_channels % g:
            raise Conv2dRefusal(f"groups={g} must be >= 1 and divide in_channels={wl.in_channels} "
                                f"and out_channels={wl.out_channels}")
        if (wl.in_channels // g) % BI or (wl.out_channels // g) % BO:
            raise Conv2dRefusal(f"groups={g}: the channels per group ({wl.in_channels // g} in, "
                                f"{wl.out_channels // g} out) must be multiples of BLOCK_IN={BI} / "
                                f"BLOCK_OUT={BO}; use depthwise_conv2d for one channel per group")


def check_dense_workload(cfg: VTAConfig, wl: DenseWorkload) -> None:
    """Refuse a dense layer the template does not implement (:class:`Conv2dRefusal`)."""
    for name in ("batch", "in_features", "out_features"):
        if getattr(wl, name) < 1:
            raise Conv2dRefusal(f"{name}={getattr(wl, name)} must be >= 1")
    if wl.batch % cfg.BATCH:
        raise Conv2dRefusal(f"batch={wl.batch} is not a multiple of BATCH={cfg.BATCH}; pad the batch")
    if wl.in_features % cfg.BLOCK_IN:
        raise Conv2dRefusal(f"in_features={wl.in_features} is not a multiple of BLOCK_IN="
                            f"{cfg.BLOCK_IN}; pad the features (and the weight)")
    if wl.out_features % cfg.BLOCK_OUT:
        raise Conv2dRefusal(f"out_features={wl.out_features} is not a multiple of BLOCK_OUT="
                            f"{cfg.BLOCK_OUT}; pad the output features (weight and bias)")
