"""Where resample reads: one axis's sparse matrix, built on the host in float64.

Along one axis, resample is a sparse ``n_out x n_in`` matrix ``W`` and its gradient
is ``W.T``. Both are applied in *gather form*: each row (an output of the forward,
an input of the gradient) lists its few non-zero columns in increasing order, and
its value is the weighted sum of the entries it gathers, summed in that order.

Most scales are ratios ``P / Q`` of small integers (2, 1/2, 3/2, 1.37 = 137/100),
and then the matrix repeats: output ``o + P`` reads what output ``o`` reads, ``Q``
inputs further on, with the same weights; input ``i + Q`` is read by the outputs
that read ``i``, ``P`` outputs further on. A `Plan` keeps one period of rows and the
rows at the two ends, where clamping breaks the pattern; the program computes the
columns of every other row from the period with integer arithmetic. Host work,
program size and cached memory then depend on ``P`` and ``Q``, not on the length of
the axis. Coordinates are defined to repeat exactly, ``u(kP + j) = u(j) + kQ``:
every period gets the weights of the first, computed in float64.

An axis whose scale is no such ratio (or whose period would be longer than
``MAX_PERIOD``) keeps one table row per output, as long as the axis.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import fractions
import math
import threading
from collections.abc import Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MAX_PERIOD = 4096
# Axes up to this many rows are listed in full as constants of the program (at
# most a few hundred KiB); longer ones with a pattern have their rows computed in
# the program from it (``pattern_rows``), so that the program does not grow with
# the axis.
LISTED_ROWS = 4096

# A run of rows is cut out of an axis to be read with strided slices (one per tap,
# then repeated in place) when it is at least this long and holds half of the rows
# or more; a shorter one would leave most rows in gathered edge blocks and cost a
# concatenation. Strided reads are kept for groups of up to _MAX_REPEAT equal rows:
# 8x nearest upsampling is still faster repeated than gathered.
_MIN_STRIDED_ROWS = 8
_MAX_REPEAT = 8


class Coordinates(Protocol):
    """An axis's sampling positions: ``at(o)``, the input coordinate of outputs ``o``.

    Implementations are small frozen dataclasses (hashable: they are part of a
    static argument). ``period`` is ``(P, Q)`` when ``at`` is affine with slope
    ``Q / P``, or None.
    """

    def at(self, o: np.ndarray) -> np.ndarray: ...

    @property
    def period(self) -> tuple[int, int] | None: ...


def period_of(outputs_per_input: float) -> tuple[int, int] | None:
    """``(P, Q)`` with ``P / Q == outputs_per_input`` in float64, both at most
    ``MAX_PERIOD``; None when there is no such ratio."""
    if not math.isfinite(outputs_per_input) or outputs_per_input <= 0:
        return None
    ratio = fractions.Fraction(outputs_per_input).limit_denominator(MAX_PERIOD)
    p, q = ratio.numerator, ratio.denominator
    if p > MAX_PERIOD or p / q != outputs_per_input:
        return None
    return p, q


@dataclasses.dataclass(frozen=True)
class Affine:
    """DirectML's coordinates: ``u(o) = (o - b) / s - a``."""

    scale: float
    a: float
    b: float

    def at(self, o: np.ndarray) -> np.ndarray:
        return np.asarray((o - self.b) / self.scale - self.a)

    @property
    def period(self) -> tuple[int, int] | None:
        return period_of(self.scale)


@dataclasses.dataclass(frozen=True)
class Axis:
    """How one axis is resampled: ``n_out`` outputs read ``n_in`` inputs at ``coordinates``.

    Hashable and small (its size does not depend on the lengths), so that it can be
    a static argument and a cache key.
    """

    n_in: int
    n_out: int
    coordinates: Coordinates
    linear: bool
    rounding: str


# --------------------------------------------------------------------------------------
# Entries of the matrix
# --------------------------------------------------------------------------------------


