"""Resample's arithmetic as jnp/lax operations: XLA's program, on every backend.

Each axis's rows come from its plan (``_plan``): strided runs are read with
strided slices, short axes gather with constant index tables, long ones compute
their indices from the plan's pattern, and rows with many taps sum in a loop.
Half types are read as 16-bit words and summed in float32. The block structure
(which rows are cut out and joined back) is tuned for XLA:CPU.

The axes are applied one at a time. Where XLA:GPU would then write the result
along one axis and read it back for the next (``one_pass_on_gpus`` says where it
does not), GPUs read every axis's taps in one expression instead
(``_apply_jointly``), which XLA:GPU compiles into one pass.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgrad import _bits, _checks, _tiles
from jaxgrad._resample import _plan
from jaxgrad._resample._plan import Axis

# The most blocks an op is cut into (runs per axis multiplied); beyond, each axis is
# applied whole.
_MAX_BLOCKS = 27
# Rows with more taps than this (the gradient of a large upsampling: each input
# sums every output it fed) are summed in a loop over the taps, so that the
# program does not grow with the scale.
_MAX_UNROLLED_TAPS = 16
# The most terms (one tap of every resampled axis each) that the joint form on
# GPUs sums per output element; beyond, the axes are applied one at a time.
_MAX_JOINT_TERMS = 64
# The platforms whose XLA gets the joint form where it applies.
_GPU_PLATFORMS = ("cuda", "rocm")


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


def _runs(plan: _plan.Plan) -> list[range]:
    """How one axis's rows are cut into blocks: the strided rows, if worth reading
    with strided slices, and the rows on either side; else the whole axis."""
    if plan.strided is None or plan.width > _MAX_UNROLLED_TAPS:
        return [range(plan.n_rows)]
    cuts = (range(plan.first), range(plan.first, plan.stop), range(plan.stop, plan.n_rows))
    return [run for run in cuts if run]


def _along(values: Any, dtype: Any, *, dim: int, ndim: int) -> Any:
    """One value per row (or one for all), shaped to broadcast along ``dim`` of an
    ``ndim``-D array. A listed mask stays a NumPy array (one constant in the
    program)."""
    shape = [1] * ndim
    shape[dim] = np.size(values)
    if isinstance(values, np.ndarray) and values.dtype == bool:
        return values.reshape(shape)
    return jnp.asarray(values, dtype).reshape(shape)


@dataclasses.dataclass(frozen=True)
class _Slot:
    """One tap of every row of a run: ``index``, ``weight`` and ``valid`` hold one value
    per row (constants, or computed in the program). ``valid`` is None where every
    row has the tap; ``unit`` says that every weight is 1."""

    index: Any
    weight: Any
    valid: Any
    unit: bool


def _slots(plan: _plan.Plan, run: range, dtype: Any) -> list[_Slot]:
    """The taps of the rows ``run``, in summation order.

    Listed rows (the head, the tail, an axis up to ``_plan.LISTED_ROWS`` long, or one
    without a pattern) are constants: XLA:CPU runs a gather with constant indices
    several times faster than one whose indices the program computes. A longer
    axis with a pattern computes its columns from the pattern, so that the program
    does not grow with the axis.
    """
    if run.start > 0:
        table = plan.tail
    elif len(run) == plan.n_rows and plan.n_rows > _plan.LISTED_ROWS and plan.period:
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


def _computed_slots(plan: _plan.Plan, dtype: Any) -> list[_Slot]:
    """The taps of every row, computed in the program from the plan's tables."""
    compact = plan.compact()
    index, weights, valid = compact.index, compact.weights, compact.valid
    row, offset = _plan.pattern_rows(plan)

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
    plan: _plan.Plan,
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
    along = functools.partial(_along, dim=dim, ndim=views[0].ndim)

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
    plan: _plan.Plan,
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
    compact = plan.compact()
    index, weights, valid = compact.index, compact.weights, compact.valid
    if plan.period:
        row, offset = _plan.pattern_rows(plan)
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


