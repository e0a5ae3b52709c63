"""The backend-neutral half of the depthwise ops: argument checks, output sizes and
padding, gathered into one static ``Conv`` that every implementation reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from jaxgrad import _checks

PADDINGS = ("SAME", "VALID", "EXPLICIT")
DATA_FORMATS = ("NHWC", "NCHW")


@dataclasses.dataclass(frozen=True)
class Conv:
    """Everything static about one convolution: shapes, layout, strides, padding."""

    nchw: bool
    batch: int
    channels: int  # C
    multiplier: int  # M
    in_size: tuple[int, int]  # (H, W)
    kernel: tuple[int, int]  # (fh, fw)
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[tuple[int, int], tuple[int, int]]  # (before, after) for H and W
    out_size: tuple[int, int]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._shape(self.in_size, self.channels)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self._shape(self.out_size, self.channels * self.multiplier)

    @property
    def filter_shape(self) -> tuple[int, int, int, int]:
        return (*self.kernel, self.channels, self.multiplier)

    def shape_of(self, role: str) -> tuple[int, ...]:
        """The shape of the input ``"x"``, the output ``"y"`` or the filter ``"f"``."""
        shapes = {"x": self.input_shape, "y": self.output_shape, "f": self.filter_shape}
        return shapes[role]

    @property
    def computes_nothing(self) -> bool:
        """Whether some length is 0 (images, channels, the multiplier, the input's
        or the output's rows or columns): then each op's result is zeros, sums of
        no terms where it is not empty itself."""
        sizes = (self.batch, self.channels, self.multiplier, *self.in_size, *self.out_size)
        return 0 in sizes

    def _shape(self, spatial: tuple[int, int], channels: int) -> tuple[int, ...]:
        if self.nchw:
            return (self.batch, channels, *spatial)
        return (self.batch, *spatial, channels)


def configure(
    op: str,
    input_shape: Sequence[int],
    filter_shape: Sequence[int],
    strides: Any,
    padding: Any,
    data_format: Any,
    dilations: Any,
    explicit_paddings: Any,
    *,
    filter_name: str = "filter",
) -> Conv:
    """Validates the arguments and computes output sizes and padding.

    ``filter_name`` is what the op calls the filter's shape in its messages.
    """
    padding = _checks.choice(op, "padding", padding, PADDINGS)
    data_format = _checks.choice(op, "data_format", data_format, DATA_FORMATS)
    nchw = data_format == "NCHW"
    stride_hw = _spatial_pair(op, "strides", strides, nchw)
    dilation_hw = _spatial_pair(op, "dilations", dilations, nchw)
    explicit = _explicit_pads(op, padding, explicit_paddings, nchw)
    n, c = input_shape[0], input_shape[1 if nchw else 3]
    in_hw = tuple(input_shape[2:]) if nchw else tuple(input_shape[1:3])
    fh, fw, fc, m = filter_shape
    layout = "[filter_height, filter_width, in_channels, channel_multiplier]"
    if min(fh, fw) < 1 or m < 1:
        raise ValueError(
            f"{op}: {filter_name} must have a positive height, width and channel_multiplier "
            f"(laid out {layout}), got shape {tuple(filter_shape)}"
        )
    if c != fc:
        raise ValueError(
            f"{op}: input channels ({c}) must equal the filter's in_channels ({fc}); "
            f"input shape {tuple(input_shape)}, filter shape {tuple(filter_shape)}"
            + _channels_hint(input_shape, filter_shape, nchw)
        )
    pads, outs = [], []
    for axis, size, k, s, d, ex in zip(
        ("height", "width"), in_hw, (fh, fw), stride_hw, dilation_hw, explicit, strict=True
    ):
        effective = (k - 1) * d + 1
        if padding == "VALID":
            before, after = 0, 0
            out = (size - effective + s) // s
        elif padding == "SAME":
            out = -(-size // s)
            need = max(0, (out - 1) * s + effective - size)
            before, after = need // 2, need - need // 2
        else:
            before, after = ex
            out = (size + before + after - effective + s) // s
        if out < 0:
            raise ValueError(
                f"{op}: the computed output {axis} must not be negative, got {out} (input "
                f"{axis} {size}, filter {k}, dilation {d}, stride {s}, padding {before}+{after})"
            )
        pads.append((before, after))
        outs.append(out)
    return Conv(
        nchw=nchw,
        batch=n,
        channels=c,
        multiplier=m,
        in_size=(in_hw[0], in_hw[1]),
        kernel=(fh, fw),
        strides=stride_hw,
        dilations=dilation_hw,
        pads=(pads[0], pads[1]),
        out_size=(outs[0], outs[1]),
    )


def _channels_hint(input_shape: Sequence[int], filter_shape: Sequence[int], nchw: bool) -> str:
    """What a channel mismatch most likely means, where the shapes say so."""
    c = input_shape[1 if nchw else 3]
    other_c = input_shape[3 if nchw else 1]
    fh, fw, fc, _ = filter_shape
    if other_c == fc:
        this, other = ("NCHW", "NHWC") if nchw else ("NHWC", "NCHW")
        return (
            f". The input matches the filter if it is {other}, not {this}: "
            f"pass data_format={other!r}"
        )
    if fw == 1 and fh % c == 0:
        return (
            ". The filter looks like PyTorch's [out_channels, 1, kh, kw]; jaxgrad takes "
            "[filter_height, filter_width, in_channels, channel_multiplier]: "
            "w.reshape(C, M, kh, kw).transpose(2, 3, 0, 1)"
        )
    return ""


def _spatial_pair(op: str, name: str, value: Any, nchw: bool) -> tuple[int, int]:
    """(height, width) from TensorFlow's 4-int form or a 2-int form; all >= 1."""
    values = _checks.int_tuple(op, name, value)
    if len(values) == 4:
        h, w = (2, 3) if nchw else (1, 2)
        others = (values[0], values[1 if nchw else 3])
        if others != (1, 1):
            raise ValueError(
                f"{op}: {name} must be 1 on the batch and channel dimensions, got {values}"
            )
        values = (values[h], values[w])
    elif len(values) != 2:
        raise ValueError(
            f"{op}: {name} must have 4 entries (data_format order) or 2 (height, width), "
            f"got {len(values)}"
        )
    if min(values) < 1:
        raise ValueError(f"{op}: {name} must be >= 1, got {values}")
    return values[0], values[1]


def _explicit_pads(
    op: str, padding: str, value: Any, nchw: bool
) -> tuple[tuple[int, int], tuple[int, int]]:
    values = _checks.int_tuple(op, "explicit_paddings", value)
    if padding != "EXPLICIT":
        if values:
            raise ValueError(
                f"{op}: explicit_paddings must be empty unless padding is 'EXPLICIT', "
                f"got {values} with padding {padding!r}"
            )
        return (0, 0), (0, 0)
    if len(values) != 8:
        raise ValueError(
            f"{op}: explicit_paddings must have 8 entries with padding 'EXPLICIT', "
            f"got {len(values)}"
        )
    if min(values) < 0:
        raise ValueError(f"{op}: explicit_paddings must be non-negative, got {values}")
    pairs = [values[i : i + 2] for i in range(0, 8, 2)]
    batch, channel = pairs[0], pairs[1 if nchw else 3]
    if batch != (0, 0) or channel != (0, 0):
        raise ValueError(
            f"{op}: explicit_paddings must be 0 on the batch and channel dimensions, got {values}"
        )
    h, w = (pairs[2], pairs[3]) if nchw else (pairs[1], pairs[2])
    return (h[0], h[1]), (w[0], w[1])


def check_rank(op: str, name: str, shape: Sequence[int], *, batched: bool = True) -> None:
    """An operand's shape: rank 4, of concrete lengths but for a ``batched``
    operand's batch, which no plan reads (a symbolic one exports)."""
    if len(shape) != 4:
        raise ValueError(f"{op}: {name} must have rank 4, got rank {len(shape)} ({tuple(shape)})")
    _checks.check_concrete_shape(op, name, shape, symbolic_batch=batched)


def check_sizes(op: str, name: str, value: Any, *, batched: bool) -> tuple[int, ...]:
    """An operand's sizes given as such (``input_sizes``, ``filter_sizes``): 4
    non-negative ints, a ``batched`` operand's batch perhaps symbolic."""
    # Shapes are static in JAX: a sequence of ints such as x.shape, never a traced array.
    values = _checks.int_tuple(op, name, value, symbolic_first=batched)
    concrete = [v for v in values if not _checks.is_symbolic(v)]
    if len(values) != 4 or min(concrete) < 0:
        raise ValueError(f"{op}: {name} must be 4 non-negative ints, got {values}")
    return values


def same_dtype(op: str, first: jax.Array, name: str, value: Any) -> jax.Array:
    second = _checks.floating_array(op, name, value)
    if second.dtype != first.dtype:
        raise TypeError(f"{op}: {name} must have dtype {first.dtype}, got {second.dtype}")
    return second


def check_out_backprop(op: str, conv: Conv, shape: tuple[int, ...]) -> None:
    if tuple(shape) != conv.output_shape:
        raise ValueError(
            f"{op}: out_backprop's shape must equal the computed output shape: "
            f"actual {tuple(shape)}, computed {conv.output_shape}"
        )
