"""Resample's arithmetic as one Pallas kernel: Triton on CUDA GPUs, interpret mode on the CPU.

Every axis is resampled in the same pass, so each output element is read from
the input and written once, with no intermediate array between the axes. The
kernel sees the array as ``[batch, rows, columns, channels]``:

- ``columns`` is the last resampled axis; its taps differ from lane to lane and
  are read from the axis's table as vectors.
- ``rows`` flattens the resampled axes before it (none for a 1-D resample): one
  output row at a time, whose taps are scalars.
- ``batch`` and ``channels`` flatten the axes before and after those, which the
  op leaves alone (an identity axis between two resampled ones counts as
  resampled, with one tap).

A program owns a block of output rows, a block of columns and a block of
channels. Each output is ``sum over row taps of w_row * (sum over column taps of
w_col * x)``, in table order, in float32 (float64 for float64) and rounded once:
a fixed order with no atomics, the same bits on every run. A pure gather
(nearest neighbour forward) moves the values as they are, in any dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgrad import _checks, _kernels
from jaxgrad._kernels import AVAILABLE as AVAILABLE
from jaxgrad._kernels import pl, plgpu
from jaxgrad._resample import _plan
from jaxgrad._resample._plan import Axis

# Output rows per program.
_ROWS = 4
# Elements per tile (columns x channels): 8 per thread of 4 warps.
_TILE = 1024
# The most channels per tile; columns get the rest.
_MAX_CHANNELS = 64
# Taps up to this many are unrolled in the kernel; more are summed in a loop, so
# that the kernel does not grow with the scale.
_MAX_UNROLLED_TAPS = 16
# The most column reads a row's unrolled taps may hold: row taps times each one's
# unrolled column reads. Past it the row taps are summed in a loop: Triton's
# compile time grows faster than the code it compiles, and 16 row taps of 16
# column taps each (the gradient of a 2-D 8x upsampling) made the kernel the
# slowest to compile by far.
_MAX_UNROLLED_READS = 64
# The largest count, index or offset an int32 holds.
_MAX_INT32 = 2**31 - 1
# Pallas' Triton lowering offsets the elements of an array of at most this many
# bytes in int32, of a larger one in int64.
_INT32_OFFSETS_BYTES = 2**32


@dataclasses.dataclass(frozen=True)
class _Tables:
    """One axis's rows as kernel operands: ``index`` ``[rows, taps]`` int32, -1 where
    a row has fewer taps, and ``weights`` ``[rows, taps]`` in the compute dtype."""

    index: jax.Array
    weights: jax.Array


def _tables(plan: _plan.Plan, dtype: Any) -> _Tables:
    """A plan's rows, listed as constants on a short axis or one without a
    pattern, and computed in the program from the pattern on a long one."""
    if plan.n_rows <= _plan.LISTED_ROWS or not plan.period:
        listed = plan.listed()
        return _Tables(
            jnp.asarray(np.where(listed.valid, listed.index, -1), jnp.int32),
            jnp.asarray(listed.weights, dtype),
        )
    compact = plan.compact()
    row, offset = _plan.pattern_rows(plan)
    index = jnp.asarray(compact.index, jnp.int32)[row] + offset[:, None]
    return _Tables(
        jnp.where(jnp.asarray(compact.valid)[row], index, -1),
        jnp.asarray(compact.weights, dtype)[row],
    )


@dataclasses.dataclass(frozen=True)
class _Launch:
    """How the kernel cuts its work, and whether it runs interpreted."""

    cols: int  # columns per tile: a power of two, as Triton's blocks must be
    channels: int  # channels per tile: a power of two
    rows: int  # output rows per program
    interpret: bool
    warps: int = 4
    # Where the columns are the array's last axis and repeat every two outputs one
    # input on, or every output two inputs on (``_pairs``): read each tap as a
    # contiguous run of inputs (or of input pairs) and form the outputs in
    # registers, instead of gathering every output's taps through the column table.
    paired: bool = False
    # With tiles of one channel: a program's rows as one 2-D tile, whose loads are
    # issued together, instead of one row after another; for short rows (a 3-D
    # volume's 128 columns), whose programs otherwise hold one element a thread.
    rows_together: bool = False
    # Where the last row axis repeats (``_row_pattern``), one row at a time: a
    # program's rows as a block of whole periods of it, which reads each input row
    # its rows share once (once for each tap of the row axes before it) and sums
    # it into every row that reads it, where the block lies inside the pattern;
    # blocks at the axis's ends go through the tables. The rows are then not held
    # together, whatever ``rows_together`` says.
    row_pattern: bool = False

    def index(self, lanes: jax.Array, size: int, *, store: bool = False) -> jax.Array:
        """``lanes`` as indices into an axis of ``size``, for a masked access."""
        return _kernels.masked_index(lanes, size, interpret=self.interpret, store=store)


def _launch(out: tuple[int, int, int, int], work: _Work, itemsize: int, interpret: bool) -> _Launch:
    """The tiles for ``work``'s output viewed as ``[batch, rows, columns, channels]``,
    of elements of ``itemsize`` bytes, and how they are read."""
    _, rows, cols, channels = out
    # Loads are coalesced along the array's minor axis: the channels, or the
    # columns when there are none (a resampled last axis).
    chans = min(pl.next_power_of_2(channels), _MAX_CHANNELS)
    cols = min(pl.next_power_of_2(cols), _TILE // chans)
    launch = _Launch(cols=cols, channels=chans, rows=min(rows, _ROWS), interpret=interpret)
    # Timed on an H200 (docs/performance.md): a last axis read in pairs, where it
    # repeats so, is faster than through the column table. A program's rows held
    # together as well are faster still where a row alone leaves a thread one
    # element or less (a 3-D volume's 128 columns), or, with two outputs a lane and
    # two row taps, less than one 16-byte vector to store (a bfloat16 2-D 2x
    # upsampling of 512 columns): the rows together store whole vectors.
    # Elsewhere they take registers (benchmarks/kernel_report.py counts them),
    # which leave fewer programs on a multiprocessor, and time: a float32 row of
    # 512 columns stores whole vectors already, the gradient of a 2x upsampling
    # reads two inputs a lane, and more row taps hold more rows' columns at once.
    pairs = _pairs(work.plans[-1], channels)
    threads = 32 * launch.warps
    short_rows = chans == 1 and cols <= threads
    narrow_stores = (
        pairs is not None
        and pairs.outputs == 2
        and _row_taps(work) <= 2
        and cols * itemsize < 16 * threads
    )
    together = short_rows or narrow_stores
    return dataclasses.replace(launch, paired=True, rows_together=together)


_Taps = tuple[tuple[int, float], ...]  # (input column or offset, weight) of each tap


@dataclasses.dataclass(frozen=True)
class _Pairs:
    """A column axis read in pairs. Lane ``m`` of a tile owns ``outputs`` output
    columns, ``outputs * m + r``, each the sum of ``weight * x[inputs * m +
    offset]`` over the ``(offset, weight)`` of ``taps[r]``, in order; ``outputs``
    or ``inputs`` is 2, the other 1. The ``edges``, ``(column, taps)``, are the
    columns where clamping breaks that pattern, whose taps name input columns."""

    outputs: int
    inputs: int
    taps: tuple[_Taps, ...]
    edges: tuple[tuple[int, _Taps], ...]


# The most columns at an axis's ends that break its pattern for it to be read in
# pairs: each is read on its own and merged into its tile, in every row.
_MAX_EDGES = 8
# The most rows a program's block of whole periods takes to follow a row pattern.
_MAX_PATTERN_ROWS = 32


@dataclasses.dataclass(frozen=True)
class _RowPattern:
    """A row axis's pattern as a program's block of rows reads it. The block
    starts at a multiple ``start`` of ``period``; its row ``r`` (output row
    ``start + r``) is the sum of ``weight * columns(start // period * shift +
    offset)`` over the ``(offset, weight)`` of ``taps[r]``, in order, for every
    block inside the rows ``first .. stop`` that follow the pattern."""

    period: int
    shift: int
    first: int
    stop: int
    taps: tuple[_Taps, ...]


def _row_pattern(plan: _plan.Plan, rows: int) -> _RowPattern | None:
    """The pattern of a program's block of at least ``rows`` rows of ``plan``, a
    whole number of periods; or None where the axis has no pattern, or whose
    periods are too long for a block."""
    if not plan.period or plan.stop <= plan.first:
        return None
    period, shift = plan.period, plan.shift
    block = period * -(-rows // period)
    if block > _MAX_PATTERN_ROWS:
        return None
    taps = []
    for r in range(block):
        # Row start + r is pattern row j of period k = start // period + periods.
        periods, j = divmod(r - plan.first, period)
        taps.append(
            tuple(
                (int(plan.pattern.index[j, t]) + periods * shift, float(plan.pattern.weights[j, t]))
                for t in range(plan.pattern.width)
                if plan.pattern.valid[j, t]
            )
        )
    return _RowPattern(period, shift, plan.first, plan.stop, tuple(taps))


def _last_row_pattern(work: _Work, rows: int) -> _RowPattern | None:
    """The pattern of a program's block of at least ``rows`` rows of the last row
    axis of ``work``, where it has one; or None. The taps of the row axes before
    it are unrolled for each input row the block reads: a few at most."""
    if len(work.plans) < 2:  # no row axis
        return None
    outer = work.plans[:-2]
    if not work.exact and math.prod(plan.width for plan in outer) > _MAX_UNROLLED_TAPS:
        return None
    return _row_pattern(work.plans[-2], rows)


def _pairs(plan: _plan.Plan, channels: int) -> _Pairs | None:
    """The plan of the last axis the kernel reads along, in pairs; or None where
    the axis is not the array's last (channels follow it, along which the tile's
    loads already run), repeats neither every two rows one column on (2x
    upsampling, the gradient of 0.5x) nor every row two columns on (0.5x, the
    gradient of 2x), or breaks its pattern in many rows."""
    if channels != 1 or (plan.period, plan.shift) not in ((2, 1), (1, 2)):
        return None
    if plan.stop <= plan.first or plan.first + plan.n_rows - plan.stop > _MAX_EDGES:
        return None
    outputs, inputs = plan.period, plan.shift

    def taps(table: _plan.Table, row: int, shift: int = 0) -> _Taps:
        return tuple(
            (int(table.index[row, t]) + shift, float(table.weights[row, t]))
            for t in range(table.width)
            if table.valid[row, t]
        )

    # Output outputs * m + r is row first + outputs * k + j of the pattern, with
    # k = m + (r - first) // outputs, which reads the columns of pattern row j
    # plus inputs * k.
    pattern = tuple(
        taps(plan.pattern, (r - plan.first) % outputs, inputs * ((r - plan.first) // outputs))
        for r in range(outputs)
    )
    head = [(o, taps(plan.head, o)) for o in range(plan.first)]
    tail = [(o, taps(plan.tail, o - plan.stop)) for o in range(plan.stop, plan.n_rows)]
    return _Pairs(outputs, inputs, pattern, tuple(head + tail))


def _accumulate(
    count: int, add: Callable[[Any, jax.Array], jax.Array], start: jax.Array, unrolled: bool
) -> jax.Array:
    """``add(count - 1, ... add(1, add(0, start)))``, taps in order: ``unrolled``,
    or a loop."""
    if unrolled:
        total = start
        for t in range(count):
            total = add(t, total)
        return total
    looped: jax.Array = _kernels.fori_loop(0, count, add, start)
    return looped


def _kernel(
    *refs: Any,
    row_axes: tuple[tuple[int, int], ...],
    exact: bool,
    launch: _Launch,
    pairs: _Pairs | None,
    row_pattern: _RowPattern | None,
) -> None:
    """One program: ``launch.rows`` output rows of a block of columns and channels.

    ``refs``: the input ``[B, R_in, W_in, C]``, then an (index, weights) pair per
    row axis and one for the column axis, then the output ``[B, R_out, W_out, C]``.
    ``row_axes``: the (input, output) length of each row axis, whose products are
    ``R_in`` and ``R_out``. ``pairs``: how to read the columns in pairs, or None
    to read them through the column table. ``row_pattern``: how a block of rows
    inside the pattern of the last row axis reads its rows, or None to read every
    block's rows through the row tables.
    """
    x_ref, *table_refs, out_ref = refs
    row_tables = [tuple(table_refs[2 * a : 2 * a + 2]) for a in range(len(row_axes))]
    col_index_ref, col_weight_ref = table_refs[-2:]
    _, rows_in, cols_in, channels = x_ref.shape
    _, rows_out, cols_out, _ = out_ref.shape
    dtype = x_ref.dtype if exact else _checks.compute_dtype(x_ref.dtype)
    # One flat grid (CUDA limits its second and third axes to 65535 programs), the
    # column blocks varying fastest, then the channel blocks: neighbouring
    # programs read neighbouring input.
    rest, col_block = divmod(pl.program_id(0), pl.cdiv(cols_out, launch.cols))
    rest, chan_block = divmod(rest, pl.cdiv(channels, launch.channels))
    b, row_block = divmod(rest, pl.cdiv(rows_out, launch.rows))
    first = row_block * launch.rows
    chans = _kernels.lanes(chan_block, launch.channels)
    cols = _kernels.lanes(col_block, launch.cols)
    chans_inside, cols_inside = chans < channels, cols < cols_out
    col_taps = int(col_index_ref.shape[1])
    cols_unrolled = col_taps <= _MAX_UNROLLED_TAPS
    # With one channel (a resampled last axis) a tile is a vector of columns (a
    # [columns, 1] block would leave Triton no contiguous minor axis to load and
    # store in vectors), or with the rows together a [rows, columns] block.
    flat = launch.channels == 1
    together = flat and launch.rows_together
    lead = (launch.rows,) if together else ()  # a tile's shape before its columns

    def per_lane(values: jax.Array) -> jax.Array:
        """A value per column, in a tile's shape."""
        return values[None, :] if together else values if flat else values[:, None]

    def per_row(values: jax.Array) -> jax.Array:
        """A value per row (a scalar, one row at a time), in a tile's shape; one
        value for every row (a 1-D resample has no row taps) is repeated."""
        return jnp.broadcast_to(values, lead)[:, None] if together else values

    def tile_at(
        lane_index: jax.Array, lanes_ok: jax.Array, rows_ok: Any = True, store: bool = False
    ) -> tuple[tuple[Any, ...], jax.Array]:
        """A tile's index past its row (columns ``lane_index``, channels) and its
        mask: the columns ``lanes_ok`` of the row or rows ``rows_ok``."""
        if flat:
            return (per_lane(lane_index), 0), per_row(rows_ok) & per_lane(lanes_ok)
        chan_index = launch.index(chans, channels, store=store)
        inside = (rows_ok & lanes_ok)[:, None] & chans_inside[None, :]
        return (lane_index[:, None], chan_index[None, :]), inside

    def zeros(lanes: int) -> jax.Array:
        return jnp.zeros((*lead, lanes) if flat else (lanes, launch.channels), dtype)

    def read(in_row: Any, in_cols: jax.Array, lanes_ok: jax.Array | None = None) -> jax.Array:
        """The tile of input row(s) ``in_row`` at the columns ``in_cols``; zero where
        a column tap is missing (-1) or a lane is not ``lanes_ok``.

        The mask is the columns' alone: a load's mask costs instructions for every
        element it gathers, and the rows need none. Every row read lies inside the
        input (``in_row`` is clipped into it); the caller drops the sum of a row read
        for a missing row tap, and stores nothing past the output's last row.
        """
        lanes_ok = in_cols >= 0 if lanes_ok is None else (in_cols >= 0) & lanes_ok
        where, inside = tile_at(launch.index(in_cols, cols_in), lanes_ok)
        index = (b, per_row(jnp.clip(in_row, 0, rows_in - 1)), *where)
        return plgpu.load(x_ref.at[index], mask=inside, other=0).astype(dtype)

    def read_one(in_row: Any, in_col: int) -> jax.Array:
        """Input row ``in_row`` at column ``in_col``, as a tile of one lane."""
        return read(in_row, jnp.full((1,), in_col, jnp.int32))

    def tabled(lanes: jax.Array, inside: jax.Array) -> Callable[[Any], jax.Array]:
        """The column sum of the output columns ``lanes`` (those ``inside`` the
        output) of an input row, read through the column table: ``columns(in_row)``,
        a tile. A lane outside the output finds every tap missing."""
        lane_index = launch.index(lanes, cols_out)

        def load_col_tap(t: Any) -> tuple[jax.Array, jax.Array]:
            """Column tap ``t`` of every lane: the input column (-1: none) and its weight."""
            t = jnp.asarray(t, jnp.int32)  # interpret mode wants array indices
            index = plgpu.load(col_index_ref.at[lane_index, t], mask=inside, other=-1)
            weight = plgpu.load(col_weight_ref.at[lane_index, t], mask=inside, other=0)
            return index, weight.astype(dtype)

        # The columns' taps are the same for every row: a few are loaded once,
        # before the row loop; many are loaded where they are used.
        if cols_unrolled:
            loaded = [load_col_tap(t) for t in range(col_taps)]
            col_tap: Callable[[Any], tuple[jax.Array, jax.Array]] = lambda t: loaded[t]  # noqa: E731
        else:
            col_tap = load_col_tap

        def columns(in_row: Any) -> jax.Array:
            if exact:  # one tap, weight 1: move the value
                return read(in_row, col_tap(0)[0])

            def add_col_tap(u: Any, total: jax.Array) -> jax.Array:
                index, weight = col_tap(u)
                return total + read(in_row, index) * per_lane(weight)

            return _accumulate(col_taps, add_col_tap, zeros(lanes.shape[0]), cols_unrolled)

        return columns

    def paired(in_row: Any) -> jax.Array:
        """The column sum of the tile's columns by the pattern of ``pairs``. Its
        inputs are read as contiguous runs, each once (in vectors where a run
        starts on one): with two outputs a lane, a run ``x[m + offset]`` serves
        both, and the two sums are interleaved in registers; with two inputs a
        lane, a run of column pairs is split into its even and odd columns. A run
        that starts off a vector's alignment (the tap before a lane's first, say)
        is read from the aligned vectors under it (``_kernels.aligned_run``). The
        edge columns, read one by one, replace their lanes, and the tile is
        stored whole: a mask that cut the edges out would stop its stores' vectors."""
        assert pairs is not None
        lanes = launch.cols // pairs.outputs
        runs: dict[int, list[jax.Array]] = {}
        # The columns a thread holds of a run: one starting off their alignment
        # is read from aligned vectors where that takes fewer loads.
        elements = math.prod(lead) * pairs.inputs * lanes
        group = _kernels.thread_columns(elements, pairs.inputs * lanes, launch.warps, x_ref.dtype)
        group = _kernels.row_aligned(group, cols_in)

        def read_run(in_cols: jax.Array) -> jax.Array:
            return read(in_row, in_cols, in_cols < cols_in)

        def run(offset: int) -> jax.Array:
            """``x[inputs * m + offset]`` for the tile's lanes ``m``."""
            start, half = divmod(offset, pairs.inputs)
            if start not in runs:
                size, shift = pairs.inputs * lanes, pairs.inputs * start
                if _kernels.fewer_loads_aligned(shift, group):
                    tile = _kernels.aligned_run(read_run, col_block, size, shift, group, axis=-1)
                else:
                    tile = read_run(_kernels.lanes(col_block, size) + shift)
                if pairs.inputs == 1:
                    runs[start] = [tile]
                else:  # the even columns, then the odd
                    split = jnp.split(tile.reshape(*lead, lanes, 2), 2, axis=-1)
                    runs[start] = [column.reshape(*lead, lanes) for column in split]
            return runs[start][half]

        def summed(taps: _Taps, value: Callable[[int], jax.Array], lanes: int) -> jax.Array:
            if exact and taps:  # one tap, weight 1: move the value
                return value(taps[0][0])
            total = zeros(lanes)  # an output no input reaches stays zero
            for where, weight in taps:
                total = total + value(where) * jnp.asarray(weight, dtype)
            return total

        sums = [summed(taps, run, lanes) for taps in pairs.taps]
        if pairs.outputs == 1:
            tile = sums[0]
        else:
            tile = jnp.stack(sums, axis=-1).reshape(*lead, launch.cols)
        element = functools.partial(read_one, in_row)
        for col, taps in pairs.edges:
            tile = jnp.where(per_lane(cols) == col, summed(taps, element, 1), tile)
        return tile

    # Built outside the row loop: the column table's taps are loaded once.
    columns = paired if pairs else tabled(cols, cols_inside)
    # The reads one row's column sum unrolls: in pairs, its edges' too, which every
    # row reads on their own.
    if pairs:
        column_reads = sum(len(taps) for taps in pairs.taps)
        column_reads += sum(len(taps) for _, taps in pairs.edges)
    else:
        column_reads = col_taps if cols_unrolled and not exact else 1

    row_widths = [int(table[0].shape[1]) for table in row_tables]

    def row_indices(o: Any, axes: range) -> list[Any]:
        """The index along each row axis of ``axes`` of output row ``o``, counted in
        those axes' output rows (the last varies fastest)."""
        indices: list[Any] = []
        for a in reversed(axes):
            indices.insert(0, o % row_axes[a][1])
            o = o // row_axes[a][1]
        return indices

    def row_tap(t: Any, axes: range, out_indices: list[Any]) -> tuple[Any, Any, Any]:
        """Flat tap ``t`` of the row axes ``axes`` (the first axis's tap varies
        fastest) at their output indices ``out_indices``: the input row, counted in
        those axes' input rows; whether every axis has the tap; and the product of
        the axes' weights."""
        in_row: Any = 0
        ok: Any = True
        weight: Any = 1
        for a, out_index in zip(axes, out_indices, strict=True):
            (index_ref, weight_ref), width = row_tables[a], row_widths[a]
            t, tap = t // width, jnp.asarray(t % width, jnp.int32)
            index = plgpu.load(index_ref.at[out_index, tap])
            in_row = in_row * row_axes[a][0] + index
            ok = ok & (index >= 0)
            weight = weight * plgpu.load(weight_ref.at[out_index, tap])
        return in_row, ok, weight

    def row_taps(axes: range) -> int:
        """How many flat taps the row axes ``axes`` have (one tap each moves a value)."""
        return 1 if exact else math.prod(row_widths[a] for a in axes)

    def output_rows(o: Any) -> None:
        """Computes and stores output row ``o``, or the rows ``o`` together."""
        # Past the last row (a short last block) the tables are read at the last
        # row, inside them, and nothing is stored.
        every_axis = range(len(row_axes))
        out_indices = row_indices(jnp.minimum(o, rows_out - 1), every_axis)
        taps = row_taps(every_axis)
        # A few taps' rows and weights are read before the first tap's columns, so
        # that a row waits on its table reads once, not once a tap: the branches
        # below keep the compiler from moving these loads up itself.
        unrolled = taps <= _MAX_UNROLLED_TAPS and taps * column_reads <= _MAX_UNROLLED_READS
        preloaded = None
        if unrolled:
            preloaded = [row_tap(t, every_axis, out_indices) for t in range(taps)]

        def add_row_tap(t: Any, total: jax.Array) -> jax.Array:
            """``total`` plus row tap ``t``'s column sum times its weight. A missing
            tap adds nothing, and reads nothing: one row at a time it is a branch
            (the same way for every thread of a program); with the rows together,
            where the rows differ, its row is read, one inside the input, and its
            sum dropped (an infinity there times the weight 0 would be NaN)."""
            if preloaded is None:
                in_row, ok, row_weight = row_tap(t, every_axis, out_indices)
            else:
                in_row, ok, row_weight = preloaded[t]

            def added(total: jax.Array) -> jax.Array:
                term = columns(in_row)
                if together:
                    term = jnp.where(per_row(ok), term, jnp.zeros_like(term))
                if exact:  # one tap per axis, weight 1: move the value
                    return term
                return total + term * per_row(jnp.asarray(row_weight, dtype))

            if together or not row_tables:  # rows differ, or no row axes
                return added(total)
            kept: jax.Array = lax.cond(ok, added, lambda total: total, total)
            return kept

        store(o, _accumulate(taps, add_row_tap, zeros(launch.cols), unrolled))

    def store(o: Any, total: jax.Array) -> None:
        """Stores output row ``o`` (or rows), where it is inside the output."""
        lane_index = launch.index(cols, cols_out, store=True)
        where, inside = tile_at(lane_index, cols_inside, o < rows_out, store=True)
        index = (b, per_row(jnp.minimum(o, rows_out)), *where)
        plgpu.store(out_ref.at[index], total.astype(out_ref.dtype), mask=inside)

    def rows_by_table() -> None:
        if together:
            output_rows(first + jnp.arange(launch.rows, dtype=jnp.int32))
        else:
            _kernels.fori_loop(0, launch.rows, lambda r, carry: output_rows(first + r), None)

    def add_input_row(
        sums: tuple[jax.Array, ...], in_row: Any, weights: list[list[float]], outer_weight: Any
    ) -> tuple[jax.Array, ...]:
        """``sums`` plus the column sum of input row ``in_row`` times ``outer_weight``
        times each of the row's ``weights`` (a list for each sum), in order."""
        summed = columns(in_row)
        if exact:  # one tap, weight 1: move the value
            return tuple(summed for _ in sums)
        added = []
        for total, row_weights in zip(sums, weights, strict=True):
            for weight in row_weights:
                total = total + summed * (outer_weight * jnp.asarray(weight, dtype))
            added.append(total)
        return tuple(added)

    def rows_by_pattern(pattern: _RowPattern, outer: Any, inner_first: Any) -> None:
        """The block's rows, all inside the pattern of the last row axis, at the
        flat index ``outer`` along the row axes before it (if any), from row
        ``inner_first`` of the last. Each input row of the last axis that they read
        is read once, in order, for each tap of the axes before (a missing one is
        a branch that reads nothing), and summed into every row that reads it; a
        row is stored after its last tap. Each row's sum is the table's, tap for
        tap: the last axis's taps are the flat taps' slowest digit."""
        outer_axes = range(len(row_axes) - 1)
        outer_indices = row_indices(outer, outer_axes)
        outer_taps = [row_tap(u, outer_axes, outer_indices) for u in range(row_taps(outer_axes))]
        inner_rows_in = row_axes[-1][0]
        base = inner_first // pattern.period * pattern.shift
        totals = [zeros(launch.cols) for _ in pattern.taps]
        # A row's taps read increasing input rows, as the tables list them.
        last = {r: taps[-1][0] for r, taps in enumerate(pattern.taps) if taps}
        for r in range(len(pattern.taps)):
            if r not in last:  # no input reaches it
                store(first + r, totals[r])
        for offset in sorted({offset for taps in pattern.taps for offset, _ in taps}):
            # The rows that read this input row, and the weights they read it with.
            readers = {
                r: [weight for tap_offset, weight in taps if tap_offset == offset]
                for r, taps in enumerate(pattern.taps)
            }
            readers = {r: weights for r, weights in readers.items() if weights}
            for outer_row, ok, outer_weight in outer_taps:
                add = functools.partial(
                    add_input_row,
                    in_row=outer_row * inner_rows_in + base + offset,
                    weights=list(readers.values()),
                    outer_weight=outer_weight,
                )
                sums = tuple(totals[r] for r in readers)
                sums = lax.cond(ok, add, lambda sums: sums, sums) if outer_axes else add(sums)
                for r, total in zip(readers, sums, strict=True):
                    totals[r] = total
            for r in readers:
                if last[r] == offset:
                    store(first + r, totals[r])

    if row_pattern is None:
        rows_by_table()
    else:
        # The block's first row along the last row axis, and its index along the
        # axes before, whose blocks start at any row of the last axis, not only at
        # a multiple of its period.
        outer, inner_first = divmod(first, row_axes[-1][1]) if len(row_axes) > 1 else (0, first)
        inside = (
            (inner_first % row_pattern.period == 0)
            & (inner_first >= row_pattern.first)
            & (inner_first + launch.rows <= row_pattern.stop)
        )
        pl.when(inside)(functools.partial(rows_by_pattern, row_pattern, outer, inner_first))
        pl.when(~inside)(rows_by_table)


