"""Resample and its gradient: DirectML's RESAMPLE/RESAMPLE1/RESAMPLE2 and RESAMPLE_GRAD/GRAD1.

Resampling is linear and separable: along each axis the output is a sparse matrix
``W`` (``n_out x n_in``) times the input, and the gradient is ``W.T`` times the
incoming gradient. Both are computed the same way, in *gather form*: every row of
the matrix (an output element for the forward, an input element for the gradient)
lists its few non-zero columns in a fixed order, and the row's value is the
weighted sum of the gathered entries, summed in that order (``_plan`` builds the
rows on the host, one period of them where the scale repeats). The gradient is
therefore a gather, not a scatter-add: no atomics, bitwise reproducible.

This module holds what the ops mean: the public functions, their argument checks
and the custom VJP that makes the pair closed under ``jax.grad``. The arithmetic
comes from an implementation chosen per backend: ``_xla`` (jnp/lax, every
backend) or ``_pallas`` (kernels for CUDA GPUs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jaxgrad import _checks, _compiled, _implementation, _sharding
from jaxgrad._resample import _pallas, _partition, _plan, _xla
from jaxgrad._resample._plan import Axis

MODES = ("nearest", "linear")
ROUNDINGS = ("half_up", "down", "up")


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def resample(
    x: ArrayLike,
    scales: Sequence[float],
    *,
    mode: str = "nearest",
    rounding: str = "half_up",
    input_pixel_offsets: float | Sequence[float] = 0.5,
    output_pixel_offsets: float | Sequence[float] = -0.5,
    output_shape: Sequence[int] | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """Resamples every axis of ``x`` by nearest neighbour or linear interpolation.

    Along an axis of input length ``n_in`` with scale ``s``, input pixel offset
    ``a`` and output pixel offset ``b``, output index ``o`` reads the input at::

      u(o) = (o - b) / s - a

    ``mode="nearest"`` takes ``x[clamp(r(u), 0, n_in - 1)]`` with the rounding
    ``r``: ``"half_up"`` is ``floor(u + 0.5)`` (ties go up), ``"down"`` is
    ``floor(u)``, ``"up"`` is ``ceil(u)``. ``mode="linear"`` mixes the two taps
    ``clamp(floor(u))`` and ``clamp(floor(u) + 1)`` with weights ``1 - t`` and
    ``t``, ``t = u - floor(u)``; taps that clamp onto the same index add up, so
    the edges repeat. There is no antialiasing when shrinking. Several axes
    multiply their weights (the op is separable). An axis with ``s = 1``,
    ``a + b = 0`` and an unchanged length is the identity and costs nothing.

    The defaults (``a = 0.5``, ``b = -0.5``) sample at pixel centres (the
    half-pixel convention). For ONNX, PyTorch or TensorFlow conventions, use
    ``jaxgrad.resize``.

    The backward pass is ``resample_grad`` with the same parameters, computed as a
    gather, so it is bitwise reproducible. ``resample`` is a ``jax.custom_vjp``
    function: reverse mode works to any order, forward mode raises.

    Args:
      x: array of rank >= 1. Any axis can be resampled, batch and channel axes
        too. Floating dtypes; ``mode="nearest"`` also accepts integer and bool
        arrays (without gradients).
      scales: one positive, finite scale per axis of ``x`` (DirectML's Scales).
      mode: ``"nearest"`` or ``"linear"``.
      rounding: for ``"nearest"``: ``"half_up"`` (DirectML RESAMPLE and RESAMPLE1),
        ``"down"`` or ``"up"`` (RESAMPLE2 with a decreasing or increasing
        rounding direction). Ignored by ``"linear"``.
      input_pixel_offsets: ``a``; a number, or one per axis.
      output_pixel_offsets: ``b``; a number, or one per axis.
      output_shape: the output's shape, one non-negative length per axis (a zero
        length gives an empty result, as does an empty ``x`` with zero lengths
        where it is empty). Defaults to ``floor(n_in * s)`` per axis, which must not
        be 0. The coordinates use ``scales`` either way.
      implementation: which arithmetic computes the op, as in
        ``jax.nn.dot_product_attention``: ``None`` (default) picks per backend. On CUDA
        GPUs of compute capability 8.0 and newer it takes a Pallas kernel for linear
        maps that XLA's own program would run as a pass per axis (2x upsampling, say),
        for half-precision linear gradients, and for half-precision nearest neighbour
        but forwards that shrink every axis, none of them a gradient along the array's
        last axis; the jnp/lax composition everywhere else (the resample page has the
        table). ``"xla"`` is the jnp/lax composition on every backend; ``"pallas"`` is the
        kernel, compiled on a CUDA GPU and interpreted on the CPU (slow: for tests). All
        give the same results up to float rounding (nearest neighbour's are exact), each
        bitwise reproducible.

    Returns:
      The resampled array, with ``output_shape`` and the dtype of ``x``. Half
      precision inputs are interpolated in float32 and rounded once.

    Raises:
      TypeError: ``x`` is not an array, or its dtype does not suit ``mode``;
        ``scales`` is a single number; a shape or parameter is traced (they must
        be static Python values); ``x``'s shape has a symbolic dimension
        (``jax.export``).
      ValueError: ``x`` is 0-d; a scale is not positive and finite; an offset is
        not finite; a per-axis argument has the wrong length; ``mode`` or
        ``rounding`` is unknown; an output length is negative, or the default
        one is 0; an empty axis of ``x`` is to be sampled into a non-empty one;
        an axis of ``x`` or of the output is longer than ``2**31 - 1``; an
        unknown ``implementation``, or ``"pallas"`` asked for where it cannot
        run (a backend other than CPU and CUDA, a JAX without Pallas' Triton
        backend, or an array the kernel's int32 counts do not reach: see the
        ``implementation=`` section of the resample docs).

    Examples:
      The example of DirectML's RESAMPLE_GRAD1 page: height halved, width times
      1.5, rounding down.

      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.array([[[[1, 2], [3, 4]]]], dtype=jnp.float32)
      >>> jaxgrad.resample(x, (1, 1, 0.5, 1.5), rounding="down")
      Array([[[[1., 1., 2.]]]], dtype=float32)

    References:
      DirectML, ``DML_RESAMPLE1_OPERATOR_DESC`` and ``DML_RESAMPLE2_OPERATOR_DESC``.
    """
    op = "resample"
    x = _checks.as_array(op, "x", x)
    check_rank(op, "x", x)
    mode, rounding = check_mode(op, mode, rounding)
    impl = _implementation.check(op, implementation)
    check_dtype(op, "x", x, allow_integers=mode == "nearest")
    scales_ = positive_scales(op, scales, x.ndim)
    a = _checks.float_per_axis(op, "input_pixel_offsets", input_pixel_offsets, x.ndim)
    b = _checks.float_per_axis(op, "output_pixel_offsets", output_pixel_offsets, x.ndim)
    if output_shape is None:
        out_shape = tuple(math.floor(n * s) for n, s in zip(x.shape, scales_, strict=True))
        if 0 in out_shape:
            raise ValueError(
                f"{op}: the default output shape floor(x.shape * scales) = {out_shape} has a "
                f"zero length (x.shape {x.shape}, scales {scales_}); pass output_shape"
            )
    else:
        out_shape = check_shape(op, "output_shape", output_shape, x.ndim)
    check_samples(op, x.shape, out_shape)
    if 0 in x.shape or 0 in out_shape:  # empty in or out: nothing to compute
        return jnp.zeros(out_shape, x.dtype)
    axes = tuple(
        Axis(n, m, _plan.Affine(s, ai, bi), mode == "linear", rounding)
        for n, m, s, ai, bi in zip(x.shape, out_shape, scales_, a, b, strict=True)
    )
    return compiled_core(x, axes, False, impl)  # type: ignore[no-any-return]


def resample_grad(
    dy: ArrayLike,
    input_shape: Sequence[int],
    scales: Sequence[float],
    *,
    mode: str = "nearest",
    rounding: str = "half_up",
    input_pixel_offsets: float | Sequence[float] = 0.5,
    output_pixel_offsets: float | Sequence[float] = -0.5,
    implementation: str | None = None,
) -> jax.Array:
    """The gradient of ``resample``: the exact adjoint, with the same parameters.

    With ``w(o, i)`` the weight that output ``o`` of ``resample`` gives input
    ``i``::

      dx[i] = sum over o of w(o, i) * dy[o]

    a scatter-add of ``dy`` for nearest neighbour and a weighted splat for linear.
    jaxgrad computes it in gather form: each ``dx[i]`` sums the outputs that
    sampled it, in increasing order of ``o``. No atomics, so the result is bitwise
    the same on every run and every backend; float16 and bfloat16 accumulate in
    float32 and round once.

    Pass the *forward's* offsets. (One DirectML consumer hands its grad op the
    forward's offsets swapped; jaxgrad keeps them as they are so that the
    gradient is the exact adjoint.) ``resample_grad`` is differentiable: its VJP
    is ``resample`` with ``output_shape=dy.shape``.

    Args:
      dy: the gradient flowing into ``resample``'s output, rank >= 1, floating.
      input_shape: the shape of the forward's input (the result's shape), one
        non-negative length per axis of ``dy``.
      scales: one positive, finite scale per axis, as given to ``resample``.
      mode: ``"nearest"`` or ``"linear"``.
      rounding: ``"half_up"``, ``"down"`` or ``"up"``, as given to ``resample``.
      input_pixel_offsets: as given to ``resample``.
      output_pixel_offsets: as given to ``resample``.
      implementation: ``None`` (default), ``"xla"`` or ``"pallas"``, as given to
        ``resample``, whose rules the gradient follows.

    Returns:
      The gradient with respect to ``resample``'s input, with shape
      ``input_shape`` and the dtype of ``dy``.

    Raises:
      TypeError: ``dy`` is not a floating array, or its shape has a symbolic
        dimension (``jax.export``).
      ValueError: ``input_shape``'s rank differs from ``dy``'s, or a length is
        negative, or an axis of ``input_shape`` is empty where ``dy``'s is not,
        or an axis is longer than ``2**31 - 1``, or any argument ``resample``
        would refuse (``implementation`` included).

    Examples:
      The example of DirectML's RESAMPLE_GRAD1 page:

      >>> import jax.numpy as jnp, jaxgrad
      >>> dy = jnp.array([[[[4, 5, 6]]]], dtype=jnp.float32)
      >>> jaxgrad.resample_grad(dy, (1, 1, 2, 2), (1, 1, 0.5, 1.5), rounding="down")
      Array([[[[9., 6.],
               [0., 0.]]]], dtype=float32)

    References:
      DirectML, ``DML_RESAMPLE_GRAD_OPERATOR_DESC`` and
      ``DML_RESAMPLE_GRAD1_OPERATOR_DESC``.
    """
    op = "resample_grad"
    dy = _checks.as_array(op, "dy", dy)
    check_rank(op, "dy", dy)
    mode, rounding = check_mode(op, mode, rounding)
    impl = _implementation.check(op, implementation)
    check_dtype(op, "dy", dy, allow_integers=False)
    in_shape = check_shape(op, "input_shape", input_shape, dy.ndim)
    scales_ = positive_scales(op, scales, dy.ndim)
    a = _checks.float_per_axis(op, "input_pixel_offsets", input_pixel_offsets, dy.ndim)
    b = _checks.float_per_axis(op, "output_pixel_offsets", output_pixel_offsets, dy.ndim)
    check_samples(op, in_shape, dy.shape)
    if 0 in in_shape or 0 in dy.shape:  # no output reads any input
        return jnp.zeros(in_shape, dy.dtype)
    axes = tuple(
        Axis(n, m, _plan.Affine(s, ai, bi), mode == "linear", rounding)
        for n, m, s, ai, bi in zip(in_shape, dy.shape, scales_, a, b, strict=True)
    )
    return compiled_core(dy, axes, True, impl)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------
# The core: a separable sparse linear map, its transpose, and the custom VJP
# --------------------------------------------------------------------------------------


def _preferred(axes: tuple[Axis, ...], transpose: bool, dtype: Any) -> bool:
    """Whether ``implementation=None`` takes the kernel on a CUDA GPU. XLA's
    program applies the axes one at a time; in float32 it runs nearest neighbour,
    and the linear maps it compiles into one pass that way (``one_pass_on_gpus``),
    about as fast as a copy, and can fuse them with their neighbours. Elsewhere
    the kernel reads every axis's taps in one pass (``"xla"`` on GPUs then does
    too, in one expression; below, where that was the faster). In half precision
    the kernel also takes nearest neighbour and every linear gradient, which XLA
    ran slower than a copy even in one pass; XLA keeps the forwards that shrink
    every axis they resample, nearest or linear, which it reads in one strided
    pass (a 0.5x shrink ran as fast there in NHWC, faster in NCHW).

    A gradient that resamples the array's last axis (a channels-first layout)
    stays with XLA: the kernel's lanes then run along that axis and gather its
    taps element by element, and XLA's program was the faster of the two for
    every such gradient measured (bfloat16 NCHW and NCDHW on an H200)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        return False
    if transpose and not _plan.plan(axes[-1], transpose).is_identity:
        return False
    half = dtype in (jnp.bfloat16, jnp.float16)  # not an integer's nearest copy
    if not any(axis.linear for axis in axes):
        return half and (transpose or not _plan.shrinks_every_axis(axes))
    if transpose and half:
        return True
    return not _xla.one_pass_on_gpus(axes, transpose)


