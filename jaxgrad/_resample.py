"""Resample and its gradient: DirectML's RESAMPLE/RESAMPLE1/RESAMPLE2 and RESAMPLE_GRAD/GRAD1.

Resampling is linear and separable: along each axis the output is a sparse matrix
``W`` (``n_out x n_in``) times the input, and the gradient is ``W.T`` times the
incoming gradient. Both are computed the same way, in *gather form*: every row of
the matrix (an output element for the forward, an input element for the gradient)
lists its few non-zero columns in a fixed order, and the row's value is the
weighted sum of the gathered entries, summed in that order (``_sampling`` builds
the rows on the host, one period of them where the scale repeats). The gradient
is therefore a gather, not a scatter-add: no atomics, bitwise reproducible, and at
memory speed on XLA:CPU, where a scatter-add is 20x slower.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from jaxgrad import _bits, _checks, _sampling, _tiles
from jaxgrad._sampling import Axis

MODES = ("nearest", "linear")
ROUNDINGS = ("half_up", "down", "up")

# The most blocks an op is cut into (runs per axis multiplied); beyond, each axis is
# applied whole.
_MAX_BLOCKS = 27
# Axes up to this many rows are gathered with constant index tables (at most a
# few hundred KiB of program): XLA:CPU runs those several times faster than a
# gather whose indices the program computes. Longer axes compute them from the
# pattern.
_LISTED_ROWS = 4096
# Rows with more taps than this (the gradient of a large upsampling: each input
# sums every output it fed) are summed in a loop over the taps, so that the
# program does not grow with the scale.
_MAX_UNROLLED_TAPS = 16


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

    Returns:
      The resampled array, with ``output_shape`` and the dtype of ``x``. Half
      precision inputs are interpolated in float32 and rounded once.

    Raises:
      TypeError: ``x`` is not an array, or its dtype does not suit ``mode``;
        ``scales`` is a single number; a shape or parameter is traced (they must
        be static Python values).
      ValueError: ``x`` is 0-d; a scale is not positive and finite; an offset is
        not finite; a per-axis argument has the wrong length; ``mode`` or
        ``rounding`` is unknown; an output length is negative, or the default
        one is 0; an empty axis of ``x`` is to be sampled into a non-empty one.

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
        Axis(n, m, _sampling.Affine(s, ai, bi), mode == "linear", rounding)
        for n, m, s, ai, bi in zip(x.shape, out_shape, scales_, a, b, strict=True)
    )
    return compiled_core(x, axes, False)  # type: ignore[no-any-return]


def resample_grad(
    dy: ArrayLike,
    input_shape: Sequence[int],
    scales: Sequence[float],
    *,
    mode: str = "nearest",
    rounding: str = "half_up",
    input_pixel_offsets: float | Sequence[float] = 0.5,
    output_pixel_offsets: float | Sequence[float] = -0.5,
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

    Returns:
      The gradient with respect to ``resample``'s input, with shape
      ``input_shape`` and the dtype of ``dy``.

    Raises:
      TypeError: ``dy`` is not a floating array.
      ValueError: ``input_shape``'s rank differs from ``dy``'s, or a length is
        negative, or an axis of ``input_shape`` is empty where ``dy``'s is not,
        or any argument ``resample`` would refuse.

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
    check_dtype(op, "dy", dy, allow_integers=False)
    in_shape = check_shape(op, "input_shape", input_shape, dy.ndim)
    scales_ = positive_scales(op, scales, dy.ndim)
    a = _checks.float_per_axis(op, "input_pixel_offsets", input_pixel_offsets, dy.ndim)
    b = _checks.float_per_axis(op, "output_pixel_offsets", output_pixel_offsets, dy.ndim)
    check_samples(op, in_shape, dy.shape)
    if 0 in in_shape or 0 in dy.shape:  # no output reads any input
        return jnp.zeros(in_shape, dy.dtype)
    axes = tuple(
        Axis(n, m, _sampling.Affine(s, ai, bi), mode == "linear", rounding)
        for n, m, s, ai, bi in zip(in_shape, dy.shape, scales_, a, b, strict=True)
    )
    return compiled_core(dy, axes, True)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------
# The core: a separable sparse linear map, its transpose, and the custom VJP
# --------------------------------------------------------------------------------------


def _bit_views(x: jax.Array) -> tuple[jax.Array, ...]:
    """bfloat16 as raw 16-bit patterns, for the gathers to read (other dtypes as is).

    Gathered bits are widened by ``_bits.widen``, so the reads stay at two bytes
    per element (see ``_bits``). Two views, unsigned and signed, because XLA:CPU
    evaluates a producer at most 15 times per element of a loop fusion: the 2x
    linear gradient reads its input 16 times (4 taps per axis), so through one
    view the view was materialized as a copy of the input. ``_apply_axis``
    alternates between the views, which halves the reads of each and keeps the
    whole op in one loop (twice as fast as one view, three times as fast as
    converting to float32 first, on the 2x linear gradient).
    """
    if x.dtype != jnp.bfloat16:
        return (x,)
    return _bits.words(x), lax.bitcast_convert_type(x, jnp.int16)


def _runs(plan: _sampling.Plan) -> list[range]:
    """How one axis's rows are cut into blocks: the strided rows, if worth reading
    with strided slices, and the rows on either side; else the whole axis."""
    if plan.strided is None or plan.width > _MAX_UNROLLED_TAPS:
        return [range(plan.n_rows)]
    cuts = (range(plan.first), range(plan.first, plan.stop), range(plan.stop, plan.n_rows))
    return [run for run in cuts if run]


def _pattern_rows(plan: _sampling.Plan) -> tuple[jax.Array, jax.Array]:
    """For every row of the axis: its row in ``[head; pattern; tail]`` and the offset
    added to the columns it reads there (``k * shift`` in the ``k``-th period)."""
    r = lax.iota(jnp.int32, plan.n_rows)
    k, j = jnp.divmod(r - plan.first, plan.period)
    in_head, before_tail = r < plan.first, r < plan.stop
    tail_row = plan.head.rows + plan.period + r - plan.stop
    row = jnp.where(in_head, r, jnp.where(before_tail, plan.head.rows + j, tail_row))
    offset = jnp.where(~in_head & before_tail, k * plan.shift, 0)
    return row, offset


@dataclasses.dataclass(frozen=True)
class _Slot:
    """One tap of every row of a run: ``index``, ``weight`` and ``valid`` hold one value
    per row (constants, or computed in the program). ``valid`` is None where every
    row has the tap; ``unit`` says that every weight is 1."""

    index: Any
    weight: Any
    valid: Any
    unit: bool


def _slots(plan: _sampling.Plan, run: range, dtype: Any) -> list[_Slot]:
    """The taps of the rows ``run``, in summation order.

    Listed rows (the head, the tail, an axis up to ``_LISTED_ROWS`` long, or one
    without a pattern) are constants. A longer axis with a pattern computes its
    columns from the pattern, so that the program does not grow with the axis.
    """
    if run.start > 0:
        table = plan.tail
    elif len(run) == plan.n_rows and plan.n_rows > _LISTED_ROWS and plan.period:
        return _computed_slots(plan, dtype)
    elif len(run) == plan.n_rows:
        table = plan.listed()
    else:
        table = plan.head
    return [
        _Slot(
            table.index[:, j],
            table.weights[:, j],
            None if table.valid[:, j].all() else table.valid[:, j],
            bool((table.weights[:, j] == 1).all()),
        )
        for j in range(plan.width)
    ]


def _compact(plan: _sampling.Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The index, weight and valid tables ``[head; pattern; tail]``."""
    index, weights, valid = (
        np.concatenate(parts)
        for parts in zip(*((t.index, t.weights, t.valid) for t in plan.tables()), strict=True)
    )
    return index, weights, valid