def _split_coordinates(axis: Axis, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(base, rest)`` with ``u(o) = base + rest`` exactly: ``base`` a whole number of
    periods' inputs (int64), ``rest`` the coordinate in the first period (float64)."""
    period = axis.coordinates.period
    if period is None:
        return np.zeros(o.shape, np.int64), axis.coordinates.at(o.astype(np.float64))
    p, q = period
    k, j = np.divmod(o, p)
    return k * q, axis.coordinates.at(j.astype(np.float64))


def rounded(u: np.ndarray, rounding: str) -> np.ndarray:
    """Nearest neighbour's input coordinates ``u`` rounded to whole inputs (float64)."""
    if rounding == "half_up":
        return np.asarray(np.floor(u + 0.5))
    if rounding == "down":
        return np.asarray(np.floor(u))
    return np.asarray(np.ceil(u))


def _raw_taps(axis: Axis, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per output: the columns of its taps before clamping, ``[len(o), taps]`` int64,
    and their weights (float64; a linear tap may weigh exactly 0)."""
    base, rest = _split_coordinates(axis, o)
    if axis.linear:
        floor = np.floor(rest)
        t = rest - floor
        cols = (base + floor.astype(np.int64))[:, None] + np.arange(2)
        return cols, np.stack([1 - t, t], axis=1)
    cols = base + rounded(rest, axis.rounding).astype(np.int64)
    return cols[:, None], np.ones((len(o), 1))


def _reach(axis: Axis, o: int) -> tuple[int, int]:
    """The lowest and highest column output ``o`` reads with a non-zero weight, before
    clamping. Both grow with ``o`` (the coordinates do)."""
    cols, weights = _raw_taps(axis, np.array([o]))
    read = cols[0][weights[0] != 0]
    return int(read.min()), int(read.max())


def _entries(axis: Axis, o: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries ``(row=o, col=i, weight)`` of the outputs ``o``, sorted.

    Taps that clamp onto the same input are merged (their weights add up, in
    float64), and taps of weight exactly 0 are dropped: they contribute nothing,
    and reading them would turn an ``inf`` there into a ``NaN``.
    """
    cols, weights = _raw_taps(axis, o)
    rows = np.repeat(o, cols.shape[1])
    cols = np.clip(cols.reshape(-1), 0, axis.n_in - 1)
    keys, inverse = np.unique(rows * axis.n_in + cols, return_inverse=True)
    merged = np.zeros(len(keys))
    np.add.at(merged, inverse, weights.reshape(-1))
    keep = merged != 0
    keys, merged = keys[keep], merged[keep]
    return keys // axis.n_in, keys % axis.n_in, merged


# --------------------------------------------------------------------------------------
# Tables: rows of the matrix (forward) or of its transpose (gradient)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
    """Some consecutive rows of a matrix: row ``r`` is
    ``sum_k weights[r, k] * v[index[r, k]]``.

    Rows with fewer entries than ``K`` are padded with ``valid`` False. Entries of
    a row are in increasing column order, which fixes the order of summation.
    """

    index: np.ndarray  # [rows, K] int32
    weights: np.ndarray  # [rows, K] float64
    valid: np.ndarray  # [rows, K] bool

    @property
    def rows(self) -> int:
        return int(self.index.shape[0])

    @property
    def width(self) -> int:
        return int(self.index.shape[1])

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.weights.nbytes + self.valid.nbytes

    def widened(self, width: int) -> Table:
        """The same rows padded to ``width`` entries."""
        pad = ((0, 0), (0, width - self.width))
        return Table(np.pad(self.index, pad), np.pad(self.weights, pad), np.pad(self.valid, pad))

    def equal_rows(self, start: int, count: int) -> bool:
        """Whether rows ``start .. start + count`` all read the same entries."""
        part = slice(start, start + count)
        return all(
            bool((array[part] == array[start]).all())
            for array in (self.index, self.weights, self.valid)
        )


def _pack(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, n_rows: int) -> Table:
    """Packs entries sorted by (row, col), rows counted from 0, into padded rows."""
    counts = np.bincount(rows, minlength=n_rows)
    k = int(np.max(counts, initial=1))  # one entry wide at least, where no row has any
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(rows)) - starts[rows]
    index = np.zeros((n_rows, k), np.int32)
    table = np.zeros((n_rows, k), np.float64)
    valid = np.zeros((n_rows, k), bool)
    index[rows, slot] = cols
    table[rows, slot] = weights
    valid[rows, slot] = True
    return Table(index, table, valid)


def _output_rows(axis: Axis, start: int, stop: int) -> Table:
    """Rows ``start .. stop`` of the matrix: what those outputs read."""
    rows, cols, weights = _entries(axis, np.arange(start, stop))
    return _pack(rows - start, cols, weights, stop - start)


def _input_rows(axis: Axis, start: int, stop: int) -> Table:
    """Rows ``start .. stop`` of the transpose: the outputs that read those inputs."""
    last = axis.n_in - 1
    outputs = range(axis.n_out)
    # The readers are a run of outputs: the clamped reach grows with the output.
    first = bisect.bisect_left(outputs, start, key=lambda o: min(max(_reach(axis, o)[1], 0), last))
    after = bisect.bisect_right(
        outputs, stop - 1, key=lambda o: max(min(_reach(axis, o)[0], last), 0)
    )
    rows, cols, weights = _entries(axis, np.arange(first, after))
    keep = (cols >= start) & (cols < stop)
    rows, cols, weights = rows[keep], cols[keep], weights[keep]
    order = np.lexsort((rows, cols))  # by input, then by output: the summation order
    return _pack(cols[order] - start, rows[order], weights[order], stop - start)


def _clean_rows(axis: Axis, transpose: bool) -> range:
    """The rows that follow the pattern: where no tap is clamped.

    Forward: outputs whose taps all lie inside the input. Transpose: inputs that
    no clamped tap lands on (clamping only lands on the first and the last input)
    and whose readers all exist (outputs before 0 or from ``n_out`` on, continuing
    the pattern, would read them).
    """
    if not transpose:
        outputs = range(axis.n_out)
        start = bisect.bisect_left(outputs, 0, key=lambda o: _reach(axis, o)[0])
        stop = bisect.bisect_right(outputs, axis.n_in - 1, key=lambda o: _reach(axis, o)[1])
        return range(start, max(start, stop))
    low = _reach(axis, -1)[1] + 1  # read by output -1 below this
    if _reach(axis, 0)[0] < 0:
        low = max(low, 1)
    high = _reach(axis, axis.n_out)[0]  # read by output n_out from here
    if _reach(axis, axis.n_out - 1)[1] > axis.n_in - 1:
        high = min(high, axis.n_in - 1)
    return range(max(low, 0), max(min(high, axis.n_in), max(low, 0)))


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """The rows of one axis's matrix (or its transpose), by pattern.

    Rows ``[first, stop)`` repeat every ``period`` rows: row ``first + k * period +
    j`` reads the columns of ``pattern`` row ``j`` plus ``k * shift``, with its
    weights. The other rows are listed: ``head`` holds rows ``[0, first)`` and
    ``tail`` rows ``[stop, n_rows)``. Without a pattern, ``head`` holds every row.
    The three tables have the same width.

    ``strided`` is ``(repeat, step)`` when the repeating rows come in groups of
    ``repeat`` equal rows and are worth reading with strided slices, else None.
    """

    n_rows: int
    n_cols: int
    head: Table
    pattern: Table
    tail: Table
    first: int
    stop: int
    shift: int
    strided: tuple[int, int] | None

    @property
    def period(self) -> int:
        return self.pattern.rows

    @property
    def nbytes(self) -> int:
        return self.head.nbytes + self.pattern.nbytes + self.tail.nbytes

    def tables(self) -> tuple[Table, ...]:
        return self.head, self.pattern, self.tail

    @property
    def width(self) -> int:
        return self.head.width

    def listed(self) -> Table:
        """Every row, listed: the head, the pattern repeated, the tail."""
        periods = (self.stop - self.first) // self.period if self.period else 0
        k = np.repeat(np.arange(periods), self.period)[:, None]
        p = self.pattern
        repeated = [
            p.index[np.arange(periods * self.period) % max(self.period, 1)] + k * self.shift
        ]
        index = np.concatenate([self.head.index, *repeated, self.tail.index])
        tiled = [np.tile(a, (periods, 1)) for a in (p.weights, p.valid)]
        weights = np.concatenate([self.head.weights, tiled[0], self.tail.weights])
        valid = np.concatenate([self.head.valid, tiled[1], self.tail.valid])
        return Table((index * valid).astype(np.int32), weights, valid)

    def compact(self) -> Table:
        """The head, one period of the pattern and the tail, one after another:
        ``pattern_rows`` says which of these rows each row of the axis reads."""
        index, weights, valid = (
            np.concatenate(parts)
            for parts in zip(*((t.index, t.weights, t.valid) for t in self.tables()), strict=True)
        )
        return Table(index, weights, valid)

    @property
    def is_identity(self) -> bool:
        """Every row ``r`` is column ``r`` with weight 1."""
        if self.n_rows != self.n_cols or self.width != 1:
            return False
        if not all(bool(t.valid.all()) and bool((t.weights == 1).all()) for t in self.tables()):
            return False
        pattern_ok = self.period == 0 or (
            self.shift == self.period
            and np.array_equal(
                self.pattern.index[:, 0], np.arange(self.first, self.first + self.period)
            )
        )
        return (
            pattern_ok
            and np.array_equal(self.head.index[:, 0], np.arange(self.first))
            and np.array_equal(self.tail.index[:, 0], np.arange(self.stop, self.n_rows))
        )

    @property
    def is_exact(self) -> bool:
        """Every row reads one column with weight 1: a pure gather (exact in any dtype)."""
        return self.width == 1 and all(bool((t.weights[t.valid] == 1).all()) for t in self.tables())


def _strided_start(table: Table, period: int) -> int | None:
    """The first row ``d`` of ``table`` (``2 * period`` rows of the pattern) from
    which ``period`` rows are all equal, if any: a start for strided reads."""
    if period == 1:
        return 0
    if period > _MAX_REPEAT:
        return None
    for d in range(period):
        if table.equal_rows(d, period):
            return d
    return None


def _listed(axis: Axis, transpose: bool) -> Plan:
    """A plan without a pattern: every row listed."""
    n_rows, n_cols = (axis.n_in, axis.n_out) if transpose else (axis.n_out, axis.n_in)
    whole = (_input_rows if transpose else _output_rows)(axis, 0, n_rows)
    empty = Table(whole.index[:0], whole.weights[:0], whole.valid[:0])
    return Plan(n_rows, n_cols, whole, empty, empty, n_rows, n_rows, 0, None)


def _make_plan(axis: Axis, transpose: bool) -> Plan:
    found = axis.coordinates.period
    if found is None:
        return _listed(axis, transpose)
    p, q = found
    period, shift = (q, p) if transpose else (p, q)
    clean = _clean_rows(axis, transpose)
    if len(clean) < 2 * period:
        return _listed(axis, transpose)  # too short to repeat
    n_rows, n_cols = (axis.n_in, axis.n_out) if transpose else (axis.n_out, axis.n_in)
    rows_of = _input_rows if transpose else _output_rows
    first = clean.start
    start = _strided_start(rows_of(axis, first, first + 2 * period), period)
    strided_rows = (len(clean) - (start or 0)) // period * period
    if start is not None and strided_rows >= max(_MIN_STRIDED_ROWS, n_rows / 2):
        first += start
        strided: tuple[int, int] | None = (period, shift)
    else:
        strided = None
    stop = first + (clean.stop - first) // period * period
    tables = [rows_of(axis, 0, first), rows_of(axis, first, first + period)]
    tables.append(rows_of(axis, stop, n_rows))
    width = max(t.width for t in tables)
    head, pattern, tail = (t.widened(width) for t in tables)
    return Plan(n_rows, n_cols, head, pattern, tail, first, stop, shift, strided)


class _BytesCache:
    """A least-recently-used cache holding at most ``budget`` bytes of plans."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._plans: collections.OrderedDict[tuple[Axis, bool], Plan] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # functions may be traced from several threads

    def get(self, axis: Axis, transpose: bool) -> Plan:
        key = (axis, transpose)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = _make_plan(axis, transpose)
        with self._lock:
            if key not in self._plans:
                self._plans[key] = plan
                self._bytes += plan.nbytes
            while self._bytes > self.budget and len(self._plans) > 1:
                _, old = self._plans.popitem(last=False)
                self._bytes -= old.nbytes
        return plan


_CACHE = _BytesCache(budget=64 * 2**20)


def plan(axis: Axis, transpose: bool) -> Plan:
    """The rows of ``axis``'s matrix (or of its transpose, the gradient's), cached."""
    return _CACHE.get(axis, transpose)


def shrinks_every_axis(axes: Sequence[Axis]) -> bool:
    """Whether the forward map has no more outputs than inputs along every axis
    (an axis it leaves alone has as many)."""
    return all(axis.n_out <= axis.n_in for axis in axes)


def resampled_axes(axes: tuple[Axis, ...], transpose: bool) -> range:
    """The axes from the first to the last that the map (or its transpose) does
    not leave as they are; empty where it is the identity."""
    moved = [d for d, axis in enumerate(axes) if not plan(axis, transpose).is_identity]
    return range(moved[0], moved[-1] + 1) if moved else range(0)


def pattern_rows(plan: Plan) -> tuple[jax.Array, jax.Array]:
    """For every row of the axis, computed in the program: its row in
    ``plan.compact()`` and the offset added to the columns it reads there
    (``k * shift`` in the ``k``-th period)."""
    r = lax.iota(jnp.int32, plan.n_rows)
    k, j = jnp.divmod(r - plan.first, plan.period)
    in_head, before_tail = r < plan.first, r < plan.stop
    tail_row = plan.head.rows + plan.period + r - plan.stop
    row = jnp.where(in_head, r, jnp.where(before_tail, plan.head.rows + j, tail_row))
    offset = jnp.where(~in_head & before_tail, k * plan.shift, 0)
    return row, offset