def apply(x: jax.Array, axes: tuple[Axis, ...], transpose: bool) -> jax.Array:
    """The separable map (or its transpose): one axis at a time, but on GPUs every
    axis in one expression where XLA:GPU would take a pass per axis."""
    plans = [(dim, _plan.plan(axis, transpose)) for dim, axis in enumerate(axes)]
    plans = [(dim, plan) for dim, plan in plans if not plan.is_identity]
    by_axis = functools.partial(_apply_by_axis, plans=plans)
    if one_pass_on_gpus(axes, transpose) or not _joint_fits(plans):
        return by_axis(x)
    jointly = functools.partial(_apply_jointly, plans=plans)
    gpus = dict.fromkeys(_GPU_PLATFORMS, jointly)
    result: jax.Array = lax.platform_dependent(x, **gpus, default=by_axis)
    return result


def one_pass_on_gpus(axes: tuple[Axis, ...], transpose: bool) -> bool:
    """Whether XLA:GPU compiles the map (or its transpose, the gradient) applied
    one axis at a time into one pass, which reads the input and writes the output
    once, as a copy does: one axis resampled; a linear forward that shrinks every
    axis it resamples; a linear gradient of two axes, each by 2 or by 1/k; and
    nearest neighbour (but for a gradient at 1/3x by 2x, 1.40x the bytes, which
    is left as it is). Elsewhere (a 2x forward, a 1.7x gradient, three axes, ...)
    it writes the result along one axis and reads it back for the next, moving
    1.5-2.8x the bytes. (Read off XLA:GPU's programs for an H100 by
    ``benchmarks/xla_gpu_report.py --sections scales``.)"""
    moved = [axis for axis in axes if not _plan.plan(axis, transpose).is_identity]
    if len(moved) <= 1 or not any(axis.linear for axis in moved):
        return True
    if not transpose:
        return _plan.shrinks_every_axis(moved)

    def doubled_or_divided(axis: Axis) -> bool:
        period = axis.coordinates.period  # outputs : inputs
        return period is not None and (period == (2, 1) or period[0] == 1)

    return len(moved) == 2 and all(doubled_or_divided(axis) for axis in moved)


def _joint_fits(plans: list[tuple[int, _plan.Plan]]) -> bool:
    """Whether every axis's taps can be read in one expression: few enough taps
    per row on each axis, and of tap combinations per output element."""
    widths = [plan.width for _, plan in plans]
    return max(widths) <= _MAX_UNROLLED_TAPS and math.prod(widths) <= _MAX_JOINT_TERMS


def _apply_jointly(x: jax.Array, plans: list[tuple[int, _plan.Plan]]) -> jax.Array:
    """Every axis in one expression, for XLA:GPU: each output element is the sum
    over the first axis's taps of its weight times the sum over the next axis's
    taps, and so on (the kernel's order), of the input element the taps read; in
    float32 for half types (float64 for float64), rounded once. Every term
    gathers from the input itself, so XLA:GPU fuses them all into one loop that
    reads the input and writes the output once; applied one axis at a time, the
    result along one axis would be written out and read back."""
    dtype = _checks.compute_dtype(x.dtype)

    def total(read: jax.Array, remaining: list[tuple[int, _plan.Plan]]) -> jax.Array:
        """The sum over the taps of the ``remaining`` axes of ``read``."""
        if not remaining:
            return read
        (dim, plan), rest = remaining[0], remaining[1:]
        along = functools.partial(_along, dim=dim, ndim=x.ndim)
        terms = []
        for slot in _slots(plan, range(plan.n_rows), dtype):
            term = total(jnp.take(read, slot.index, axis=dim, mode="clip"), rest)
            term = term if slot.unit else term * along(slot.weight, dtype)
            if slot.valid is not None:
                term = jnp.where(along(slot.valid, bool), term, jnp.zeros((), dtype))
            terms.append(term)
        return functools.reduce(operator.add, terms)

    return total(x.astype(dtype), plans).astype(x.dtype)


def _apply_by_axis(x: jax.Array, plans: list[tuple[int, _plan.Plan]]) -> jax.Array:
    """The ``plans`` (the non-identity axes), one axis at a time, in blocks."""
    plans = list(plans)
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
        applied: list[tuple[int, _plan.Plan]],
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