def _run(x: jax.Array, axes: tuple[Axis, ...], transpose: bool, impl: str | None) -> jax.Array:
    """The map (or its transpose) on ``x``, from the implementation ``impl`` chooses.
    Under explicit sharding ``x`` and the result are laid out as
    ``_partition.explicit_specs`` say, whichever implementation computes."""
    specs = _partition.explicit_specs(axes, transpose, x)
    if specs is not None:
        x = _sharding.reshard(x, specs[0])
    result = _implementation.run(
        "resample_grad" if transpose else "resample",
        impl,
        (x,),
        xla=functools.partial(_xla.apply, axes=axes, transpose=transpose),
        pallas=functools.partial(_partition.apply, axes=axes, transpose=transpose),
        pallas_available=_pallas.AVAILABLE,
        pallas_preferred=_preferred(axes, transpose, x.dtype),
        pallas_refusal=_pallas.refusal(x.shape, x.dtype, axes, transpose),
    )
    return result if specs is None else _sharding.reshard(result, specs[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def resample_core(
    x: jax.Array, axes: tuple[Axis, ...], transpose: bool, impl: str | None
) -> jax.Array:
    return _run(x, axes, transpose, impl)


def _resample_core_fwd(
    x: jax.Array, axes: tuple[Axis, ...], transpose: bool, impl: str | None
) -> tuple[jax.Array, _sharding.Layout]:
    # Linear: no array to keep, only the sharding type the cotangent must have.
    return compiled_core(x, axes, transpose, impl), _sharding.Layout.of(x)


def _resample_core_bwd(
    axes: tuple[Axis, ...],
    transpose: bool,
    impl: str | None,
    layout: _sharding.Layout,
    g: jax.Array,
) -> tuple[jax.Array]:
    # resample's VJP is resample_grad and resample_grad's is resample, with the
    # same implementation: the pair is closed under differentiation.
    return (layout.apply(compiled_core(g, axes, not transpose, impl)),)


resample_core.defvjp(_resample_core_fwd, _resample_core_bwd)

# What the public functions, resize and the VJP rules above call (``_compiled.core``).
compiled_core = _compiled.core(resample_core, static_argnums=(1, 2, 3))


# --------------------------------------------------------------------------------------
# Argument checks shared with resize
# --------------------------------------------------------------------------------------


def check_rank(op: str, name: str, x: jax.Array) -> None:
    """An operand's shape: rank 1 or more, of concrete lengths."""
    if x.ndim == 0:
        raise ValueError(f"{op}: {name} must have rank >= 1, got a 0-d array")
    _checks.check_concrete_shape(op, name, x.shape)


def check_mode(op: str, mode: Any, rounding: Any) -> tuple[str, str]:
    return _checks.choice(op, "mode", mode, MODES), _checks.choice(
        op, "rounding", rounding, ROUNDINGS
    )


def check_dtype(op: str, name: str, x: jax.Array, *, allow_integers: bool) -> None:
    if allow_integers and (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
        return
    if x.dtype not in _checks.FLOAT_DTYPES:
        allowed = "a floating, integer or bool dtype" if allow_integers else "a floating dtype"
        raise TypeError(f"{op}: {name} must have {allowed} for this mode, got {x.dtype}")


def positive_scales(op: str, scales: Any, rank: int) -> tuple[float, ...]:
    _checks.check_static(op, "scales", scales)
    if _checks.is_scalar(scales):  # a scale per axis, batch and channels included
        raise TypeError(
            f"{op}: scales must have one entry per axis of the input ({rank}), got {scales!r}"
        )
    values = _checks.float_per_axis(op, "scales", scales, rank)
    if not all(s > 0 for s in values):
        raise ValueError(f"{op}: scales must be positive, got {values}")
    return values


def check_shape(op: str, name: str, shape: Any, rank: int) -> tuple[int, ...]:
    """One non-negative length per axis (zero lengths give empty arrays)."""
    values = _checks.int_tuple(op, name, shape)
    if len(values) != rank:
        raise ValueError(f"{op}: {name} must have one entry per axis ({rank}), got {len(values)}")
    if not all(n >= 0 for n in values):
        raise ValueError(f"{op}: {name} must be non-negative, got {values}")
    return values


# The longest axis, in and out: the tables of taps hold int32 indices, for XLA's
# gathers and the kernels alike.
MAX_LENGTH = 2**31 - 1


def check_samples(op: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
    """An output along an axis needs an input there to sample, and no axis may
    be longer than an int32 index reaches."""
    for axis, (n, m) in enumerate(zip(in_shape, out_shape, strict=True)):
        if n == 0 and m > 0:
            raise ValueError(
                f"{op}: axis {axis} of the input is empty, so there is nothing to sample for "
                f"its {m} outputs (input shape {in_shape}, output shape {out_shape})"
            )
        if max(n, m) > MAX_LENGTH:
            raise ValueError(
                f"{op}: axis {axis} must be at most 2**31 - 1 long in the input and the "
                f"output, got {n} and {m} (input shape {in_shape}, output shape {out_shape})"
            )