def _view(shape: tuple[int, ...], first: int, last: int) -> tuple[int, int, int, int]:
    """``shape`` as ``[batch, rows, columns, channels]`` for the resampled axes
    ``first .. last``."""
    return (
        math.prod(shape[:first]),
        math.prod(shape[first:last]),
        shape[last],
        math.prod(shape[last + 1 :]),
    )


@dataclasses.dataclass(frozen=True)
class _Work:
    """What the kernel does for some axes: the plans of the axes it reads along
    (``first`` to ``last``, the first and last that are not the identity), and
    whether they only move values."""

    plans: tuple[_plan.Plan, ...]
    first: int
    exact: bool

    @property
    def last(self) -> int:
        return self.first + len(self.plans) - 1


def _row_taps(work: _Work) -> int:
    """The taps of an output row: one of each row axis's taps, for every
    combination (one, where the kernel only moves values)."""
    return 1 if work.exact else math.prod(plan.width for plan in work.plans[:-1])


def _work(axes: tuple[Axis, ...], transpose: bool) -> _Work | None:
    """The kernel's work, or None if every axis is the identity."""
    span = _plan.resampled_axes(axes, transpose)
    if not span:
        return None
    plans = tuple(_plan.plan(axes[d], transpose) for d in span)
    exact = all(plan.is_exact for plan in plans if not plan.is_identity)
    return _Work(plans, span.start, exact)