def _computed_slots(plan: _sampling.Plan, dtype: Any) -> list[_Slot]:
    """The taps of every row, computed in the program from the plan's tables."""
    index, weights, valid = _compact(plan)
    row, offset = _pattern_rows(plan)

    def per_row(values: np.ndarray) -> jax.Array:
        return jnp.asarray(values)[row]

    return [
        _Slot(
            per_row(index[:, j]) + offset,
            per_row(weights[:, j].astype(dtype)),
            None if valid[:, j].all() else per_row(valid[:, j]),
            bool((weights[:, j] == 1).all()),
        )
        for j in range(plan.width)
    ]


def _apply_axis(
    views: tuple[jax.Array, ...],
    dim: int,
    plan: _sampling.Plan,
    run: range,
    dtype: Any,
    *,
    bfloat16_bits: bool = False,
) -> jax.Array:
    """The rows ``run`` of one axis's plan, along ``dim``: a weighted sum of a few
    gathers, or of strided slices (``Plan.strided``).

    ``views`` are equal views of one array (see ``_bit_views``); the reads take
    them in turn. Every sum runs over the taps in table order, so it is the same
    on every run. ``bfloat16_bits``: the views hold bfloat16 bit patterns to widen.
    """
    reads = itertools.cycle(views)

    def along(values: Any, dtype: Any) -> Any:
        """One value per row (or one for all), shaped to broadcast along ``dim``.
        A listed mask stays a NumPy array (one constant in the program)."""
        shape = [1] * views[0].ndim
        shape[dim] = np.size(values)
        if isinstance(values, np.ndarray) and values.dtype == bool:
            return values.reshape(shape)
        return jnp.asarray(values, dtype).reshape(shape)

    def term(read: jax.Array, weight: Any, unit: bool) -> jax.Array:
        read = _bits.widen(read) if bfloat16_bits else read.astype(dtype)
        return read if unit else read * along(weight, dtype)

    def total(terms: list[jax.Array], length: int) -> jax.Array:
        if not terms:  # only padding: no tap reaches these rows
            shape = list(views[0].shape)
            shape[dim] = length
            return jnp.zeros(shape, dtype)
        return functools.reduce(operator.add, terms)

    if plan.width > _MAX_UNROLLED_TAPS:
        return _looped_axis(views[0], dim, plan, dtype, along, bfloat16_bits=bfloat16_bits)
    # Every tap reads ``step`` further on every ``repeat`` rows: a strided slice
    # with one weight, its rows then repeated in place by a broadcast, which XLA
    # fuses, where a gather loads element by element. A single row is a slice too.
    if plan.strided is not None and run == range(plan.first, plan.stop):
        repeat, step = plan.strided
        first_row = plan.pattern
    elif len(run) == 1:
        repeat, step = 1, 1
        first_row = plan.tail if run.start > 0 else plan.head
    else:
        first_row = None
    if first_row is not None:
        length = len(run) // repeat
        terms = []
        for j in range(plan.width):
            if first_row.valid[0, j]:
                first = int(first_row.index[0, j])
                last = first + step * (length - 1) + 1
                read = lax.slice_in_dim(next(reads), first, last, step, dim)
                weight = first_row.weights[0, j : j + 1]
                terms.append(term(read, weight, bool(weight[0] == 1)))
        out = total(terms, length)
        if repeat == 1:
            return out
        expanded = list(out.shape)
        expanded.insert(dim + 1, repeat)
        shape = list(out.shape)
        shape[dim] = len(run)
        return jnp.broadcast_to(jnp.expand_dims(out, dim + 1), expanded).reshape(shape)
    terms = []
    for slot in _slots(plan, run, dtype):
        read = jnp.take(next(reads), slot.index, axis=dim, mode="clip")
        terms.append(term(read, slot.weight, slot.unit))
        if slot.valid is not None:
            terms[-1] = jnp.where(along(slot.valid, bool), terms[-1], jnp.zeros((), dtype))
    return total(terms, len(run))


