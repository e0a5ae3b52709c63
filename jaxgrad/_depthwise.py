"""Depthwise conv2d and its two backprops: TensorFlow's DepthwiseConv2dNative,
DepthwiseConv2dNativeBackpropInput and DepthwiseConv2dNativeBackpropFilter.

All three are sums over the filter taps of shifted (strided, dilated) windows: the
forward multiplies each window of the input by one tap; the input gradient, split
by the residue of the input index modulo the stride (polyphase), sums shifted
windows of the output gradient times taps; and the filter gradient multiplies each
window by the output gradient and sums. They are bilinear, and each one's VJP is
built from the other two, so the set is closed under ``jax.grad``. Sums run over
the taps in a fixed order, in float32 for half types: deterministic, and no
scatter anywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from jaxgrad import _bits, _checks, _tiles

PADDINGS = ("SAME", "VALID", "EXPLICIT")
DATA_FORMATS = ("NHWC", "NCHW")

# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def depthwise_conv2d(
    input: ArrayLike,
    filter: ArrayLike,
    strides: Sequence[int],
    padding: str,
    *,
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
    explicit_paddings: Sequence[int] = (),
) -> jax.Array:
    """Depthwise 2-D convolution, with TensorFlow's two backprops as its gradient.

    With filter ``[fh, fw, C, M]`` (``M`` the depth multiplier), output channel
    ``k * M + q`` convolves input channel ``k`` with ``filter[:, :, k, q]``::

      out[b, i, j, k*M + q] = sum over (di, dj) of
          x[b, i*sh - top + di*dh, j*sw - left + dj*dw, k] * filter[di, dj, k, q]

    reads outside the input being 0 (shown for NHWC). Per spatial axis with input
    ``n``, filter ``k``, stride ``s``, dilation ``d`` and ``e = (k - 1) * d + 1``:
    VALID gives ``floor((n - e + s) / s)`` outputs; SAME gives ``ceil(n / s)`` with
    ``max(0, (out - 1) * s + e - n)`` padding, half before and the odd pixel
    after; EXPLICIT gives ``floor((n + before + after - e + s) / s)``.

    The backward pass is ``depthwise_conv2d_backprop_input`` and
    ``depthwise_conv2d_backprop_filter``. A ``jax.custom_vjp`` function: reverse
    mode works to any order, forward mode raises. float16 and bfloat16 accumulate
    in float32 and round once.

    Args:
      input: 4-D ``[N, H, W, C]`` (NHWC) or ``[N, C, H, W]`` (NCHW), floating.
      filter: ``[fh, fw, C, M]``, the dtype of ``input``.
      strides: the window's stride, 4 ints in ``data_format`` order with batch and
        channel entries 1 (TensorFlow's form), or 2 ints (height, width). Unequal
        height and width strides are supported.
      padding: ``"SAME"`` (output ``ceil(n / s)``, the odd padding pixel at the
        bottom/right), ``"VALID"`` (no padding) or ``"EXPLICIT"``.
      data_format: ``"NHWC"`` or ``"NCHW"``.
      dilations: the filter's dilation, in the same two forms as ``strides``.
        Dilations together with strides are supported.
      explicit_paddings: with ``padding="EXPLICIT"``, 8 non-negative ints: a
        (before, after) pair per dimension in ``data_format`` order, zero for batch
        and channels.

    Returns:
      ``[N, out_h, out_w, C * M]`` (NHWC) or ``[N, C * M, out_h, out_w]`` (NCHW),
      the dtype of ``input``.

    Raises:
      TypeError: an argument is not an array, not floating, or the dtypes differ.
      ValueError: a rank is not 4; the channels of input and filter differ; an
        output size is not positive; a bad padding, data_format, strides,
        dilations or explicit_paddings.

    Examples:
      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.arange(16, dtype=jnp.float32).reshape(1, 4, 4, 1)
      >>> f = jnp.ones((3, 3, 1, 1), jnp.float32)
      >>> jaxgrad.depthwise_conv2d(x, f, (1, 1), "VALID")[0, :, :, 0]
      Array([[45., 54.],
             [81., 90.]], dtype=float32)

    References:
      TensorFlow, ``tf.raw_ops.DepthwiseConv2dNative``.
    """
    op = "depthwise_conv2d"
    x = _checks.floating_array(op, "input", input)
    f = _same_dtype(op, x, "filter", filter)
    _check_rank(op, "input", x.shape)
    _check_rank(op, "filter", f.shape)
    conv = _configure(
        op, x.shape, f.shape, strides, padding, data_format, dilations, explicit_paddings
    )
    return _conv(x, f, conv)


def depthwise_conv2d_backprop_input(
    input_sizes: Sequence[int],
    filter: ArrayLike,
    out_backprop: ArrayLike,
    strides: Sequence[int],
    padding: str,
    *,
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
    explicit_paddings: Sequence[int] = (),
) -> jax.Array:
    """The gradient of ``depthwise_conv2d`` with respect to its input.

    The exact adjoint of the forward sum in ``x``: each output gradient flows back
    through every tap to the input pixel that tap read, and contributions to
    padding are dropped::

      dx[b, p, r, k] = sum over (i, j, di, dj, q) with p = i*sh - top + di*dh and
          r = j*sw - left + dj*dw of out_backprop[b, i, j, k*M + q] * filter[di, dj, k, q]

    Each residue class of input pixels modulo the stride is computed as a
    fixed-order sum over the taps that reach it (no scatter), so the result is
    bitwise reproducible. Differentiable: the VJP with respect
    to ``filter`` is ``depthwise_conv2d_backprop_filter(c, filter.shape,
    out_backprop)`` and with respect to ``out_backprop`` is
    ``depthwise_conv2d(c, filter)``.

    Args:
      input_sizes: the forward input's shape, 4 non-negative ints in
        ``data_format`` order.
      filter: ``[fh, fw, C, M]``, floating.
      out_backprop: the gradient of the forward output, ``[N, out_h, out_w, C*M]``
        (NHWC) or ``[N, C*M, out_h, out_w]`` (NCHW), the dtype of ``filter``.
      strides: the window's stride, 4 ints in ``data_format`` order with batch and
        channel entries 1 (TensorFlow's form), or 2 ints (height, width). Unequal
        height and width strides are supported.
      padding: ``"SAME"`` (output ``ceil(n / s)``, the odd padding pixel at the
        bottom/right), ``"VALID"`` (no padding) or ``"EXPLICIT"``.
      data_format: ``"NHWC"`` or ``"NCHW"``.
      dilations: the filter's dilation, in the same two forms as ``strides``.
        Dilations together with strides are supported.
      explicit_paddings: with ``padding="EXPLICIT"``, 8 non-negative ints: a
        (before, after) pair per dimension in ``data_format`` order, zero for batch
        and channels.

    Returns:
      The gradient with respect to the input, shape ``input_sizes``, the dtype of
      ``filter``.

    Raises:
      TypeError: an argument is not an array, not floating, or the dtypes differ.
      ValueError: as ``depthwise_conv2d``, and ``input_sizes`` that are not 4
        non-negative ints or disagree with the filter, or an ``out_backprop`` whose
        shape differs from the computed output shape.

    Examples:
      >>> import jax.numpy as jnp, jaxgrad
      >>> f = jnp.ones((3, 3, 1, 1), jnp.float32)
      >>> dy = jnp.ones((1, 2, 2, 1), jnp.float32)
      >>> jaxgrad.depthwise_conv2d_backprop_input((1, 4, 4, 1), f, dy, (1, 1), "VALID")[0, :, :, 0]
      Array([[1., 2., 2., 1.],
             [2., 4., 4., 2.],
             [2., 4., 4., 2.],
             [1., 2., 2., 1.]], dtype=float32)

    References:
      TensorFlow, ``tf.raw_ops.DepthwiseConv2dNativeBackpropInput``.
    """
    op = "depthwise_conv2d_backprop_input"
    f = _checks.floating_array(op, "filter", filter)
    dy = _same_dtype(op, f, "out_backprop", out_backprop)
    sizes = _sizes(op, "input_sizes", input_sizes)
    _check_rank(op, "filter", f.shape)
    _check_rank(op, "out_backprop", dy.shape)
    conv = _configure(
        op, sizes, f.shape, strides, padding, data_format, dilations, explicit_paddings
    )
    _check_out_backprop(op, conv, dy.shape)
    return _backprop_input(f, dy, conv)


def depthwise_conv2d_backprop_filter(
    input: ArrayLike,
    filter_sizes: Sequence[int],
    out_backprop: ArrayLike,
    strides: Sequence[int],
    padding: str,
    *,
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
    explicit_paddings: Sequence[int] = (),
) -> jax.Array:
    """The gradient of ``depthwise_conv2d`` with respect to its filter.

    The exact adjoint of the forward sum in ``filter``::

      df[di, dj, k, q] = sum over (b, i, j) of
          x[b, i*sh - top + di*dh, j*sw - left + dj*dw, k] * out_backprop[b, i, j, k*M + q]

    with reads outside the input being 0. Each tap's sum runs over the batch and
    the output pixels in a fixed order, in float32 for half types. Differentiable:
    the VJP with respect to ``input`` is ``depthwise_conv2d_backprop_input(
    input.shape, c, out_backprop)`` and with respect to ``out_backprop`` is
    ``depthwise_conv2d(input, c)``.

    Args:
      input: the forward input, 4-D in ``data_format`` order, floating.
      filter_sizes: the filter's shape ``[fh, fw, C, M]``, 4 non-negative ints.
      out_backprop: the gradient of the forward output, the dtype of ``input``.
      strides: the window's stride, 4 ints in ``data_format`` order with batch and
        channel entries 1 (TensorFlow's form), or 2 ints (height, width). Unequal
        height and width strides are supported.
      padding: ``"SAME"`` (output ``ceil(n / s)``, the odd padding pixel at the
        bottom/right), ``"VALID"`` (no padding) or ``"EXPLICIT"``.
      data_format: ``"NHWC"`` or ``"NCHW"``.
      dilations: the filter's dilation, in the same two forms as ``strides``.
        Dilations together with strides are supported.
      explicit_paddings: with ``padding="EXPLICIT"``, 8 non-negative ints: a
        (before, after) pair per dimension in ``data_format`` order, zero for batch
        and channels.

    Returns:
      The gradient with respect to the filter, shape ``filter_sizes``, the dtype
      of ``input``.

    Raises:
      TypeError: an argument is not an array, not floating, or the dtypes differ.
      ValueError: as ``depthwise_conv2d``, and ``filter_sizes`` that are not 4
        non-negative ints or disagree with the input, or an ``out_backprop`` whose
        shape differs from the computed output shape.

    Examples:
      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.arange(16, dtype=jnp.float32).reshape(1, 4, 4, 1)
      >>> dy = jnp.ones((1, 2, 2, 1), jnp.float32)
      >>> jaxgrad.depthwise_conv2d_backprop_filter(x, (3, 3, 1, 1), dy, (1, 1), "VALID")[:, :, 0, 0]
      Array([[10., 14., 18.],
             [26., 30., 34.],
             [42., 46., 50.]], dtype=float32)

    References:
      TensorFlow, ``tf.raw_ops.DepthwiseConv2dNativeBackpropFilter``.
    """
    op = "depthwise_conv2d_backprop_filter"
    x = _checks.floating_array(op, "input", input)
    dy = _same_dtype(op, x, "out_backprop", out_backprop)
    sizes = _sizes(op, "filter_sizes", filter_sizes)
    _check_rank(op, "input", x.shape)
    _check_rank(op, "out_backprop", dy.shape)
    conv = _configure(
        op, x.shape, sizes, strides, padding, data_format, dilations, explicit_paddings
    )
    _check_out_backprop(op, conv, dy.shape)
    return _backprop_filter(x, dy, conv)


# --------------------------------------------------------------------------------------
# Static configuration
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Conv:
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

    def _shape(self, spatial: tuple[int, int], channels: int) -> tuple[int, ...]:
        if self.nchw:
            return (self.batch, channels, *spatial)
        return (self.batch, *spatial, channels)


def _configure(
    op: str,
    input_shape: Sequence[int],
    filter_shape: Sequence[int],
    strides: Any,
    padding: Any,
    data_format: Any,
    dilations: Any,
    explicit_paddings: Any,
) -> _Conv:
    """Validates the arguments and computes output sizes and padding (SPEC §3)."""
    padding = _checks.choice(op, "padding", padding, PADDINGS)
    data_format = _checks.choice(op, "data_format", data_format, DATA_FORMATS)
    nchw = data_format == "NCHW"
    stride_hw = _spatial_pair(op, "strides", strides, nchw)
    dilation_hw = _spatial_pair(op, "dilations", dilations, nchw)
    explicit = _explicit_pads(op, padding, explicit_paddings, nchw)
    n, c = input_shape[0], input_shape[1 if nchw else 3]
    in_hw = tuple(input_shape[2:]) if nchw else tuple(input_shape[1:3])
    fh, fw, fc, m = filter_shape
    if c != fc:
        raise ValueError(
            f"{op}: input channels ({c}) must equal the filter's in_channels ({fc}); "
            f"input shape {tuple(input_shape)}, filter shape {tuple(filter_shape)}"
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
        if out <= 0:
            raise ValueError(
                f"{op}: the computed output {axis} must be positive, got {out} (input "
                f"{axis} {size}, filter {k}, dilation {d}, stride {s}, padding {before}+{after})"
            )
        pads.append((before, after))
        outs.append(out)
    return _Conv(
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


def _check_rank(op: str, name: str, shape: Sequence[int]) -> None:
    if len(shape) != 4:
        raise ValueError(f"{op}: {name} must have rank 4, got rank {len(shape)} ({tuple(shape)})")


def _sizes(op: str, name: str, value: Any) -> tuple[int, ...]:
    # Shapes are static in JAX: a sequence of ints such as x.shape, never a traced array.
    values = _checks.int_tuple(op, name, value)
    if len(values) != 4 or min(values) < 0:
        raise ValueError(f"{op}: {name} must be 4 non-negative ints, got {values}")
    return values


def _same_dtype(op: str, first: jax.Array, name: str, value: Any) -> jax.Array:
    second = _checks.floating_array(op, name, value)
    if second.dtype != first.dtype:
        raise TypeError(f"{op}: {name} must have dtype {first.dtype}, got {second.dtype}")
    return second


def _check_out_backprop(op: str, conv: _Conv, shape: tuple[int, ...]) -> None:
    if tuple(shape) != conv.output_shape:
        raise ValueError(
            f"{op}: out_backprop's shape must equal the computed output shape: "
            f"actual {tuple(shape)}, computed {conv.output_shape}"
        )


# --------------------------------------------------------------------------------------
# The computation, in a 5-D view: [N, H, W, C, M] (NHWC) or [N, C, M, H, W] (NCHW)
# --------------------------------------------------------------------------------------


def _spatial_axes(conv: _Conv) -> tuple[int, int]:
    return (3, 4) if conv.nchw else (1, 2)


def _five_d(v: jax.Array, conv: _Conv, multiplier: int) -> jax.Array:
    """Splits the channel axis of a 4-D array into (C, multiplier)."""
    n, a, b, c = v.shape
    if conv.nchw:
        return v.reshape(n, conv.channels, multiplier, b, c)
    return v.reshape(n, a, b, conv.channels, multiplier)


def _four_d(v: jax.Array, conv: _Conv) -> jax.Array:
    """Merges (C, M) back into one channel axis, channel k*M + q."""
    if conv.nchw:
        n, c, m, h, w = v.shape
        return v.reshape(n, c * m, h, w)
    n, h, w, c, m = v.shape
    return v.reshape(n, h, w, c * m)


def _filter_tap(f: jax.Array, di: int, dj: int, conv: _Conv) -> jax.Array:
    """Tap (di, dj) of the filter, [C, M], shaped to broadcast against the 5-D view."""
    tap = f[di, dj]
    return tap.reshape(1, *tap.shape, 1, 1) if conv.nchw else tap.reshape(1, 1, 1, *tap.shape)


# Every term of the three ops reads a shifted (strided, dilated) window of an array,
# with zeros where the window leaves the array. A window is a run of positions per
# spatial axis, a ``range``. Two ways to read one:
#
# - Gathered: slice a window that lies inside the array; gather one that does
#   not, with the positions clamped into the array, and mask the padding to zero.
#   No padded copy, and no float32 copy of a bfloat16 array: that is read as
#   16-bit words and each window widened after the read (`_bits`). Gathered
#   windows stop XLA:CPU from vectorizing the whole loop, so each op cuts its
#   output into blocks along both spatial axes (`_Reader.runs`): the large middle
#   block, whose windows all lie inside, is pure slices, and only the thin border
#   blocks gather; `_tile` concatenates the blocks back together.
# - Padded (the strided input gradient, whose phases interleave, and the NCHW
#   half-precision forward and input gradient): pad the array once and slice each
#   window out of the padded copy. XLA:CPU never fuses a pad that several slices
#   read, so this writes that copy first.
#
# In NCHW, W is the minor axis, and XLA:CPU does not fuse a concatenation along
# it; `_tile` joins the blocks along W last, one copy of the output. Measured
# against the padded copy, old -> new, ms, interleaved, [8, 64, 64, 64] NCHW:
#   float32   forward 3x3 (1.6, 2.5, 1.6, 2.2, 2.0) -> (1.5, 1.2, 2.0, 2.3, 2.1),
#             5x5 stride 2 M=2 4.1 -> 3.7, 3x3 M=2 2.8 -> 2.3;
#             input gradient 3x3 (1.3, 1.9, 2.1) -> (1.2, 1.3, 1.5), 3x3 M=2 4.6 -> 3.5;
#             filter gradient 3x3 (9.2, 6.8, 8.3) -> (7.5, 5.8, 6.5), 3x3 M=2 11.2 -> 9.9,
#             5x5 stride 2 M=2 13.9 -> 11.4
#   bfloat16  filter gradient 3x3 (13.4, 12.5, 8.0, 14.0) -> (7.0, 8.2, 5.3, 7.2),
#             5x5 stride 2 M=2 (9.5, 12.1) -> (11.3, 13.3): slower, kept for one rule;
#             forward 3x3 (1.6, 1.4) -> (3.0, 2.5) and input gradient (1.8, 1.1) ->
#             (2.7, 1.8): slower, so these keep the padded copy. Gathered, the
#             widening of every window was merged into one float32 copy of the
#             input; gathered as 16-bit words, they are still slower: forward
#             (1.0, 2.3) -> (1.7, 3.2), input gradient (2.2, 2.2) -> (2.5, 2.2).
#
# Measured on [8, 64, 64, 64] float32 NHWC, interleaved in one run, ms, before
# (padded, or gathered without blocks for multiplier 1) -> after:
#   forward          3x3 1.6-2.3 -> 1.3-1.7, 5x5 stride 2 M=2 5.6 -> 1.6,
#                    3x3 M=2 5.5-7.5 -> 2.1-3.1, 5x5 5.0 -> 2.9
#   input gradient   3x3 1.5-2.3 -> 1.1, 3x3 M=2 5.1 -> 1.9
#   filter gradient  5x5 stride 2 M=2 6.9 -> 5.3, 3x3 M=2 9.9 -> 8.1
# For the strided input gradient, blocks inside interleaved phases made the loop
# slower instead (5x5 stride 2 M=2: 2.1 padded, 6.3 gathered in blocks).
@dataclasses.dataclass(frozen=True)
class _Reader:
    """``reader(rows, cols)``: an array at those spatial positions, zero outside it."""

    array: jax.Array  # 5-D; padded by ``pads`` unless gathered
    axes: tuple[int, int]  # the spatial axes of ``array``
    pads: tuple[tuple[int, int], ...]  # (before, after) per spatial axis
    gathered: bool
    # ``array`` is float16, or bfloat16 held as its 16-bit words; each window is
    # widened to float32 after it is read.
    half: bool = False

    def __call__(self, rows: range, cols: range) -> jax.Array:
        if self.gathered:
            window = _gather_window(self.array, tuple(zip(self.axes, (rows, cols), strict=True)))
            if not self.half:
                return window
            if window.dtype == jnp.uint16:
                return _bits.widen(window)
            return window.astype(jnp.float32)
        window = self.array
        for axis, run, (before, _) in zip(self.axes, (rows, cols), self.pads, strict=True):
            window = _slice_run(
                window, axis, range(run.start + before, run.stop + before, run.step)
            )
        return window

    def runs(self, out: int, n: int, offsets: Sequence[int], stride: int) -> list[range]:
        """The blocks of ``range(out)`` along one axis whose windows are all inside or not.

        Output ``i`` reads positions ``i * stride + offset`` of an axis of length
        ``n``. Gathered, the outputs are cut before and after those that read
        inside for every offset (empty blocks left out); padded, nothing is cut.
        """
        if not self.gathered:
            return [range(out)]
        first = min(out, max(0, -(min(offsets) // stride)))
        stop = min(out, max(first, (n - 1 - max(offsets)) // stride + 1))
        runs = [run for run in (range(first), range(first, stop), range(stop, out)) if run]
        return runs or [range(out)]  # out == 0: one empty block keeps the shape


def _reader(
    v5: jax.Array, conv: _Conv, pads: Sequence[tuple[int, int]], dtype: Any, *, gather: bool
) -> _Reader:
    """A reader of windows of ``v5`` as ``dtype``, gathered or sliced from a padded copy.

    ``pads`` bounds how far outside (before, after) any window reaches, per axis.
    """
    axes = _spatial_axes(conv)
    pads = tuple(pads)
    if gather and v5.dtype in (jnp.bfloat16, jnp.float16) and dtype == jnp.float32:
        # Half types are read in place and each window widened, instead of a
        # float32 copy of the whole input written first. bfloat16 is read as its
        # 16-bit words and widened with a shift: XLA:CPU moves a bfloat16 convert
        # up onto the whole input, but not a float16 one. [8, 64, 64, 64], ms,
        # float32 copy -> widened per window, interleaved:
        #   bfloat16  filter gradient 3x3 NHWC 5.0 -> 4.0, 4.1 -> 3.2; NCHW 5.4 ->
        #             4.1, 6.1 -> 5.2; 5x5 stride 2 M=2 6.3 -> 5.0, 8.4 -> 6.7;
        #             NHWC forward 3x3 1.6 -> 1.4, 2.2 -> 1.9; input gradient level.
        #   float16   NHWC 3x3 forward 2.4 -> 1.0, 1.7 -> 0.9; input gradient 2.5 ->
        #             1.7, 1.9 -> 1.0; filter gradient 5.5 -> 4.9, 4.9 -> 2.7; NCHW
        #             3x3 filter gradient 6.4 -> 4.6, 6.6 -> 5.2; 5x5 stride 2 M=2
        #             forward 3.5 -> 2.3, 2.8 -> 1.5, filter gradient 5.9 -> 6.1,
        #             7.0 -> 5.0, input gradient 2.0 -> 1.7, 1.7 -> 1.9.
        array = _bits.words(v5) if v5.dtype == jnp.bfloat16 else v5
        return _Reader(array, axes, pads, gathered=True, half=True)
    if gather:
        return _Reader(v5.astype(dtype), axes, pads, gathered=True)
    config = [(0, 0, 0)] * 5
    for axis, (before, after) in zip(axes, pads, strict=True):
        config[axis] = (before, after, 0)
    padded = lax.pad(v5, jnp.zeros((), v5.dtype), config)
    if padded.dtype != dtype:
        # Widened behind a barrier: XLA would otherwise read the windows that lie
        # inside from a second, separately written float32 copy of ``v5`` (the
        # NCHW bfloat16 filter gradient, when it still read a padded copy: 19-21
        # ms with that copy, 9.8 ms without).
        padded = lax.optimization_barrier(padded.astype(dtype))  # type: ignore[no-untyped-call]
    return _Reader(padded, axes, pads, gathered=False)


def _slice_run(v: jax.Array, axis: int, run: range) -> jax.Array:
    """``v`` at a run of positions inside it along ``axis``: a strided slice."""
    limit = run.start + (len(run) - 1) * run.step + 1 if len(run) else run.start
    return lax.slice_in_dim(v, run.start, limit, run.step, axis)


def _gather_window(v: jax.Array, runs: Sequence[tuple[int, range]]) -> jax.Array:
    """``v`` at a run of positions along each of some axes, zero outside ``v``."""
    inside_masks = []
    for axis, run in runs:
        n = v.shape[axis]
        index = np.arange(run.start, run.stop, run.step)
        inside = (index >= 0) & (index < n)
        if inside.all():
            v = _slice_run(v, axis, run)
            continue
        if n == 0:  # every position is padding
            shape = list(v.shape)
            shape[axis] = len(index)
            v = jnp.zeros(shape, v.dtype)
        else:
            v = jnp.take(v, np.clip(index, 0, n - 1), axis=axis, mode="clip")
        shape = [1] * v.ndim
        shape[axis] = len(index)
        inside_masks.append(inside.reshape(shape))
    if inside_masks:
        v = jnp.where(functools.reduce(operator.and_, inside_masks), v, jnp.zeros((), v.dtype))
    return v


def _tile(
    block: Callable[[range, range], jax.Array],
    row_runs: Sequence[range],
    col_runs: Sequence[range],
    conv: _Conv,
) -> jax.Array:
    """``block(rows, cols)`` for each pair of runs, concatenated into one array.

    XLA:CPU fuses the blocks into a concatenation, except along the minor
    dimension (W in NCHW). So in NCHW the blocks are joined into columns first,
    which fuses, and the columns along W last, one copy.
    """
    h_axis, w_axis = _spatial_axes(conv)
    cuts = [(h_axis, row_runs), (w_axis, col_runs)]
    if conv.nchw:
        cuts.reverse()
    return _tiles.tile(lambda runs: block(runs[h_axis], runs[w_axis]), cuts)


def _window(read: _Reader, di: int, dj: int, conv: _Conv, rows: range, cols: range) -> jax.Array:
    """The input pixels tap (di, dj) reads for the output pixels ``rows`` x ``cols``."""
    runs = [
        range(t * d - before + out.start * s, t * d - before + out.stop * s, s)
        for t, s, d, (before, _), out in zip(
            (di, dj), conv.strides, conv.dilations, conv.pads, (rows, cols), strict=True
        )
    ]
    return read(runs[0], runs[1])


def _window_runs(read: _Reader, conv: _Conv, axis: int, taps: Sequence[int]) -> list[range]:
    """``read.runs`` for the output positions along spatial ``axis`` (0 or 1), read
    through the given taps."""
    before, d = conv.pads[axis][0], conv.dilations[axis]
    offsets = [t * d - before for t in taps]
    return read.runs(conv.out_size[axis], conv.in_size[axis], offsets, conv.strides[axis])


def _taps(conv: _Conv) -> list[tuple[int, int]]:
    return [(di, dj) for di in range(conv.kernel[0]) for dj in range(conv.kernel[1])]


def _forward(x: jax.Array, f: jax.Array, conv: _Conv) -> jax.Array:
    dtype = _checks.compute_dtype(x.dtype)
    gather = not conv.nchw or dtype == x.dtype
    read = _reader(_five_d(x, conv, 1), conv, conv.pads, dtype, gather=gather)
    f = f.astype(dtype)

    def block(rows: range, cols: range) -> jax.Array:
        return functools.reduce(
            operator.add,
            (
                _window(read, di, dj, conv, rows, cols) * _filter_tap(f, di, dj, conv)
                for di, dj in _taps(conv)
            ),
        )

    return _four_d(
        _tile(
            block,
            _window_runs(read, conv, 0, range(conv.kernel[0])),
            _window_runs(read, conv, 1, range(conv.kernel[1])),
            conv,
        ),
        conv,
    ).astype(x.dtype)


def _phases(
    n: int, out: int, k: int, s: int, d: int, before: int
) -> tuple[int, list[list[tuple[int, int]]], tuple[int, int]]:
    """The input gradient along one axis, split by the residue of the input index.

    Input pixel ``p = r + s*u`` receives tap ``t`` from output ``i = u + c`` exactly
    when ``(r + before - t*d)`` is a multiple of ``s``, with ``c`` that multiple
    divided by ``s``. Returns the phase length ``ceil(n / s)``, the ``(t, c)`` pairs
    of each residue ``r``, and the zero padding of the gradient that keeps every
    ``u + c`` in range.
    """
    length = -(-n // s)
    phases = [
        [(t, (r + before - t * d) // s) for t in range(k) if (r + before - t * d) % s == 0]
        for r in range(s)
    ]
    offsets = [c for taps in phases for _, c in taps] or [0]
    return length, phases, (max(0, -min(offsets)), max(0, max(offsets) + length - out))


def _interleave(phases: list[jax.Array], axis: int, size: int) -> jax.Array:
    """``out[r + s*u] = phases[r][u]`` along ``axis``, cropped to ``size``."""
    if len(phases) == 1:
        stacked = phases[0]
    else:
        stacked = jnp.stack(phases, axis=axis + 1)
        shape = list(phases[0].shape)
        shape[axis] *= len(phases)
        stacked = stacked.reshape(shape)
    return lax.slice_in_dim(stacked, 0, size, axis=axis)


def _input_gradient(f: jax.Array, dy: jax.Array, conv: _Conv) -> jax.Array:
    # Polyphase: the input pixels of one residue class per axis receive a fixed set
    # of taps at shifts that do not depend on the pixel, so each class is a stride-1
    # shifted sum over the gradient, and the classes interleave back into place.
    # (Spreading the gradient with interior padding instead was 66x slower for 5x5
    # stride 2: 178.6 ms against 2.69 ms, benchmarks/depthwise.py.) Each multiplier
    # slice sums its taps, and the slices are summed with explicit adds: no
    # reduction, no scatter.
    dtype = _checks.compute_dtype(dy.dtype)
    dy5 = _five_d(dy, conv, conv.multiplier)
    f = f.astype(dtype)
    h_axis, w_axis = _spatial_axes(conv)
    m_axis = 2 if conv.nchw else 4
    plans = [
        _phases(n, o, k, s, d, before)
        for n, o, k, s, d, (before, _) in zip(
            conv.in_size,
            conv.out_size,
            conv.kernel,
            conv.strides,
            conv.dilations,
            conv.pads,
            strict=True,
        )
    ]
    (rows, h_phases, h_pads), (cols, w_phases, w_pads) = plans
    gather = (not conv.nchw or dtype == dy.dtype) and conv.strides == (1, 1)
    read = _reader(dy5, conv, (h_pads, w_pads), dtype, gather=gather)

    def phase(h_taps: list[tuple[int, int]], w_taps: list[tuple[int, int]]) -> jax.Array:
        if not h_taps or not w_taps:  # no tap reaches this residue class
            shape = list(dy5.shape)
            shape[h_axis], shape[w_axis], shape[m_axis] = rows, cols, 1
            return jnp.zeros(shape, dtype)

        def block(block_rows: range, block_cols: range) -> jax.Array:
            total = functools.reduce(
                operator.add,
                (
                    read(
                        range(ch + block_rows.start, ch + block_rows.stop),
                        range(cw + block_cols.start, cw + block_cols.stop),
                    )
                    * _filter_tap(f, th, tw, conv)
                    for th, ch in h_taps
                    for tw, cw in w_taps
                ),
            )
            return functools.reduce(
                operator.add,
                (lax.slice_in_dim(total, q, q + 1, axis=m_axis) for q in range(conv.multiplier)),
            )

        row_runs = read.runs(rows, conv.out_size[0], [c for _, c in h_taps], 1)
        col_runs = read.runs(cols, conv.out_size[1], [c for _, c in w_taps], 1)
        return _tile(block, row_runs, col_runs, conv)

    by_rows = [
        _interleave([phase(h, w) for w in w_phases], w_axis, conv.in_size[1]) for h in h_phases
    ]
    return _four_d(_interleave(by_rows, h_axis, conv.in_size[0]), conv).astype(dy.dtype)


# The filter gradient's reduction runs in two stages. XLA:CPU emits a reduction
# whose input is a shifted slice as a slow scalar loop (40-60 ms for 3x3 taps on
# [8, 64, 64, 64]), but runs elementwise fusions and reductions of whole arrays at
# memory speed. So stage 1 adds up blocks of output rows with explicit adds, each
# term slicing the input and the gradient itself (a product shared by many slices
# gets materialized), and stage 2 reduces that small, whole array. Measured on
# [8, 64, 64, 64] 3x3: 56 ms before, about 6 ms after; benchmarks/depthwise.py.
_ROW_BLOCKS = 8
# Taps per stage-1 fusion (see below). Filter gradient on [8, 64, 64, 64], ms, in
# one interleaved run; "before" stacked all taps at once (and sliced the windows
# out of a padded copy):
#                           before   1 kernel row   9 taps   15 taps   all taps
#   3x3 NHWC M=1              6.4        4.9          3.8      3.5       3.3
#   3x3 NHWC M=2             34.1       13.8         12.1     11.2      11.2
#   3x3 NCHW M=1             11.1       10.2          7.9      7.6       7.6
#   5x5 NHWC M=1             37.9        9.8          9.6      7.8      10.1
#   5x5 stride 2 NHWC M=2     6.3        5.4          5.8      9.3      10.6
_TAPS_PER_FUSION = 9


def _filter_gradient(x: jax.Array, dy: jax.Array, conv: _Conv) -> jax.Array:
    dtype = _checks.compute_dtype(x.dtype)
    read = _reader(_five_d(x, conv, 1), conv, conv.pads, dtype, gather=True)
    # A float16 dy stays float16 and each slice is widened where it is read, as
    # the windows are (_reader): 3x3 on [8, 64, 64, 64], ms, interleaved, float32
    # copy -> per slice: NHWC 3.2 -> 2.5, 3.4 -> 4.1, 4.1 -> 2.9; NCHW 6.2 -> 6.0,
    # 5.9 -> 4.5, 6.3 -> 4.4; 5x5 stride 2 M=2 7.1 -> 6.4, 6.0 -> 4.7, 6.0 -> 4.8.
    dy5 = _five_d(dy, conv, conv.multiplier)
    if dy5.dtype != jnp.float16:
        dy5 = dy5.astype(dtype)
    row_axis, col_axis = _spatial_axes(conv)
    out_rows = conv.out_size[0]
    block = -(-out_rows // _ROW_BLOCKS)

    def block_term(di: int, dj: int, first: int) -> jax.Array:
        def product(rows: range, cols: range) -> jax.Array:
            window = _window(read, di, dj, conv, rows, cols)
            grad = _slice_run(_slice_run(dy5, row_axis, rows), col_axis, cols)
            return window * grad.astype(dtype)

        rows = range(first, min(first + block, out_rows))
        term = _tile(product, [rows], _window_runs(read, conv, 1, [dj]), conv)
        if len(rows) < block:  # the last block is short: pad it with zero rows
            config = [(0, 0, 0)] * 5
            config[row_axis] = (0, block - len(rows), 0)
            term = lax.pad(term, jnp.zeros((), dtype), config)
        return term

    def tap_rows(di: int, dj: int) -> jax.Array:
        return functools.reduce(
            operator.add, (block_term(di, dj, first) for first in range(0, out_rows, block))
        )

    # Stacking the taps' partial sums before a reduction keeps stage 1 in XLA's own
    # loop fusion (reduced directly, its slices would be copied out one by one to
    # feed the library reduction). Stacked after the batch axis, the taps of one
    # image are computed while that image is in cache. Stacked kernel row by kernel
    # row, because XLA:CPU fuses a concatenate of at most 8 operands, and at most
    # _TAPS_PER_FUSION taps per stack: more made the strided 5x5 case slower (table
    # above), and beyond 15 taps XLA:CPU copies out the gradient blocks they share.
    fh, fw = conv.kernel
    reduced = (0, 5, 6) if conv.nchw else (0, 3, 4)

    def kernel_rows_gradient(kernel_rows: range) -> jax.Array:
        partial = jnp.stack(
            [jnp.stack([tap_rows(di, dj) for dj in range(fw)], axis=1) for di in kernel_rows],
            axis=1,
        )
        return jnp.sum(partial, axis=reduced)

    rows_per_stack = max(1, _TAPS_PER_FUSION // fw)
    grad = jnp.concatenate(
        [
            kernel_rows_gradient(range(top, min(top + rows_per_stack, fh)))
            for top in range(0, fh, rows_per_stack)
        ]
    )
    return grad.reshape(conv.filter_shape).astype(x.dtype)


# --------------------------------------------------------------------------------------
# Custom VJPs: each op's backward is built from the other two (SPEC §0)
# --------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(x: jax.Array, f: jax.Array, conv: _Conv) -> jax.Array:
    return _forward(x, f, conv)


def _conv_fwd(
    x: jax.Array, f: jax.Array, conv: _Conv
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _conv(x, f, conv), (x, f)


def _conv_bwd(
    conv: _Conv, residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, f = residuals
    return _backprop_input(f, g, conv), _backprop_filter(x, g, conv)


_conv.defvjp(_conv_fwd, _conv_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _backprop_input(f: jax.Array, dy: jax.Array, conv: _Conv) -> jax.Array:
    return _input_gradient(f, dy, conv)


def _backprop_input_fwd(
    f: jax.Array, dy: jax.Array, conv: _Conv
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _backprop_input(f, dy, conv), (f, dy)


def _backprop_input_bwd(
    conv: _Conv, residuals: tuple[jax.Array, jax.Array], c: jax.Array
) -> tuple[jax.Array, jax.Array]:
    f, dy = residuals
    return _backprop_filter(c, dy, conv), _conv(c, f, conv)


_backprop_input.defvjp(_backprop_input_fwd, _backprop_input_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _backprop_filter(x: jax.Array, dy: jax.Array, conv: _Conv) -> jax.Array:
    return _filter_gradient(x, dy, conv)


def _backprop_filter_fwd(
    x: jax.Array, dy: jax.Array, conv: _Conv
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _backprop_filter(x, dy, conv), (x, dy)


def _backprop_filter_bwd(
    conv: _Conv, residuals: tuple[jax.Array, jax.Array], c: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, dy = residuals
    return _backprop_input(c, dy, conv), _conv(x, c, conv)


_backprop_filter.defvjp(_backprop_filter_fwd, _backprop_filter_bwd)