def _out_shape(shape: tuple[int, ...], work: _Work) -> tuple[int, ...]:
    """The output's shape for an input of ``shape``."""
    return tuple(
        work.plans[d - work.first].n_rows if work.first <= d <= work.last else n
        for d, n in enumerate(shape)
    )


def _programs(view_out: tuple[int, int, int, int], launch: _Launch) -> int:
    """How many programs the kernel runs, one per tile of the output."""
    batch, rows, cols, channels = view_out
    return (
        batch
        * pl.cdiv(rows, launch.rows)
        * pl.cdiv(channels, launch.channels)
        * pl.cdiv(cols, launch.cols)
    )


def refusal(
    shape: tuple[int, ...], dtype: Any, axes: tuple[Axis, ...], transpose: bool
) -> str | None:
    """Why the kernel cannot compute the map on an input of ``shape`` and
    ``dtype``, or None.

    The kernel counts its programs, and the rows, columns and channels of its
    views, in int32. Each axis fits (the ops refuse longer ones), but the rows and
    the channels are products of axes, which can pass 2**31 - 1 in an array of
    more than 2**31 elements; so can the programs. Tiles of a power of two keep a
    tile's lanes below 2**31 on an axis that fits.

    Pallas' Triton lowering offsets the elements of an array of at most 4 GiB in
    int32, which reaches every element of 2 bytes or more, but only the first
    2**31 of one byte (int8, uint8, bool); past them, the offsets would wrap.
    """
    work = None if 0 in shape else _work(axes, transpose)
    out_shape = () if work is None else _out_shape(shape, work)
    if work is None or 0 in out_shape:
        return None  # nothing to compute
    view_in = _view(shape, work.first, work.last)
    view_out = _view(out_shape, work.first, work.last)
    itemsize = jnp.dtype(_dtypes(work, dtype)[0]).itemsize
    launch = _launch(view_out, work, itemsize, interpret=False)
    programs = _programs(view_out, launch)
    if max(*view_in[1:], *view_out[1:], programs) > _MAX_INT32:
        return (
            "the kernel counts in int32, up to 2**31 - 1, and views the input as "
            f"[batch, rows, columns, channels] {list(view_in)}, the output as "
            f"{list(view_out)} in {programs} programs"
        )
    if itemsize == 1:
        for name, array_shape in (("input", shape), ("output", out_shape)):
            elements = math.prod(array_shape)
            if _MAX_INT32 < elements <= _INT32_OFFSETS_BYTES:
                return (
                    "Pallas offsets the elements of an array of at most 4 GiB in int32, up "
                    f"to 2**31 - 1, and the {name} has {elements} elements of one byte"
                )
    return None


