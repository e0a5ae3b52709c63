"""The depthwise ops as XLA's own grouped convolution: the portable arithmetic on TPUs.

``_xla``'s formulation reads each filter tap's shifted window of an array. On the
CPU that is the fastest program XLA compiles; XLA:TPU lays out and copies every
window instead, and its cost model counts several times the bytes of a
convolution (the design notes have the figures). So on a TPU,
``implementation="xla"`` (and so the default) computes the same sums as
``lax.conv_general_dilated`` with one group per input channel: the forward, and
its two transposes for the gradients. Half types are widened to float32 and the
products summed at full precision (``Precision.HIGHEST``: no bfloat16 passes),
then rounded once, as the other implementations do. The order of the sums is
XLA:TPU's, so results agree with the other platforms' to rounding. Configurations
whose convolution XLA:TPU compiles slowly keep the portable formulation
(``covers``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax import lax

from jaxgrad import _checks
from jaxgrad._depthwise._plan import Conv


def covers(conv: Conv) -> bool:
    """Whether a convolution computes this configuration: a depth multiplier of 1,
    more than one channel, and no empty array. XLA:TPU compiled the filter gradient
    of a single channel, or of a multiplier of 2, for minutes (measured with
    compile-only TPU devices); the portable formulation keeps those."""
    sizes = (conv.batch, *conv.in_size, *conv.out_size)
    return conv.channels > 1 and conv.multiplier == 1 and 0 not in sizes


def forward(x: jax.Array, f: jax.Array, conv: Conv) -> jax.Array:
    dtype = _checks.compute_dtype(x.dtype)
    return _convolve(x.astype(dtype), f.astype(dtype), conv).astype(x.dtype)


def input_gradient(f: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    """The forward's transpose in the input, applied to ``dy``."""
    taps = f.astype(_checks.compute_dtype(f.dtype))
    return _transposed(lambda x: _convolve(x, taps, conv), conv.input_shape, dy)


def filter_gradient(x: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    """The forward's transpose in the filter, applied to ``dy``."""
    windows = x.astype(_checks.compute_dtype(x.dtype))
    return _transposed(lambda f: _convolve(windows, f, conv), conv.filter_shape, dy)


def _transposed(
    linear: Callable[[jax.Array], jax.Array], shape: tuple[int, ...], dy: jax.Array
) -> jax.Array:
    """The transpose of ``linear`` (a map of arrays of ``shape``) applied to ``dy``,
    computed in ``dy``'s compute dtype and rounded to its dtype once."""
    dtype = _checks.compute_dtype(dy.dtype)
    like = jax.ShapeDtypeStruct(shape, dtype)  # type: ignore[no-untyped-call]
    result: jax.Array = jax.linear_transpose(linear, like)(dy.astype(dtype))[0]
    return result.astype(dy.dtype)


def _convolve(x: jax.Array, f: jax.Array, conv: Conv) -> jax.Array:
    """The depthwise convolution: filter ``[fh, fw, C, M]`` as C groups of M
    output channels each, output channel ``k * M + q`` from input channel ``k``."""
    layout = "NCHW" if conv.nchw else "NHWC"
    groups = f.reshape(*conv.kernel, 1, conv.channels * conv.multiplier)
    return lax.conv_general_dilated(
        x,
        groups,
        window_strides=conv.strides,
        padding=conv.pads,
        rhs_dilation=conv.dilations,
        dimension_numbers=(layout, "HWIO", layout),
        feature_group_count=conv.channels,
        precision=lax.Precision.HIGHEST,
    )
