"""Resample and its gradient: DirectML's RESAMPLE/RESAMPLE1/RESAMPLE2 and RESAMPLE_GRAD/GRAD1.

Resampling is linear and separable: along each axis the output is a sparse matrix
``W`` (``n_out x n_in``) times the input, and the gradient is ``W.T`` times the
incoming gradient. Both are computed the same way, in *gather form*: every row of
the matrix (an output element for the forward, an input element for the gradient)
lists its few non-zero columns in a fixed order, and the row's value is the
weighted sum of the gathered entries, summed in that order. The tables are built
once on the host from static shapes. The gradient is therefore a gather, not a
scatter-add: no atomics, bitwise reproducible, and at memory speed on XLA:CPU,
where a scatter-add is 20x slower.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from jaxgrad import _bits, _checks, _tiles

MODES = ("nearest", "linear")
ROUNDINGS = ("half_up", "down", "up")

# Cutting an axis into strided and edge runs (`_Taps.runs`): the shortest middle
# run worth a block of its own, the most times a strided row is repeated in place
# (8x nearest upsampling is still faster repeated than gathered), and the most
# blocks an op is cut into.
_MIN_STRIDED_ROWS = 8
_MAX_REPEAT = 8
_MAX_BLOCKS = 27


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
        Axis(n, _dml_coordinates(m, s, ai, bi), mode == "linear", rounding)
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
        Axis(n, _dml_coordinates(m, s, ai, bi), mode == "linear", rounding)
        for n, m, s, ai, bi in zip(in_shape, dy.shape, scales_, a, b, strict=True)
    )
    return compiled_core(dy, axes, True)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------
# The core: a separable sparse linear map, its transpose, and the custom VJP
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Axis:
    """How one axis is resampled: ``n_in`` inputs sampled at ``coords`` (one per output).

    Hashable, so it can be a static argument; ``resample`` and ``resize`` differ only
    in how they compute the coordinates.
    """

    n_in: int
    coords: tuple[float, ...]
    linear: bool
    rounding: str

    @property
    def n_out(self) -> int:
        return len(self.coords)


@dataclasses.dataclass(frozen=True)
class _Taps:
    """One axis's sparse matrix by rows: row ``r`` is ``sum_k weights[r, k] * v[index[r, k]]``.

    Rows with fewer entries than ``K`` are padded with ``valid`` False. Entries of a
    row are in increasing column order, which fixes the order of summation.
    """

    index: np.ndarray  # [rows, K] int32
    weights: np.ndarray  # [rows, K] float64
    valid: np.ndarray  # [rows, K] bool
    n_cols: int

    def rows(self, run: range) -> _Taps:
        """The table of the rows ``run`` only."""
        part = slice(run.start, run.stop)
        return _Taps(self.index[part], self.weights[part], self.valid[part], self.n_cols)

    def _same_as_previous(self) -> np.ndarray:
        """Per row after the first: whether it reads exactly what the row before reads."""
        return np.asarray(
            (self.index[1:] == self.index[:-1]).all(axis=1)
            & (self.weights[1:] == self.weights[:-1]).all(axis=1)
            & (self.valid[1:] == self.valid[:-1]).all(axis=1)
        )

    def _continues(self, lag: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row ``r >= lag``: the step of its columns from row ``r - lag``, and
        whether it is that row shifted by one positive step, weights equal."""
        shift = self.index[lag:] - self.index[:-lag]
        steps = shift[:, 0]
        continues = (
            (shift == steps[:, None]).all(axis=1)
            & (steps > 0)
            & (self.weights[lag:] == self.weights[:-lag]).all(axis=1)
            & (self.valid[lag:] == self.valid[:-lag]).all(axis=1)
        )
        return steps, continues

    def _longest_strided_run(self, repeat: int) -> tuple[int, int, int]:
        """The longest run of rows made of groups of ``repeat`` equal rows, each group
        reading the group before shifted by one step: ``(first, stop, step)``."""
        n = len(self.index)
        same = self._same_as_previous()  # same[r - 1]: row r reads what row r - 1 reads
        steps, continues = self._continues(repeat)  # about row r: index r - repeat
        best = (0, 0, 1)
        for align in range(min(repeat, n)):
            starts = np.arange(align, n - repeat + 1, repeat)  # the groups' first rows
            whole = same[starts[:, None] + np.arange(repeat - 1)].all(axis=1)
            # Link k joins groups k and k + 1 when both are whole and the second
            # reads the first's columns shifted by a step; the longest stretch of
            # links with one step is the longest run.
            joins = starts[1:] - repeat
            steps_of_links = np.where(whole[:-1] & whole[1:] & continues[joins], steps[joins], 0)
            first, stop = _longest_positive_stretch(steps_of_links)
            if stop > first:
                run = (int(starts[first]), int(starts[stop]) + repeat, int(steps_of_links[first]))
            elif whole.any():  # no links: one group alone
                row = int(starts[whole.argmax()])
                run = (row, row + repeat, 1)
            else:
                continue
            if run[1] - run[0] > best[1] - best[0]:
                best = run
        return best

    def stride(self) -> tuple[int, int] | None:
        """``(repeat, step)`` when all the rows come in groups of ``repeat`` equal rows,
        each group reading the columns of the group before shifted by ``step``, with
        the same weights. Each tap is then a strided slice with one weight, its rows
        repeated ``repeat`` times in place. Else None."""
        n = len(self.index)
        for repeat in range(1, min(n, _MAX_REPEAT) + 1):
            first, stop, step = self._longest_strided_run(repeat)
            if (first, stop) == (0, n):
                return repeat, step
        return None

    def runs(self) -> list[range]:
        """The rows cut into at most three runs: the longest strided run (``stride``),
        with the smallest repeat that gives it, and the edge rows around it. If that
        run is short, or holds less than half of the rows, all the rows are one run."""
        n = len(self.index)
        longest = max(
            (self._longest_strided_run(repeat) for repeat in range(1, min(n, _MAX_REPEAT) + 1)),
            key=lambda run: run[1] - run[0],
            default=(0, 0, 1),
        )
        first, stop, _ = longest
        if stop - first < max(_MIN_STRIDED_ROWS, n / 2):
            return [range(n)]
        return [run for run in (range(first), range(first, stop), range(stop, n)) if run]

    @property
    def is_identity(self) -> bool:
        rows = self.index.shape[0]
        return (
            rows == self.n_cols
            and self.index.shape[1] == 1
            and bool(self.valid.all())
            and bool((self.weights == 1).all())
            and np.array_equal(self.index[:, 0], np.arange(rows))
        )