def _dtypes(work: _Work, dtype: Any) -> tuple[Any, Any]:
    """The dtype the kernel reads and writes (bool moves as uint8), and the one it
    computes in."""
    source = jnp.uint8 if dtype == jnp.bool_ else dtype
    return source, source if work.exact else _checks.compute_dtype(dtype)


def tables(axes: tuple[Axis, ...], transpose: bool, dtype: Any) -> tuple[jax.Array, ...]:
    """The kernel's table operands for an input of ``dtype``: an index and a weight
    array per axis it reads along."""
    work = _work(axes, transpose)
    if work is None:
        return ()
    compute = _dtypes(work, jnp.dtype(dtype))[1]
    return tuple(
        array for plan in work.plans for array in dataclasses.astuple(_tables(plan, compute))
    )


def apply(
    x: jax.Array,
    table_arrays: tuple[jax.Array, ...],
    axes: tuple[Axis, ...],
    transpose: bool,
    *,
    interpret: bool,
) -> jax.Array:
    """The separable map (or its transpose) on ``x``, in one kernel, with the
    ``tables(axes, transpose, x.dtype)``.

    The axes the kernel reads along take their lengths from ``axes``; the others
    keep ``x``'s (a shard's, under ``custom_partitioning``).
    """
    work = _work(axes, transpose)
    if work is None:
        return x
    first, last = work.first, work.last
    out_shape = _out_shape(x.shape, work)
    if 0 in x.shape or 0 in out_shape:
        return jnp.zeros(out_shape, x.dtype)
    source = _dtypes(work, x.dtype)[0]
    view_out = _view(out_shape, first, last)
    launch = _launch(view_out, work, jnp.dtype(source).itemsize, interpret)
    # Pairs need tiles of one channel, and two columns at least for two outputs a lane.
    pairable = launch.channels == 1 and launch.cols > 1
    row_pattern = None
    if launch.row_pattern:
        row_pattern = _last_row_pattern(work, launch.rows)
        if row_pattern is not None:  # a program's rows: a block of whole periods
            launch = dataclasses.replace(launch, rows=len(row_pattern.taps), rows_together=False)
    if launch.rows_together and launch.channels == 1:
        # The rows form one tile, whose sides Triton's blocks must make powers of
        # two; rows past the output's last are read inside it and not stored.
        launch = dataclasses.replace(launch, rows=pl.next_power_of_2(launch.rows))
    params = None
    if not interpret:
        params = plgpu.CompilerParams(num_warps=launch.warps, num_stages=2)
    out = pl.pallas_call(
        functools.partial(
            _kernel,
            row_axes=tuple((plan.n_cols, plan.n_rows) for plan in work.plans[:-1]),
            exact=work.exact,
            launch=launch,
            pairs=_pairs(work.plans[-1], view_out[3]) if launch.paired and pairable else None,
            row_pattern=row_pattern,
        ),
        out_shape=_kernels.varying_as(
            jax.ShapeDtypeStruct(view_out, source),  # type: ignore[no-untyped-call]
            [x],
        ),
        grid=(_programs(view_out, launch),),
        interpret=interpret,
        compiler_params=params,
    )(x.astype(source).reshape(_view(x.shape, first, last)), *table_arrays)
    result: jax.Array = out.reshape(out_shape).astype(x.dtype)
    return result