def _looped_axis(
    v: jax.Array,
    dim: int,
    plan: _sampling.Plan,
    dtype: Any,
    along: Callable[[Any, Any], jax.Array],
    *,
    bfloat16_bits: bool,
) -> jax.Array:
    """The whole axis, summed in a loop over the taps: the terms and their order are
    those of ``_apply_axis``, and the program's size does not depend on the count.

    A sum can round differently in its last bit from the unrolled one (the
    compiler may fuse a multiply-add in the loop body); it is the same on every
    run. Only rows with more than ``_MAX_UNROLLED_TAPS`` taps take this path.
    """
    index, weights, valid = _compact(plan)
    if plan.period:
        row, offset = _pattern_rows(plan)
    else:
        row, offset = lax.iota(jnp.int32, plan.n_rows), jnp.zeros((), jnp.int32)
    by_tap = [jnp.asarray(t.T) for t in (index, weights.astype(dtype), valid)]

    def term(j: jax.Array) -> jax.Array:
        tap_index, tap_weight, tap_valid = (t[j][row] for t in by_tap)
        read = jnp.take(v, tap_index + offset, axis=dim, mode="clip")
        read = _bits.widen(read) if bfloat16_bits else read.astype(dtype)
        return jnp.where(
            along(tap_valid, bool), read * along(tap_weight, dtype), jnp.zeros((), dtype)
        )

    total: jax.Array = lax.fori_loop(
        1, plan.width, lambda j, acc: acc + term(j), term(jnp.int32(0))
    )
    return total