def _longest_positive_stretch(values: np.ndarray) -> tuple[int, int]:
    """``(i, j)``: the longest stretch ``values[i:j]`` of one positive value ((0, 0) if
    there is none)."""
    if not len(values):
        return 0, 0
    cuts = np.flatnonzero(np.diff(values)) + 1
    firsts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [len(values)]])
    lengths = np.where(values[firsts] > 0, stops - firsts, 0)
    k = int(lengths.argmax())
    return (int(firsts[k]), int(stops[k])) if lengths[k] else (0, 0)


def _dml_coordinates(n_out: int, scale: float, a: float, b: float) -> tuple[float, ...]:
    """The coordinate ``u(o) = (o - b) / s - a`` for every output index, in float64."""
    o = np.arange(n_out, dtype=np.float64)
    return tuple(((o - b) / scale - a).tolist())


def _round(u: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "half_up":
        return np.asarray(np.floor(u + 0.5))
    if rounding == "down":
        return np.asarray(np.floor(u))
    return np.asarray(np.ceil(u))


@functools.lru_cache(maxsize=256)
def _entries(axis: Axis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries ``(row=o, col=i, weight)`` of the axis's ``n_out x n_in`` matrix.

    Taps that clamp onto the same input are merged (their weights add up, in
    float64), and taps of weight exactly 0 are dropped: they contribute nothing,
    and reading them would turn an ``inf`` there into a ``NaN``.
    """
    u = np.asarray(axis.coords, dtype=np.float64)
    rows = np.arange(axis.n_out)
    if axis.linear:
        i0 = np.floor(u)
        t = u - i0
        rows = np.concatenate([rows, rows])
        cols = np.concatenate([i0, i0 + 1])
        weights = np.concatenate([1 - t, t])
    else:
        cols = _round(u, axis.rounding)
        weights = np.ones(axis.n_out)
    cols = np.clip(cols, 0, axis.n_in - 1).astype(np.int64)
    keys, inverse = np.unique(rows * axis.n_in + cols, return_inverse=True)
    merged = np.zeros(len(keys))
    np.add.at(merged, inverse, weights)
    keep = merged != 0
    keys, merged = keys[keep], merged[keep]
    return keys // axis.n_in, keys % axis.n_in, merged


def _by_rows(
    rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, n_rows: int, n_cols: int
) -> _Taps:
    """Packs sparse entries, sorted by (row, col), into padded per-row tap tables."""
    counts = np.bincount(rows, minlength=n_rows)
    k = max(1, int(counts.max(initial=0)))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(rows)) - starts[rows]
    index = np.zeros((n_rows, k), np.int32)
    table = np.zeros((n_rows, k), np.float64)
    valid = np.zeros((n_rows, k), bool)
    index[rows, slot] = cols
    table[rows, slot] = weights
    valid[rows, slot] = True
    return _Taps(index, table, valid, n_cols)


@functools.lru_cache(maxsize=256)
def _taps(axis: Axis, transpose: bool) -> _Taps:
    """The rows of the axis's matrix (forward) or of its transpose (gradient)."""
    rows, cols, weights = _entries(axis)
    if not transpose:
        return _by_rows(rows, cols, weights, axis.n_out, axis.n_in)
    order = np.lexsort((rows, cols))  # by input, then by output: the summation order
    return _by_rows(cols[order], rows[order], weights[order], axis.n_in, axis.n_out)


def _bit_views(x: jax.Array) -> tuple[jax.Array, ...]:
    """bfloat16 as raw 16-bit patterns, for the gathers to read (other dtypes as is).

    Gathered bits are widened by ``_bits.widen``, so the reads stay at two bytes
    per element (see ``_bits``). Two views, unsigned and signed, because XLA:CPU
    evaluates a producer at most 15 times per element of a loop fusion: the 2x
    linear gradient reads its input 16 times (4 taps per axis), so through one
    view the view was materialized as a copy of the input. ``_apply_taps``
    alternates between the views, which halves the reads of each and keeps the
    whole op in one loop (twice as fast as one view, three times as fast as
    converting to float32 first, on the 2x linear gradient).
    """
    if x.dtype != jnp.bfloat16:
        return (x,)
    return _bits.words(x), lax.bitcast_convert_type(x, jnp.int16)


def _apply_taps(
    views: tuple[jax.Array, ...],
    dim: int,
    taps: _Taps,
    dtype: Any,
    *,
    bfloat16_bits: bool = False,
) -> jax.Array:
    """Applies one axis's tap tables along ``dim``: a weighted sum of a few gathers,
    or of strided slices (``_Taps.stride``).

    ``views`` are equal views of one array (see ``_bit_views``); the reads take
    them in turn. Every sum runs over the taps in table order, so it is the same
    on every run. ``bfloat16_bits``: the views hold bfloat16 bit patterns to widen.
    """
    rows, k = taps.index.shape
    reads = itertools.cycle(views)

    def term(read: jax.Array, weight: np.ndarray) -> jax.Array:
        read = _bits.widen(read) if bfloat16_bits else read.astype(dtype)
        if (weight == 1).all():
            return read
        shape = [1] * read.ndim
        shape[dim] = weight.size
        return read * jnp.asarray(weight, dtype).reshape(shape)

    def total(terms: list[jax.Array], length: int) -> jax.Array:
        if not terms:  # only padding: no tap reaches these rows
            shape = list(views[0].shape)
            shape[dim] = length
            return jnp.zeros(shape, dtype)
        return functools.reduce(operator.add, terms)

    found = taps.stride()
    if found is None:
        terms = []
        for j in range(k):
            read = jnp.take(next(reads), taps.index[:, j], axis=dim, mode="clip")
            terms.append(term(read, taps.weights[:, j]))
            if not taps.valid[:, j].all():
                shape = [1] * read.ndim
                shape[dim] = rows
                valid = taps.valid[:, j].reshape(shape)
                terms[-1] = jnp.where(valid, terms[-1], jnp.zeros((), dtype))
        return total(terms, rows)
    # Every tap reads ``step`` further on every ``repeat`` rows: a strided slice
    # with one weight, its rows then repeated in place by a broadcast, which XLA
    # fuses, where a gather loads element by element.
    repeat, step = found
    length = rows // repeat
    terms = []
    for j in range(k):
        if taps.valid[0, j]:
            first = int(taps.index[0, j])
            read = lax.slice_in_dim(next(reads), first, first + step * (length - 1) + 1, step, dim)
            terms.append(term(read, taps.weights[0, j : j + 1]))
    out = total(terms, length)
    if repeat == 1:
        return out
    expanded = list(out.shape)
    expanded.insert(dim + 1, repeat)
    shape = list(out.shape)
    shape[dim] = rows
    return jnp.broadcast_to(jnp.expand_dims(out, dim + 1), expanded).reshape(shape)


def _apply(x: jax.Array, axes: tuple[Axis, ...], transpose: bool) -> jax.Array:
    """The separable map (or its transpose), one non-identity axis at a time."""
    tables = [(dim, _taps(axis, transpose)) for dim, axis in enumerate(axes)]
    tables = [(dim, taps) for dim, taps in tables if not taps.is_identity]
    # Shrinking axes first keeps the intermediate arrays small.
    tables.sort(key=lambda item: item[1].index.shape[0] / x.shape[item[0]])
    # A pure gather (nearest forward, and a nearest gradient in which no two
    # outputs read the same input) copies or zeroes each element: exact in any
    # dtype, integers included. Anything that adds runs in float32 for half types
    # and is rounded once, inside each block's loop.
    exact = all(
        taps.index.shape[1] == 1 and (taps.weights[taps.valid] == 1).all() for _, taps in tables
    )
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
        applied: list[tuple[int, _Taps]],
        final: bool,
        runs: dict[int, range],
    ) -> jax.Array:
        """The ``applied`` tables on ``views``, for the output rows ``runs``; rounded
        to the output dtype if ``final``."""
        for dim, taps in applied:
            # Only taps that read the input read bits; they widen to float32.
            reads_input = views is inputs
            part = taps.rows(runs[dim])
            views = (_apply_taps(views, dim, part, dtype, bfloat16_bits=bits and reads_input),)
        if final and words and not exact:
            return _bits.words(views[0].astype(x.dtype))
        return views[0]

    runs = {dim: taps.runs() for dim, taps in tables}
    blocks = math.prod(len(r) for r in runs.values())
    if blocks > _MAX_BLOCKS:
        runs = {dim: [range(len(taps.index))] for dim, taps in tables}
        blocks = 1
    if bits and blocks > 1 and len(runs.get(x.ndim - 1, ())) <= 1:
        # Nothing is cut along the minor dimension (NHWC, say), so every block
        # would join one loop, which reads the bit views in more than 15 ways:
        # XLA would write both views out first. One axis per loop reads them (and
        # the float32 array between the loops) in fewer ways (12 for the 2x
        # linear gradient), so they stay views: about twice as fast, bitwise the
        # same.
        views = inputs
        for i, (dim, taps) in enumerate(tables):
            one_axis = functools.partial(block, views, [(dim, taps)], i == len(tables) - 1)
            views = (_tiles.tile(one_axis, [(dim, runs[dim])]),)
        return lax.bitcast_convert_type(views[0], x.dtype)
    # XLA:CPU does not fuse a concatenation along the minor (last) dimension, so
    # that one goes outermost: the blocks fuse into the concatenations along the
    # other axes and are copied once, not twice. Not for half types: one loop
    # joining several blocks reads the 16-bit view of the input in more than 15
    # ways, so XLA writes the view out first.
    nesting = sorted(runs, reverse=not words)
    every_axis = functools.partial(block, inputs, tables, True)
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