def _apply(x: jax.Array, axes: tuple[Axis, ...], transpose: bool) -> jax.Array:
    """The separable map (or its transpose), one non-identity axis at a time."""
    plans = [(dim, _sampling.plan(axis, transpose)) for dim, axis in enumerate(axes)]
    plans = [(dim, plan) for dim, plan in plans if not plan.is_identity]
    # Shrinking axes first keeps the intermediate arrays small.
    plans.sort(key=lambda item: item[1].n_rows / x.shape[item[0]])
    # A pure gather (nearest forward, and a nearest gradient in which no two
    # outputs read the same input) copies or zeroes each element: exact in any
    # dtype, integers included. Anything that adds runs in float32 for half types
    # and is rounded once, inside each block's loop.
    exact = all(plan.is_exact for _, plan in plans)
    # Half types leave every block as 16-bit words. A pure gather moves words
    # throughout, because XLA:CPU's own half-type gathers are slower.
    # A sum is bitcast to words once rounded, because XLA moves a convert past the
    # concatenate that joins the blocks (which were then written and copied as
    # float32) but not a bitcast.
    words = x.dtype in (jnp.bfloat16, jnp.float16)
    src = _bits.words(x) if exact and words else x
    dtype = src.dtype if exact else _checks.compute_dtype(x.dtype)
    bits = not exact and x.dtype == jnp.bfloat16
    inputs = (src,) if exact else _bit_views(x)

    def block(
        views: tuple[jax.Array, ...],
        applied: list[tuple[int, _sampling.Plan]],
        final: bool,
        runs: dict[int, range],
    ) -> jax.Array:
        """The ``applied`` plans on ``views``, for the output rows ``runs``; rounded
        to the output dtype if ``final``."""
        for dim, plan in applied:
            # Only taps that read the input read bits; they widen to float32.
            reads_input = views is inputs
            views = (
                _apply_axis(views, dim, plan, runs[dim], dtype, bfloat16_bits=bits and reads_input),
            )
        if final and words and not exact:
            return _bits.words(views[0].astype(x.dtype))
        return views[0]

    runs = {dim: _runs(plan) for dim, plan in plans}
    blocks = math.prod(len(r) for r in runs.values())
    if blocks > _MAX_BLOCKS:
        runs = {dim: [range(plan.n_rows)] for dim, plan in plans}
        blocks = 1
    if bits and blocks > 1 and len(runs.get(x.ndim - 1, ())) <= 1:
        # Nothing is cut along the minor dimension (NHWC, say), so every block
        # would join one loop, which reads the bit views in more than 15 ways:
        # XLA would write both views out first. One axis per loop reads them (and
        # the float32 array between the loops) in fewer ways (12 for the 2x
        # linear gradient), so they stay views: about twice as fast, bitwise the
        # same.
        views = inputs
        for i, (dim, plan) in enumerate(plans):
            one_axis = functools.partial(block, views, [(dim, plan)], i == len(plans) - 1)
            views = (_tiles.tile(one_axis, [(dim, runs[dim])]),)
        return lax.bitcast_convert_type(views[0], x.dtype)
    # XLA:CPU does not fuse a concatenation along the minor (last) dimension, so
    # that one goes outermost: the blocks fuse into the concatenations along the
    # other axes and are copied once, not twice. Not for half types: one loop
    # joining several blocks reads the 16-bit view of the input in more than 15
    # ways, so XLA writes the view out first.
    nesting = sorted(runs, reverse=not words)
    every_axis = functools.partial(block, inputs, plans, True)
    out = _tiles.tile(every_axis, [(dim, runs[dim]) for dim in nesting])
    return lax.bitcast_convert_type(out, x.dtype) if words else out.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def resample_core(x: jax.Array, axes: tuple[Axis, ...], transpose: bool) -> jax.Array:
    return _apply(x, axes, transpose)


def _resample_core_fwd(
    x: jax.Array, axes: tuple[Axis, ...], transpose: bool
) -> tuple[jax.Array, None]:
    return resample_core(x, axes, transpose), None  # linear: nothing to keep


def _resample_core_bwd(
    axes: tuple[Axis, ...], transpose: bool, _: None, g: jax.Array
) -> tuple[jax.Array]:
    # resample's VJP is resample_grad and resample_grad's is resample: the set is
    # closed under differentiation.
    return (resample_core(g, axes, not transpose),)


resample_core.defvjp(_resample_core_fwd, _resample_core_bwd)

# What the public functions call: compiled once per static configuration, so that
# an eager call runs one cached program instead of dispatching op by op; under an
# outer jax.jit it is inlined like any nested jit.
compiled_core = jax.jit(resample_core, static_argnums=(1, 2))


# --------------------------------------------------------------------------------------
# Argument checks shared with resize
# --------------------------------------------------------------------------------------


def check_rank(op: str, name: str, x: jax.Array) -> None:
    if x.ndim == 0:
        raise ValueError(f"{op}: {name} must have rank >= 1, got a 0-d array")


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


def check_samples(op: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
    """An output along an axis needs an input there to sample."""
    for axis, (n, m) in enumerate(zip(in_shape, out_shape, strict=True)):
        if n == 0 and m > 0:
            raise ValueError(
                f"{op}: axis {axis} of the input is empty, so there is nothing to sample for "
                f"its {m} outputs (input shape {in_shape}, output shape {out_shape})"
            )
