"""The depthwise ops as Pallas kernels: Triton on CUDA GPUs, interpret mode on the CPU.

Every kernel works on tiles of one image row, ``[columns, channels]`` whatever
the layout: a tile is read with index vectors along both axes, so NHWC and NCHW
differ only in which of the array's axes those vectors address. Reads outside
the input (padding) are masked loads, never a padded copy. With a depth
multiplier ``M`` (a power of two), a tile of output channels reads its input
channels once and repeats each across its ``M`` lanes in registers. A program
owns a block of rows, and its float32 sums (float64 for float64) run over the
filter taps in one fixed order, so every result is the same bits on every run:
no atomics, and no reduction left for a compiler to retile.

Consecutive rows of a block share input rows (at stride 1, a 3x3 filter's next
row reads two of the same three). A launch may keep those in registers rather
than read them again (``_Launch.reuse_rows``): the forward and the input gradient
then sum the same products in the same order, and the filter gradient's partials
sum a program's column tiles one after another, each down all of its rows:
another fixed order.

- forward: a program writes a block of output rows; each output tile is the sum
  over the taps of the input tile the tap reads times the tap.
- input gradient: a program writes a block of input rows; each input pixel sums,
  over the taps and multipliers, the output-gradient pixels that read it through
  that tap (a gather). At a stride ``sw`` the same tap columns reach every
  column ``c * sw + phase`` of one phase, so a tile holds one phase's columns
  and reads only the taps that reach them, at consecutive output columns (in
  NCHW at stride 2 a program may hold both phases and write them interleaved,
  ``_Launch.wide_strided_writes``); at a stride ``sh`` a branch skips the
  filter rows that reach no output row.
- filter gradient: a program sums ``window * dy`` over a block of rows for a
  group of taps, in registers, and writes one partial per tap; a second, small
  kernel adds the partials of all programs up in a fixed order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from jaxgrad import _checks, _kernels
from jaxgrad._depthwise._plan import Conv
from jaxgrad._kernels import AVAILABLE as AVAILABLE
from jaxgrad._kernels import pl, plgpu


@dataclasses.dataclass(frozen=True)
class _Launch:
    """How a kernel cuts its work, and whether it runs interpreted."""

    # Columns per tile: a power of two, as Triton's blocks must be. A walk's tile is
    # one column; there, the columns one program walks, any number.
    cols: int
    channels: int  # channels per tile: a power of two
    rows: int  # rows per program
    interpret: bool
    warps: int
    # Whether a program keeps the input rows that consecutive rows share in
    # registers (a 3x3 filter at stride 1 then reads one new row of windows per
    # row, not three) rather than read them again from the cache. The kept rows
    # cost registers, so fewer programs may fit on a multiprocessor at once:
    # whether fewer loads pay for that is measured per kernel (``_CUTS``).
    reuse_rows: bool
    # Filter taps a program holds in registers at once: the taps themselves in the
    # forward and the input gradient (a larger filter loads each where it is used),
    # one float32 sum per tap in the filter gradient (a larger filter's taps are
    # cut into groups, a program each).
    taps: int
    # Whether an NCHW forward or filter gradient at column stride 2 reads a
    # window's columns as one run of column pairs, twice the tile's columns, and
    # keeps one column of each pair in registers, rather than reading every other
    # column: lanes two elements apart are loaded one at a time, a run of pairs
    # (an arange plus an offset) in wide loads. Whether the wider reads pay for
    # the registers the pairs take is measured per kernel (``_CUTS``).
    wide_strided_reads: bool = False
    # Whether an NCHW input gradient at column stride 2 computes both column phases
    # of its tile, columns ``2c`` and ``2c + 1``, and writes them interleaved as one
    # run, rather than write each phase's every other column alone: the strided
    # stores go one element at a time, the run in wide stores. The phases then share
    # the output-gradient tiles they both read, and hold their sums at once
    # (``_CUTS`` says which kernels write so).
    wide_strided_writes: bool = False
    # Whether an NCHW kernel reads a run of columns that starts off a vector's
    # alignment (a window at column offset -1, say) as the aligned vectors under
    # it, plus an element a thread for each column of the offset, and moves the
    # columns into place in registers (``_read_columns``), rather than one element
    # at a time: Triton loads a run in vectors only from an aligned start.
    aligned_reads: bool = False
    # Whether a program reads the tiles of its next row before it computes the
    # current one, holding them in registers until then. A warp waits for a load
    # where its value is first used, not where it is issued: reading a row ahead
    # keeps one row's loads in flight while the previous row's products run,
    # where otherwise each row's loads wait for the row before to finish. Whether
    # that pays for the registers the tiles take is measured per kernel (``_CUTS``).
    read_ahead: bool = False
    # Whether an NHWC kernel walks each row's columns in order, a ``[rows,
    # channels]`` tile a step, rather than cut the columns into tiles: a step
    # reads an output column's new columns of the array its sums read, per
    # filter row (one at column stride 1; the filter gradient also one
    # output-gradient column), which the taps of later steps read again from
    # registers, so that a multiply-add costs few loads and little address
    # arithmetic (``_walks_columns`` says where it applies). The tile then
    # takes its own shape (``_walk_launch``); whether it pays is measured per
    # kernel (``_CUTS``).
    walk_columns: bool = False
    # The warps of a walk's program: its rows are as many as give each thread a
    # run of 8 channels of a row, so fewer warps make more, shorter programs,
    # which may fill the GPU's last wave of programs better.
    walk_warps: int = 2
    # The channels of a walk's tile at most, a power of two: more channels give a
    # program fewer rows (the threads of a row share its channels), so more of
    # the input rows it reads are also read by the programs above and below it
    # for their first and last rows; fewer leave more channel blocks.
    walk_channels: int = 32
    # The warps a walk's grid makes at least, where shorter walks can make them
    # (``_walk_launch``): each row cut into equal segments, a program each, or
    # failing that fewer rows a program. A walk's program is long, one step a
    # column, so its grid needs fewer warps than ``_MIN_WARPS`` to keep the GPU
    # busy; but a grid just past what a GPU holds at once may run its last programs
    # alone, nearly as long as the rest took, a tail that more, shorter programs
    # shrink (whether it does is measured per kernel: ``_CUTS``).
    walk_grid_warps: int = 1024

    def call(
        self,
        kernel: Callable[..., None],
        out_shape: Any,  # a jax.ShapeDtypeStruct, or a tuple of them
        grid: tuple[int, ...],
        *args: jax.Array,
    ) -> jax.Array:
        params = None
        if not self.interpret:
            params = plgpu.CompilerParams(num_warps=self.warps, num_stages=2)
        return pl.pallas_call(  # type: ignore[no-any-return]
            functools.partial(kernel, launch=self),
            out_shape=_kernels.varying_as(out_shape, args),
            grid=grid,
            interpret=self.interpret,
            compiler_params=params,
        )(*args)

    def index(self, lanes: jax.Array, size: int, *, store: bool = False) -> jax.Array:
        """``lanes`` as indices into an axis of ``size``, for a masked access."""
        return _kernels.masked_index(lanes, size, interpret=self.interpret, store=store)


@dataclasses.dataclass(frozen=True)
class _Cut:
    """How one kernel cuts its work in one layout: the elements of its tile, the
    channels the tile spans at most (the columns get the rest), the warps of a
    program, whether a program keeps shared input rows (``_Launch.reuse_rows``),
    the taps it holds in registers (``_Launch.taps``), whether it reads or writes
    strided columns in pairs (``_Launch.wide_strided_reads``,
    ``_Launch.wide_strided_writes``), whether it reads unaligned runs of columns
    from aligned vectors (``_Launch.aligned_reads``), whether it reads a row
    ahead (``_Launch.read_ahead``), and the filters whose columns it walks (those
    of at most ``walk_taps`` taps whose walk keeps at most ``walk_kept`` columns
    of a filter row, ``_walk_kept``), on how many warps and channels
    (``_Launch.walk_columns``, ``_Launch.walk_warps``, ``_Launch.walk_channels``),
    in a grid of how many warps at least (``_Launch.walk_grid_warps``)."""

    tile: int
    most_channels: int
    warps: int
    reuse_rows: bool = False
    taps: int = 16
    wide_strided_reads: bool = False
    wide_strided_writes: bool = False
    aligned_reads: bool = False
    read_ahead: bool = False
    walk_taps: int = 0
    # The walks timed keep two columns of a filter row (a 3x3 filter at column
    # strides 1 and 2). A dilated filter's walk keeps more, a tile of registers
    # each: compiled for an H100, a [32,28,28,384] bfloat16 filter gradient of a
    # 3x3 filter dilated by 2 walks at 238 registers, by 4 at 255, spilling 64
    # bytes, where its tiles take 104-106.
    walk_kept: int = 2
    walk_warps: int = 2
    walk_channels: int = 32
    walk_grid_warps: int = 1024


# Each kernel's cut by layout, chosen from benchmarks/tune.py's searches and
# benchmarks/compare.py's timings on an H200 over benchmarks/gpu.py's cases
# (docs/design.md says how; docs/performance.md has the timings). Loads are
# coalesced along the array's minor axis, channels in NHWC and columns in NCHW, so
# that axis gets the wide side of the tile. The filter gradient keeps its rows: it
# holds no taps, so the kept windows fit beside its sums. The NHWC filter gradient
# walks the columns of filters up to 3x3, on one warp a program: faster than its
# tiles at stride 1, as fast at stride 2 and with a multiplier; the forward's and
# the input gradient's walks were slower than their tiles, and a 5x5 walk takes
# 254 registers, nearly all a thread has, as a 3x3 filter's dilated along the
# columns does (``_Cut.walk_kept``).
# The NCHW forward and filter gradient read strided columns in pairs: timed
# against every other column read alone, the wide loads paid for the registers
# they take. The NCHW input gradient writes them in pairs, in fewer stores: its
# stride-2 case ran in a fraction of the time (timed with the aligned reads below,
# not yet without them). Only with a depth multiplier do the NCHW kernels read
# unaligned runs of columns from aligned vectors (``_Launch.aligned_reads``;
# ``_MULTIPLIER_CUTS``): fewer loads and registers, but slower in every NCHW case
# timed but the multiplier's forward and filter gradient.
_CUTS = {
    ("forward", "NHWC"): _Cut(tile=512, most_channels=32, warps=4),
    ("input", "NHWC"): _Cut(tile=512, most_channels=32, warps=4),
    ("filter", "NHWC"): _Cut(
        tile=512, most_channels=64, warps=8, reuse_rows=True, walk_taps=9, walk_warps=1
    ),
    ("forward", "NCHW"): _Cut(
        tile=1024, most_channels=8, warps=4, reuse_rows=True, wide_strided_reads=True
    ),
    ("input", "NCHW"): _Cut(tile=512, most_channels=8, warps=4, wide_strided_writes=True),
    ("filter", "NCHW"): _Cut(
        tile=1024, most_channels=8, warps=4, reuse_rows=True, wide_strided_reads=True
    ),
}
# The cuts of the NCHW forward and filter gradient with a depth multiplier, which
# read unaligned runs of columns from aligned vectors: timed with a multiplier of
# 2 they took less time so, where without one every NCHW kernel took more.
_MULTIPLIER_CUTS = {
    key: dataclasses.replace(_CUTS[key], aligned_reads=True)
    for key in [("forward", "NCHW"), ("filter", "NCHW")]
}
# The cuts for a filter of more taps than its kernel's cut above holds, up to the
# taps these hold (a 5x5 filter), where a search found one: the forward and the
# input gradient then hold all the taps and keep the shared rows, in tiles small
# enough (two elements a thread) for both to fit in registers. A filter larger
# still (7x7) keeps the cut above and loads each tap where it is used.
_WIDE_FILTER_CUTS = {
    ("forward", "NHWC"): _Cut(tile=128, most_channels=16, warps=2, reuse_rows=True, taps=32),
    ("input", "NHWC"): _Cut(tile=128, most_channels=16, warps=2, reuse_rows=True, taps=32),
}
# Rows one program of each kernel owns at most: a filter-gradient program writes
# one partial per tap, so more rows mean fewer partials to add up.
_MOST_ROWS = {"forward": 8, "input": 8, "filter": 16}
# Warps a kernel's grid should have at least, where fewer rows per program can make
# them: 2048 programs of 4 warps. An H100's 132 multiprocessors hold 16-48 such
# warps each at once, so these make 1.3-4 waves: no multiprocessor left without
# work, and a last wave cut short costs a fraction of the whole.
_MIN_WARPS = 8192
# Float32 sums a thread of the filter gradient holds at most: one per tap of its
# group for each element of the tile it owns. The cuts were searched with 3x3
# filters, 9 taps at 8 elements a thread in the NCHW cut; a group of a larger
# filter (up to ``_Launch.taps``) at that tile can take nearly every register a
# thread has, with the windows beside the sums, and spill some, so its tile is
# narrowed to hold no more sums than a 3x3 filter's (``_holding_its_sums``).
_MOST_SUMS = 72


def _launch(conv: Conv, interpret: bool, kernel: str) -> _Launch:
    """The tile, warps and rows per program of ``kernel`` ("forward", "input",
    "filter") for ``conv``."""
    cut = _cut(conv, kernel)
    size, channels = _tiled(conv, kernel)
    # Lanes past the array's channels would idle, so an array with few channels
    # gives them to the columns.
    chans = min(pl.next_power_of_2(channels), cut.most_channels)
    cols = min(pl.next_power_of_2(size[1]), cut.tile // chans)
    launch = _Launch(
        cols=cols,
        channels=chans,
        rows=_MOST_ROWS[kernel],
        interpret=interpret,
        warps=cut.warps,
        reuse_rows=cut.reuse_rows,
        taps=cut.taps,
        wide_strided_reads=cut.wide_strided_reads,
        wide_strided_writes=cut.wide_strided_writes,
        aligned_reads=cut.aligned_reads,
        read_ahead=cut.read_ahead,
        walk_columns=math.prod(conv.kernel) <= cut.walk_taps and _walk_kept(conv) <= cut.walk_kept,
        walk_warps=cut.walk_warps,
        walk_channels=cut.walk_channels,
        walk_grid_warps=cut.walk_grid_warps,
    )
    if kernel == "filter":
        launch = _holding_its_sums(conv, launch)
    while launch.rows > 1 and math.prod(_grid(conv, launch, kernel)) * launch.warps < _MIN_WARPS:
        launch = dataclasses.replace(launch, rows=launch.rows // 2)
    return launch


def _holding_its_sums(conv: Conv, launch: _Launch) -> _Launch:
    """The filter gradient's ``launch``, its tile's columns halved while a thread
    would hold more than ``_MOST_SUMS`` sums: one per tap of the largest group of
    taps (``_tap_groups``) for each element of the tile it owns."""
    taps = max(end - start for start, end in _tap_groups(conv, launch))
    threads = 32 * launch.warps
    while launch.cols > 1 and taps * launch.cols * launch.channels > _MOST_SUMS * threads:
        launch = dataclasses.replace(launch, cols=launch.cols // 2)
    return launch


def _cut(conv: Conv, kernel: str) -> _Cut:
    """``kernel``'s cut for ``conv``'s layout and filter."""
    key = (kernel, _layout_name(conv))
    if conv.multiplier > 1 and key in _MULTIPLIER_CUTS:
        return _MULTIPLIER_CUTS[key]
    cut, wide = _CUTS[key], _WIDE_FILTER_CUTS.get(key)
    if wide is not None and cut.taps < math.prod(conv.kernel) <= wide.taps:
        return wide
    return cut


def _tiled(conv: Conv, kernel: str) -> tuple[tuple[int, int], int]:
    """The (rows, columns) and channel lanes of the tiles ``kernel``'s programs own:
    the output's (forward, filter gradient), or the input gradient's, whose
    columns are those of one phase (``_phase_columns``). Where input channels are
    repeated in registers, the input gradient's lanes are output channels too,
    summed over the multiplier before they are written."""
    if kernel == "input":
        lanes = conv.channels * conv.multiplier if _repeats(conv) else conv.channels
        rows, cols = conv.in_size
        return (rows, pl.cdiv(cols, conv.strides[1])), lanes
    return conv.out_size, conv.channels * conv.multiplier


def _repeats(conv: Conv) -> bool:
    """Whether tiles read each input channel once and repeat it in registers for
    the ``M`` output channels ``k * M + q`` it feeds, rather than read it ``M``
    times: equal indices side by side are a load Triton cannot vectorize. That
    takes a multiplier ``M > 1`` that is a power of two and fits in a tile."""
    m = conv.multiplier
    return 1 < m <= _most_channels(conv) and m & (m - 1) == 0


def _most_channels(conv: Conv) -> int:
    """The channels every kernel's tile spans at most, for ``conv``."""
    return min(_cut(conv, kernel).most_channels for kernel in ("forward", "input", "filter"))


def _layout_name(conv: Conv) -> str:
    return "NCHW" if conv.nchw else "NHWC"


def _grid(conv: Conv, launch: _Launch, kernel: str) -> tuple[int, int, int]:
    """The programs of ``kernel``: images x row blocks, channel blocks, and column
    blocks. The filter gradient's programs loop over the columns; a filter of more
    taps than one program sums splits them into groups (``_tap_groups``) instead,
    the group varying fastest along the first axis: a GPU starts the programs of
    one block of rows side by side, so that the later groups can find the block
    in its L2 cache rather than read it from memory again."""
    size, channels = _tiled(conv, kernel)
    channel_blocks = pl.cdiv(channels, launch.channels)
    if kernel == "filter":
        groups = len(_tap_groups(conv, launch))
        return (_row_programs(conv, launch, kernel) * groups, channel_blocks, 1)
    return (_row_programs(conv, launch, kernel), channel_blocks, pl.cdiv(size[1], launch.cols))


def _row_programs(conv: Conv, launch: _Launch, kernel: str) -> int:
    """The images times the blocks of ``launch.rows`` rows of ``kernel``'s tiles."""
    (rows, _), _ = _tiled(conv, kernel)
    return conv.batch * pl.cdiv(rows, launch.rows)


def _image_and_first_row(program: Any, conv: Conv, launch: _Launch, kernel: str) -> tuple[Any, Any]:
    """The image and the first row of the block of rows that ``program``, an index
    along ``_row_programs``, owns."""
    (rows, _), _ = _tiled(conv, kernel)
    row_blocks = pl.cdiv(rows, launch.rows)
    return program // row_blocks, program % row_blocks * launch.rows


def _layout(conv: Conv) -> Callable[[Any, Any, Any, Any], tuple[Any, ...]]:
    """Orders (image, row, columns, channels) indices as the array's axes."""
    if conv.nchw:
        return lambda n, row, cols, chans: (n, chans, row, cols)
    return lambda n, row, cols, chans: (n, row, cols, chans)


def _read(
    ref: Any,
    conv: Conv,
    launch: _Launch,
    n: Any,
    row: Any,
    cols: Any,
    chans: Any,
    dtype: Any,
    *,
    wanted: Any = True,
) -> jax.Array:
    """The ``[len(cols), len(chans)]`` tile of a 4-D array at one row, as ``dtype``,
    zero where the row, a column or a channel lies outside the array, or where
    ``wanted`` (a scalar, or one flag per column) is false.

    Unwanted lanes are masked, not moved: indices that stay an ``arange`` plus an
    offset let Triton vectorize the load.
    """
    h_axis, w_axis, c_axis = (2, 3, 1) if conv.nchw else (1, 2, 3)
    h, w, c = ref.shape[h_axis], ref.shape[w_axis], ref.shape[c_axis]
    inside = (
        ((row >= 0) & (row < h))
        & ((cols >= 0) & (cols < w) & wanted)[:, None]
        & ((chans >= 0) & (chans < c))[None, :]
    )
    index = _layout(conv)(
        n,
        jnp.clip(row, 0, h - 1),
        launch.index(cols, w)[:, None],
        launch.index(chans, c)[None, :],
    )
    return plgpu.load(ref.at[index], mask=inside, other=0).astype(dtype)


def _write(
    ref: Any, conv: Conv, launch: _Launch, n: Any, row: Any, cols: Any, chans: Any, tile: jax.Array
) -> None:
    """Stores a tile at one row; lanes outside the array are not written."""
    h_axis, w_axis, c_axis = (2, 3, 1) if conv.nchw else (1, 2, 3)
    h, w, c = ref.shape[h_axis], ref.shape[w_axis], ref.shape[c_axis]
    inside = (row < h) & (cols < w)[:, None] & (chans < c)[None, :]
    index = _layout(conv)(
        n,
        jnp.minimum(row, h),
        launch.index(cols, w, store=True)[:, None],
        launch.index(chans, c, store=True)[None, :],
    )
    plgpu.store(ref.at[index], tile.astype(ref.dtype), mask=inside)


def _read_columns(
    ref: Any,
    conv: Conv,
    launch: _Launch,
    n: Any,
    row: Any,
    block: Any,
    size: int,
    shift: int,
    chans: Any,
    dtype: Any,
    *,
    row_ok: Any = True,
    keep: Any = None,
) -> jax.Array:
    """The ``[size, len(chans)]`` tile of ``_read`` at the columns ``lanes(block,
    size) + shift``, zero where the scalar ``row_ok`` or the tile's flag per column
    ``keep`` is false. In NCHW under ``_Launch.aligned_reads`` a run that starts
    off a vector's alignment is read from aligned vectors where that takes fewer
    loads (``_kernels.aligned_run``), in rows whose length lets them start
    aligned (``_kernels.row_aligned``)."""
    elements = size * chans.shape[0]
    group = _kernels.thread_columns(elements, size, launch.warps, ref.dtype)
    group = _kernels.row_aligned(group, ref.shape[-1])
    aligned = launch.aligned_reads and conv.nchw
    if not (aligned and _kernels.fewer_loads_aligned(shift, group)):
        wanted = row_ok if keep is None else row_ok & keep
        cols = _kernels.lanes(block, size) + shift
        return _read(ref, conv, launch, n, row, cols, chans, dtype, wanted=wanted)

    def read(cols: jax.Array) -> jax.Array:
        return _read(ref, conv, launch, n, row, cols, chans, dtype, wanted=row_ok)

    tile = _kernels.aligned_run(read, block, size, shift, group, axis=0)
    return tile if keep is None else jnp.where(keep[:, None], tile, 0)


def _tap_vector(f_ref: Any, launch: _Launch, tap: int, chans: Any, dtype: Any) -> jax.Array:
    """One filter tap for a tile's output channels, from the filter as [taps, C * M]."""
    size = f_ref.shape[1]
    tap_values = plgpu.load(f_ref.at[tap, launch.index(chans, size)], mask=chans < size, other=0)
    return tap_values.astype(dtype)


def _struct(shape: tuple[int, ...], dtype: Any) -> Any:
    return jax.ShapeDtypeStruct(shape, dtype)  # type: ignore[no-untyped-call]


# A sum, or a list of sums, carried through a loop.
_Sums = TypeVar("_Sums")


class _Taps:
    """The filter taps of a program's output channels, and the loop over the filter
    rows that uses them.

    Up to ``launch.taps`` taps are loaded once per program, before its row loop,
    and the filter rows are unrolled. More would crowd the registers, so a larger
    filter loads each tap where it is used, from the cache, inside a loop over the
    filter rows: a load that depends on that loop's index cannot be hoisted out of
    the row loop (Triton 3.9 hoists loads of a fixed tap, and a 7x7 forward then
    held 255 registers and spilled).
    """

    def __init__(
        self,
        f_ref: Any,
        launch: _Launch,
        conv: Conv,
        lanes: list[jax.Array],
        dtype: Any,
    ) -> None:
        fh, fw = conv.kernel
        self._rows = fh
        self._source = (f_ref, launch, lanes, dtype)
        self._loaded: list[list[jax.Array]] | None = None
        if fh * fw * len(lanes) <= launch.taps:
            self._loaded = [[self._load(t, i) for i in range(len(lanes))] for t in range(fh * fw)]

    @property
    def unrolled(self) -> bool:
        """Whether the taps are loaded once and the filter rows unrolled."""
        return self._loaded is not None

    def __call__(self, t: Any, i: int) -> jax.Array:
        """Tap ``t`` (flat index ``di * fw + dj``) for the output channels ``lanes[i]``."""
        if self._loaded is None:
            return self._load(t, i)
        loaded: jax.Array = self._loaded[t][i]
        return loaded

    def _load(self, t: Any, i: int) -> jax.Array:
        f_ref, launch, lanes, dtype = self._source
        return _tap_vector(f_ref, launch, t, lanes[i], dtype)

    def sum_over_filter_rows(self, body: Callable[[Any, _Sums], _Sums], total: _Sums) -> _Sums:
        """``total = body(di, total)`` for the filter rows ``di`` in order, in a
        loop (the taps are loaded where they are used, not unrolled)."""
        return _kernels.fori_loop(0, self._rows, body, total)  # type: ignore[no-any-return]


def _row_loop(
    rows: Any,
    reads: list[Callable[[Any], Any]],
    reused: list[int | None],
    body: Callable[[Any, Callable[[int], Any], Any], Any],
    carry: Any,
    *,
    ahead: bool,
) -> Any:
    """``carry = body(r, item, carry)`` for ``r`` in ``range(rows)``, where
    ``item(k)`` is item ``k`` of row ``r``: ``reads[k](r)`` (a tile, or a list of
    them), read where ``body`` first asks for it, so that a loop without reuse
    holds a tile only from its read to its use; or, where ``reused[k]`` is not
    None, item ``reused[k]`` of row ``r - 1``, kept in registers rather than read
    again. Before the loop, the kept items are read as row 0 uses them.

    Where ``ahead`` (``_Launch.read_ahead``), a row's own items are read one step
    early, before row ``r - 1``'s ``body``, and carried to row ``r``; the last
    row reads its own items again for the row after it, cached and unused."""
    kept = sorted({j for j in reused if j is not None})
    own = [k for k, j in enumerate(reused) if j is None] if ahead else []
    before_first = {j: reads[k](0) for k, j in enumerate(reused) if j is not None}

    def step(r: Any, state: tuple[list[Any], list[Any], Any]) -> tuple[list[Any], list[Any], Any]:
        previous, early, carry = state
        following = [reads[k](jnp.minimum(r + 1, rows - 1)) for k in own]
        read: dict[int, Any] = dict(zip(own, early, strict=True))

        def item(k: int) -> Any:
            j = reused[k]
            if j is not None:
                return previous[kept.index(j)]
            if k not in read:
                read[k] = reads[k](r)
            return read[k]

        carry = body(r, item, carry)
        return [item(j) for j in kept], following, carry

    first = [reads[k](0) for k in own]
    _, _, carry = _kernels.fori_loop(0, rows, step, ([before_first[j] for j in kept], first, carry))
    return carry


def _shared_taps(launch: _Launch, filter_rows: int, fw: int, shift: int | None) -> list[int | None]:
    """For each tap ``di * fw + dj`` of ``filter_rows`` rows of the filter, at the
    next row, the tap that reads the same input at this row, ``(di + shift) * fw +
    dj``, where ``launch`` keeps shared rows in registers; None where it reads its
    own."""
    if shift is None or not launch.reuse_rows:
        return [None] * (filter_rows * fw)
    return [
        (di + shift) * fw + dj if 0 <= di + shift < filter_rows else None
        for di in range(filter_rows)
        for dj in range(fw)
    ]


def _tap_window(
    x_ref: Any,
    conv: Conv,
    launch: _Launch,
    n: Any,
    i: Any,
    block: Any,
    in_chans: Any,
    di: Any,
    dj: int,
    dtype: Any,
    *,
    masked_past_output: bool = False,
) -> jax.Array:
    """The input tile tap ``(di, dj)`` reads for output row ``i`` and the output
    columns of column tile ``block``, on the output's lanes; zero past the last
    output row or column where ``masked_past_output``: a filter gradient's
    infinite input there must not meet the zero the output gradient reads there."""
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    top, left = conv.pads[0][0], conv.pads[1][0]
    row, offset = i * sh - top + di * dh, dj * dw - left
    out_h, out_w = conv.out_size
    # A run of ``size`` columns from the tile's first, ``shift`` columns on.
    run = functools.partial(_read_columns, x_ref, conv, launch, n, row, block)
    if _reads_column_pairs(conv, launch):
        # Output column c reads input column 2c + offset: of the pair of columns
        # 2c + even, 2c + even + 1, with ``even`` the even number at or below
        # ``offset``, the one at ``offset - even``. The run of pairs starts at an
        # even column, as aligned as the tile, whichever the tap.
        half = offset % 2
        pairs = _kernels.lanes(block, 2 * launch.cols)  # 2c and 2c + 1, c in the tile
        row_ok, keep = (i < out_h, pairs < 2 * out_w) if masked_past_output else (True, None)
        tile = run(2 * launch.cols, offset - half, in_chans, dtype, row_ok=row_ok, keep=keep)
        pair_tile = tile.reshape(launch.cols, 2, tile.shape[1])
        tile = jnp.split(pair_tile, 2, axis=1)[half].reshape(launch.cols, tile.shape[1])
        return _on_output_lanes(tile, conv)
    cols = _kernels.lanes(block, launch.cols)
    row_ok, keep = (i < out_h, cols < out_w) if masked_past_output else (True, None)
    if sw == 1:
        tile = run(launch.cols, offset, in_chans, dtype, row_ok=row_ok, keep=keep)
        return _on_output_lanes(tile, conv)
    wanted = row_ok if keep is None else row_ok & keep
    tile = _read(x_ref, conv, launch, n, row, cols * sw + offset, in_chans, dtype, wanted=wanted)
    return _on_output_lanes(tile, conv)


def _reads_column_pairs(conv: Conv, launch: _Launch) -> bool:
    """Whether windows are read as runs of column pairs (``_Launch.wide_strided_reads``):
    in NCHW, whose columns are the minor axis, at column stride 2."""
    return launch.wide_strided_reads and conv.nchw and conv.strides[1] == 2


def _input_lanes(conv: Conv, launch: _Launch) -> jax.Array:
    """The input channels a program's tile of output channels reads: each once
    where the tile repeats them (``_repeats``), else input channel ``k`` for each
    output channel ``k * M + q``."""
    m = conv.multiplier
    out_chans = _kernels.lanes(pl.program_id(1), launch.channels)
    if m == 1:
        return out_chans  # kept an arange: the loads stay vectorizable
    if _repeats(conv):
        return _kernels.lanes(pl.program_id(1), launch.channels // m)
    return out_chans // m


def _on_output_lanes(window: jax.Array, conv: Conv) -> jax.Array:
    """An input tile read at ``_input_lanes``, as the tile of the output channels
    it feeds: each input channel repeated across its ``M`` lanes where the tile
    read it once."""
    return _repeat_lanes(window, conv.multiplier) if _repeats(conv) else window


def _repeat_lanes(tile: jax.Array, m: int) -> jax.Array:
    """``[cols, k]`` to ``[cols, k * m]``: lane ``k * m + q`` holds lane ``k``."""
    cols, k = tile.shape
    return jnp.broadcast_to(tile[:, :, None], (cols, k, m)).reshape(cols, k * m)


def _sum_lane_groups(tile: jax.Array, m: int) -> jax.Array:
    """``[cols, k * m]`` to ``[cols, k]``: lane ``k`` sums lanes ``k * m + q``."""
    cols, lanes = tile.shape
    return jnp.sum(tile.reshape(cols, lanes // m, m), axis=2)


# --------------------------------------------------------------------------------------
# Column walks (``_Launch.walk_columns``)
# --------------------------------------------------------------------------------------


# A column walk's tile (``_Launch.walk_columns``): ``_Launch.walk_channels`` at
# most, across threads of 8 (16 bytes of bfloat16 each), and rows enough for the
# other threads of its warps (``_Launch.walk_warps``), so that every thread holds
# a run of 8 channels of a row ...
_WALK_ELEMENTS = 8
# ... or of 4, for a filter of more taps than this: a thread holds one element
# of the tile for each tap (the forward's and the input gradient's taps, the
# filter gradient's sums), besides the columns the walk keeps.
_MOST_WIDE_WALK_TAPS = 16
# The fewest output columns a program walks where the row's columns are cut into
# segments, a program each: a segment first reads the columns before its own
# that its taps reach, which its neighbour reads too.
_MIN_WALK_COLUMNS = 16
# The most taps a walk holds (a 5x5 filter): one tile of sums or of taps each.
_MOST_WALK_TAPS = 25
# The most columns of each filter row a walk keeps in registers from one step to
# the next: each takes a tile, and the walk's first and last steps are unrolled.
_MOST_WALK_KEPT = 8


def _walk_steps(conv: Conv) -> list[tuple[int, int]]:
    """For each filter column ``dj``, where a walk finds the input column its tap
    reads for an output column: a walk's step reads ``s`` consecutive input
    columns (its phases; ``s`` the column stride), and output column ``w``'s own
    step begins at input column ``w * s - left``, so tap ``dj`` reads phase
    ``dj * dw % s`` of the step ``dj * dw // s`` steps after it."""
    s, dw = conv.strides[1], conv.dilations[1]
    return [divmod(dj * dw, s) for dj in range(conv.kernel[1])]


def _walk_elements(conv: Conv) -> int:
    """The channels of a row each thread of a walk holds."""
    return _WALK_ELEMENTS if math.prod(conv.kernel) <= _MOST_WIDE_WALK_TAPS else 4


def _walk_lag(conv: Conv) -> int:
    """The steps between an output column's own and the last its taps read: the
    steps a walk keeps in registers."""
    return max(steps for steps, _ in _walk_steps(conv))


def _walk_phases(conv: Conv) -> list[int]:
    """The phases of a step that some tap reads."""
    return sorted({phase for _, phase in _walk_steps(conv)})


def _walk_kept(conv: Conv) -> int:
    """The columns of each filter row a walk keeps in registers from one step to
    the next: its phases for each of the steps it keeps."""
    return _walk_lag(conv) * len(_walk_phases(conv))


def _walks_columns(conv: Conv, launch: _Launch, kernel: str) -> bool:
    """Whether ``kernel`` launched with ``launch`` walks the columns
    (``_Launch.walk_columns``): in NHWC, whose channels are the minor axis, with
    channels enough for a thread's run of them, for a filter of few enough taps
    (a walk holds a tile for each, whatever ``launch.taps`` says), keeping few
    columns from one step to the next. The input gradient walks at strides of 1
    and without a depth multiplier only: its columns and rows then read the
    output gradient's at fixed offsets, and its lanes are the output's."""
    fh, fw = conv.kernel
    input_walks = conv.strides == (1, 1) and conv.multiplier == 1
    return (
        launch.walk_columns
        and not conv.nchw
        and _tiled(conv, kernel)[1] >= _walk_elements(conv)
        and fh * fw <= _MOST_WALK_TAPS
        and _walk_kept(conv) <= _MOST_WALK_KEPT
        and (kernel != "input" or input_walks)
    )


def _walk_launch(conv: Conv, launch: _Launch, kernel: str) -> _Launch:
    """``launch`` with a column walk's tile, ``rows`` output rows by ``channels``,
    and the ``cols`` output columns one program walks: the whole row where that
    makes warps enough (``_Launch.walk_grid_warps``), else equal segments of it, the
    longest that do, of ``_MIN_WALK_COLUMNS`` at least; then, if the warps are
    still too few, fewer rows, though some threads then hold no channels of
    their own."""
    (tile_rows, width), lanes = _tiled(conv, kernel)
    chans = min(pl.next_power_of_2(lanes), launch.walk_channels)
    warps = launch.walk_warps
    rows = min(pl.next_power_of_2(tile_rows), 32 * warps * _walk_elements(conv) // chans)
    walk = dataclasses.replace(launch, channels=chans, rows=rows, cols=width, warps=warps)

    def grid_warps(walk: _Launch) -> int:
        return math.prod(_walk_grid(conv, walk, kernel)) * walk.warps

    shortest = min(width, _MIN_WALK_COLUMNS)
    segments = [c for c in range(width, shortest - 1, -1) if width % c == 0]
    for cols in segments:
        walk = dataclasses.replace(walk, cols=cols)
        if grid_warps(walk) >= launch.walk_grid_warps:
            break
    while walk.rows > 1 and grid_warps(walk) < launch.walk_grid_warps:
        walk = dataclasses.replace(walk, rows=walk.rows // 2)
    return walk


def _chosen(
    conv: Conv,
    interpret: bool,
    kernel: str,
    tiled: Callable[..., None],
    walked: Callable[..., None],
) -> tuple[_Launch, Callable[..., None], tuple[int, int, int]]:
    """``kernel``'s launch, kernel function and grid: the column walk (``walked``)
    where its launch asks for one and one applies, else the tiled ``tiled``."""
    launch = _launch(conv, interpret, kernel)
    if _walks_columns(conv, launch, kernel):
        launch = _walk_launch(conv, launch, kernel)
        return launch, walked, _walk_grid(conv, launch, kernel)
    return launch, tiled, _grid(conv, launch, kernel)


def _walk_grid(conv: Conv, launch: _Launch, kernel: str) -> tuple[int, int, int]:
    """A walk's programs: images x row blocks, channel blocks, and segments of
    the row's columns."""
    (_, width), lanes = _tiled(conv, kernel)
    channel_blocks = pl.cdiv(lanes, launch.channels)
    return (_row_programs(conv, launch, kernel), channel_blocks, width // launch.cols)


def _read_rows(
    ref: Any,
    launch: _Launch,
    n: Any,
    rows: jax.Array,
    col: Any,
    chans: Any,
    dtype: Any,
    wanted: Any,
) -> jax.Array:
    """The ``[len(rows), len(chans)]`` tile of an NHWC array at one column, as
    ``dtype``, zero where a row, the column or a channel lies outside the array,
    or where ``wanted`` (one flag per row) is false."""
    _, h, w, c = ref.shape
    row_inside = (rows >= 0) & (rows < h) & wanted & (col >= 0) & (col < w)
    inside = row_inside[:, None] & ((chans >= 0) & (chans < c))[None, :]
    index = (
        n,
        launch.index(rows, h)[:, None],
        jnp.clip(col, 0, w - 1),
        launch.index(chans, c)[None, :],
    )
    return plgpu.load(ref.at[index], mask=inside, other=0).astype(dtype)


def _write_rows(
    ref: Any, launch: _Launch, n: Any, rows: jax.Array, col: Any, chans: Any, tile: jax.Array
) -> None:
    """Stores a ``[len(rows), len(chans)]`` tile of an NHWC array at one column
    inside it; rows and channels outside the array are not written."""
    _, h, _, c = ref.shape
    inside = (rows < h)[:, None] & (chans < c)[None, :]
    index = (
        n,
        launch.index(rows, h, store=True)[:, None],
        col,
        launch.index(chans, c, store=True)[None, :],
    )
    plgpu.store(ref.at[index], tile.astype(ref.dtype), mask=inside)


_Carry = TypeVar("_Carry")
_Read = TypeVar("_Read")


def _walk(
    read: Callable[[Any, bool], _Read],
    step: Callable[[Any, _Read, _Carry, bool], _Carry],
    carry: _Carry,
    lag: int,
    steps: int,
    looped: range,
) -> _Carry:
    """``carry = step(t, read(t, unrolled), carry, unrolled)`` for the steps ``t``
    in ``range(steps)``: those of ``looped`` in a loop of ``lag + 1`` steps an
    iteration, so that the columns a step keeps for the ``lag`` steps after it
    stay in their registers rather than move each step; the others, and what the
    loop leaves over, unrolled (``unrolled``: ``t`` is known, and a step can
    leave out what it would not compute there).

    An iteration makes every read of its steps before the first step's
    arithmetic. A warp waits for a load where it first uses the value, and the
    GPU's compiler does not move a load above an earlier store (the forward's
    and the input gradient's steps each write a column): read step by step,
    each step's loads would wait for the step before to finish, a wait on
    memory a step rather than one an iteration."""
    per_iteration = lag + 1
    iterations = len(looped) // per_iteration
    for t in range(looped.start):
        carry = step(t, read(t, True), carry, True)

    def iteration(i: Any, carry: _Carry) -> _Carry:
        ts = [looped.start + i * per_iteration + k for k in range(per_iteration)]
        reads = [read(t, False) for t in ts]
        for t, tiles in zip(ts, reads, strict=True):
            carry = step(t, tiles, carry, False)
        return carry

    if iterations:
        carry = _kernels.fori_loop(0, iterations, iteration, carry)
    for t in range(looped.start + iterations * per_iteration, steps):
        carry = step(t, read(t, True), carry, True)
    return carry


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


def _forward_kernel(x_ref: Any, f_ref: Any, y_ref: Any, *, conv: Conv, launch: _Launch) -> None:
    dtype = _checks.compute_dtype(x_ref.dtype)
    n, first = _image_and_first_row(pl.program_id(0), conv, launch, "forward")
    out_chans = _kernels.lanes(pl.program_id(1), launch.channels)
    col_block = pl.program_id(2)
    out_cols = _kernels.lanes(col_block, launch.cols)
    in_chans = _input_lanes(conv, launch)
    sh, dh = conv.strides[0], conv.dilations[0]
    fh, fw = conv.kernel
    taps = _Taps(f_ref, launch, conv, [out_chans], dtype)
    zeros = jnp.zeros((launch.cols, launch.channels), dtype)

    def window(i: Any, di: Any, dj: int) -> jax.Array:
        return _tap_window(x_ref, conv, launch, n, i, col_block, in_chans, di, dj, dtype)

    if taps.unrolled:
        # Output row i + 1's filter row di reads the input row that filter row
        # di + sh / dh reads for row i.
        shift = sh // dh if sh % dh == 0 else None

        def read(t: int) -> Callable[[Any], jax.Array]:
            return lambda r: window(first + r, *divmod(t, fw))

        def sum_row(r: Any, item: Callable[[int], jax.Array], carry: None) -> None:
            total = zeros
            for t in range(fh * fw):
                total = total + item(t) * taps(t, 0)[None, :]
            _write(y_ref, conv, launch, n, first + r, out_cols, out_chans, total)
            return carry

        reads = [read(t) for t in range(fh * fw)]
        shared = _shared_taps(launch, fh, fw, shift)
        _row_loop(launch.rows, reads, shared, sum_row, None, ahead=launch.read_ahead)
        return

    # More taps than registers hold: the taps are loaded where they are used, in a
    # loop over the filter rows.
    def row(r: Any, carry: None) -> None:
        i = first + r

        def filter_row(di: Any, total: jax.Array) -> jax.Array:
            for dj in range(fw):
                total = total + window(i, di, dj) * taps(di * fw + dj, 0)[None, :]
            return total

        total = taps.sum_over_filter_rows(filter_row, zeros)
        _write(y_ref, conv, launch, n, i, out_cols, out_chans, total)
        return carry

    _kernels.fori_loop(0, launch.rows, row, None)


def _walk_sums(
    read: Callable[[int, Any], jax.Array],
    write: Callable[[Any, jax.Array], None],
    taps: _Taps,
    conv: Conv,
    zero: jax.Array,
    *,
    outputs: int,
    first: Any,
    stride: int,
    kept: list[tuple[int, int]],
) -> None:
    """Walks a program's ``outputs`` columns (``_walk``): the forward's and the
    input gradient's.

    Step ``t`` reads, for each filter row ``di``, the columns ``first + stride *
    t + p`` of the array the sums read (``read(di, column)``, a tile of
    ``zero``'s shape) for the phases ``p`` its taps use, and keeps them in
    registers for the steps after it. From step ``lag`` on, the program's output
    column ``t - lag`` (counted from its first) has every column its taps read:
    tap ``(di, dj)`` reads phase ``kept[dj][1]`` of the step ``kept[dj][0]``
    steps before. It is summed tap by tap, in the tiled kernels' order, and
    written (``write(column, tile)``).
    """
    fh, fw = conv.kernel
    lag = max(back for back, _ in kept)
    phases = sorted({phase for _, phase in kept})

    def columns(t: Any, unrolled: bool) -> list[dict[int, jax.Array]]:
        """Step ``t``'s columns, by filter row and phase."""
        return [{p: read(di, first + stride * t + p) for p in phases} for di in range(fh)]

    def step(
        t: Any, new: list[dict[int, jax.Array]], recent: list[list[Any]], unrolled: bool
    ) -> list[list[Any]]:
        """Step ``t``, whose columns are ``new``. ``recent[di][k]``: filter row
        ``di``'s columns of step ``t - 1 - k`` by phase (None before the first)."""
        window = [[new[di], *recent[di]] for di in range(fh)]
        if not unrolled or t >= lag:  # the first steps only read
            total = zero
            for di in range(fh):
                for dj, (back, phase) in enumerate(kept):
                    total = total + window[di][back][phase] * taps(di * fw + dj, 0)[None, :]
            write(t - lag, total)
        return [row[:lag] for row in window]

    recent: list[list[Any]] = [[None] * lag for _ in range(fh)]
    _walk(columns, step, recent, lag, lag + outputs, range(lag, lag + outputs))


def _walk_forward_kernel(
    x_ref: Any, f_ref: Any, y_ref: Any, *, conv: Conv, launch: _Launch
) -> None:
    """A program's output rows, walking their columns or a segment of them
    (``_walk_sums``): output column ``w`` reads input column ``w * sw + dj * dw -
    left`` through tap ``(di, dj)``, at the rows ``i * sh - top + di * dh`` of the
    tile's rows ``i``."""
    dtype = _checks.compute_dtype(x_ref.dtype)
    n, first = _image_and_first_row(pl.program_id(0), conv, launch, "forward")
    start = pl.program_id(2) * launch.cols  # the program's first output column
    out_chans = _kernels.lanes(pl.program_id(1), launch.channels)
    in_chans = _input_lanes(conv, launch)
    (sh, sw), dh = conv.strides, conv.dilations[0]
    top, left = conv.pads[0][0], conv.pads[1][0]
    rows = first + jnp.arange(launch.rows, dtype=jnp.int32)
    rows_ok = rows < conv.out_size[0]

    def read(di: int, col: Any) -> jax.Array:
        x_rows = rows * sh - top + di * dh
        column = _read_rows(x_ref, launch, n, x_rows, col, in_chans, dtype, rows_ok)
        return _on_output_lanes(column, conv)

    def write(col: Any, tile: jax.Array) -> None:
        _write_rows(y_ref, launch, n, rows, start + col, out_chans, tile)

    taps = _Taps(f_ref, launch, conv, [out_chans], dtype)
    zero = jnp.zeros((launch.rows, launch.channels), dtype)
    # Output column w's own step begins at input column w * sw - left; its last
    # tap's step comes ``lag`` steps after.
    lag = _walk_lag(conv)
    kept = [(lag - steps, phase) for steps, phase in _walk_steps(conv)]
    first = start * sw - left
    outputs = launch.cols
    _walk_sums(read, write, taps, conv, zero, outputs=outputs, first=first, stride=sw, kept=kept)


def _walk_input_kernel(
    f_ref: Any, dy_ref: Any, dx_ref: Any, *, conv: Conv, launch: _Launch
) -> None:
    """A program's input-gradient rows, walking their columns or a segment of
    them (``_walk_sums``), at strides of 1 and without a multiplier: input column
    ``u`` reads the output gradient's column ``u + left - dj * dw`` through tap
    ``(di, dj)``, at the rows ``r + top - di * dh`` of the tile's rows ``r``."""
    dtype = _checks.compute_dtype(dy_ref.dtype)
    n, first = _image_and_first_row(pl.program_id(0), conv, launch, "input")
    start = pl.program_id(2) * launch.cols  # the program's first input column
    chans = _kernels.lanes(pl.program_id(1), launch.channels)
    dh, dw = conv.dilations
    span = (conv.kernel[1] - 1) * dw
    top, left = conv.pads[0][0], conv.pads[1][0]
    rows = first + jnp.arange(launch.rows, dtype=jnp.int32)
    rows_ok = rows < conv.in_size[0]

    def read(di: int, col: Any) -> jax.Array:
        dy_rows = rows + top - di * dh
        return _read_rows(dy_ref, launch, n, dy_rows, col, chans, dtype, rows_ok)

    def write(col: Any, tile: jax.Array) -> None:
        _write_rows(dx_ref, launch, n, rows, start + col, chans, tile)

    taps = _Taps(f_ref, launch, conv, [chans], dtype)
    zero = jnp.zeros((launch.rows, launch.channels), dtype)
    # Input column u's taps read output-gradient columns u + left - span to u +
    # left, tap (di, dj) the one dj * dw before the last.
    kept = [(dj * dw, 0) for dj in range(conv.kernel[1])]
    first = start + left - span
    _walk_sums(read, write, taps, conv, zero, outputs=launch.cols, first=first, stride=1, kept=kept)


def refusal(conv: Conv) -> str | None:
    """Why the kernels cannot compute ``conv``, or None: they launch programs per
    block of images, so they need the batch's length."""
    if _checks.is_symbolic(conv.batch):
        return f"a symbolic batch ({conv.batch})"
    return None


def forward(x: jax.Array, f: jax.Array, conv: Conv, *, interpret: bool) -> jax.Array:
    launch, kernel, grid = _chosen(
        conv, interpret, "forward", _forward_kernel, _walk_forward_kernel
    )
    fh, fw = conv.kernel
    channels = conv.channels * conv.multiplier
    return launch.call(
        functools.partial(kernel, conv=conv),
        _struct(conv.output_shape, x.dtype),
        grid,
        x,
        f.reshape(fh * fw, channels),
    )


# --------------------------------------------------------------------------------------
# Input gradient
# --------------------------------------------------------------------------------------


def _source(position: Any, offset: int, stride: int, size: int) -> tuple[Any, Any]:
    """The output index that reads ``position`` through a tap at ``offset``, and
    whether there is one: ``position + offset`` must be a non-negative multiple
    of ``stride`` below ``size * stride``. At stride 1 the index is the shifted
    position itself (an ``arange`` plus an offset, for vectorized loads)."""
    shifted = position + offset
    if stride == 1:
        return shifted, (shifted >= 0) & (shifted < size)
    start = jnp.maximum(shifted, 0)
    step = jnp.asarray(stride, start.dtype)
    index = lax.div(start, step)
    return index, (shifted >= 0) & (lax.rem(start, step) == 0) & (index < size)


def _phase_taps(conv: Conv, phase: int) -> list[int]:
    """The filter columns ``dj`` whose taps reach the input columns of ``phase``,
    ``c * sw + phase``. Output column ``j`` reads input column ``j * sw - left +
    dj * dw`` through tap column ``dj``, so at stride ``sw`` a tap column reaches
    every column of a phase or none of them."""
    sw, dw, left = conv.strides[1], conv.dilations[1], conv.pads[1][0]
    return [dj for dj in range(conv.kernel[1]) if (phase + left - dj * dw) % sw == 0]


def _column_shift(conv: Conv, phase: int, dj: int) -> int:
    """Where the output columns lie that tap column ``dj`` brings to the input
    columns ``c * sw + phase`` of a phase it reaches (``_phase_taps``): at ``c``
    plus this shift."""
    sw, dw, left = conv.strides[1], conv.dilations[1], conv.pads[1][0]
    return (phase + left - dj * dw) // sw


def _phase_columns(col_block: Any, cols: int, conv: Conv, phases: tuple[int, ...]) -> Any:
    """The input columns ``c * sw + phase`` for the ``cols`` indices ``c`` of
    column block ``col_block``; for both phases of stride 2
    (``_writes_column_pairs``), the ``2 * cols`` columns ``2c`` and ``2c + 1``
    in order."""
    if len(phases) == 2:
        return _kernels.lanes(col_block, 2 * cols)
    block = _kernels.lanes(col_block, cols)
    sw = conv.strides[1]
    return block if sw == 1 else block * sw + phases[0]


def _writes_column_pairs(conv: Conv, launch: _Launch) -> bool:
    """Whether the input gradient writes both column phases of its tile as one run
    (``_Launch.wide_strided_writes``): in NCHW, whose columns are the minor axis,
    at column stride 2."""
    return launch.wide_strided_writes and conv.nchw and conv.strides[1] == 2


def _interleave_columns(even: jax.Array, odd: jax.Array) -> jax.Array:
    """``[cols, k]`` twice to ``[2 * cols, k]``: row ``2c`` holds ``even``'s row
    ``c``, row ``2c + 1`` ``odd``'s. Triton stacks two tiles only along a new
    minor axis, so the pairs are formed there and moved beside their rows."""
    cols, k = even.shape
    pairs = jnp.stack([even, odd], axis=-1)  # [cols, k, 2]
    return jnp.swapaxes(pairs, 1, 2).reshape(2 * cols, k)


def _reached_gradients(
    dy_ref: Any,
    conv: Conv,
    launch: _Launch,
    n: Any,
    p: Any,
    col_block: Any,
    di: Any,
    shift: int,
    out_lanes: list[jax.Array],
    dtype: Any,
) -> list[jax.Array]:
    """The output-gradient tiles a tap of filter row ``di`` brings to input row
    ``p`` and the columns of a phase it reaches at column block ``col_block``, one
    per list of output lanes: the output columns ``c + shift`` for the tile's
    indices ``c`` (``_column_shift``), a run that Triton can read in vectors. Rows
    no output reads through the tap, and columns past the output's edges, are
    masked."""
    sh, dh = conv.strides[0], conv.dilations[0]
    top = conv.pads[0][0]
    i, row_reached = _source(p, top - di * dh, sh, conv.out_size[0])
    j = _kernels.lanes(col_block, launch.cols) + shift
    keep = (j >= 0) & (j < conv.out_size[1])
    read = functools.partial(_read_columns, dy_ref, conv, launch, n, i, col_block, launch.cols)
    return [read(shift, lanes, dtype, row_ok=row_reached, keep=keep) for lanes in out_lanes]


def _input_kernel(f_ref: Any, dy_ref: Any, dx_ref: Any, *, conv: Conv, launch: _Launch) -> None:
    dtype = _checks.compute_dtype(dy_ref.dtype)
    m = conv.multiplier
    n, first = _image_and_first_row(pl.program_id(0), conv, launch, "input")
    col_block = pl.program_id(2)
    repeats = _repeats(conv)
    if repeats:
        # The lanes are output channels, read in contiguous tiles; each input
        # channel's M lanes are summed once, before the write.
        out_lanes = [_kernels.lanes(pl.program_id(1), launch.channels)]
        chans = _kernels.lanes(pl.program_id(1), launch.channels // m)
    else:
        chans = _kernels.lanes(pl.program_id(1), launch.channels)
        out_lanes = [chans * m + q for q in range(m)]
    dh = conv.dilations[0]
    fh, fw = conv.kernel
    taps = _Taps(f_ref, launch, conv, out_lanes, dtype)
    zeros = jnp.zeros((launch.cols, launch.channels), dtype)

    def add_tap(t: Any, tiles: list[jax.Array], total: jax.Array) -> jax.Array:
        for q, grad in enumerate(tiles):
            total = total + grad * taps(t, q)[None, :]
        return total

    def if_row_reached(p: Any, di: Any, add_row: Callable[[Any], Any], totals: Any) -> Any:
        """``add_row(totals)`` where an output row reads input row ``p`` through
        filter row ``di``, else ``totals``. At a stride ``sh`` a filter row
        reaches one input row in ``sh``, so a branch skips the loads and products
        of the others; at stride 1 it reaches all but those at the edges, whose
        loads stay masked, without a branch. Which rows a filter row reaches does
        not depend on the column phase: one branch serves every phase."""
        sh, top = conv.strides[0], conv.pads[0][0]
        if sh == 1:
            return add_row(totals)
        _, reached = _source(p, top - di * dh, sh, conv.out_size[0])
        return lax.cond(reached, add_row, lambda totals: totals, totals)

    def phases_rows(phases: tuple[int, ...]) -> None:
        """Writes the program's rows at the input columns of ``phases``: one phase,
        or both of stride 2, interleaved (``_writes_column_pairs``). Each tap
        column reaches all of a phase's columns or none (``_phase_taps``), so only
        the taps that reach them are read, each at the output columns of the
        tile's indices plus a shift: at stride 1 there is one phase, every tap
        reaches it. Taps of one filter row with the same shift (one in each
        phase) read one tile."""
        reaching = {
            phase: [di * fw + dj for di in range(fh) for dj in _phase_taps(conv, phase)]
            for phase in phases
        }

        def source(phase: int, t: int) -> tuple[int, int]:
            """The filter row and the shift of the tile that tap ``t`` reads."""
            di, dj = divmod(t, fw)
            return di, _column_shift(conv, phase, dj)

        def gradients(p: Any, di: Any, shift: int) -> list[jax.Array]:
            return _reached_gradients(
                dy_ref, conv, launch, n, p, col_block, di, shift, out_lanes, dtype
            )

        def write(p: Any, totals: list[jax.Array]) -> None:
            if repeats:
                totals = [_sum_lane_groups(total, m) for total in totals]
            tile = totals[0] if len(totals) == 1 else _interleave_columns(*totals)
            cols = _phase_columns(col_block, launch.cols, conv, phases)
            _write(dx_ref, conv, launch, n, p, cols, chans, tile)

        if taps.unrolled:
            # The tiles the phases read, each once, by (filter row, shift).
            sources = list(dict.fromkeys(source(p, t) for p in phases for t in reaching[p]))
            # Input row p + 1's filter row di reads the output-gradient row that
            # filter row di - 1 reads for row p, when the filter is not dilated.
            kept = launch.reuse_rows and dh == 1
            reused = [
                sources.index((di - 1, shift)) if kept and di > 0 else None for di, shift in sources
            ]

            def read(k: int) -> Callable[[Any], list[jax.Array]]:
                return lambda r: gradients(first + r, *sources[k])

            def add_filter_row(
                item: Callable[[int], list[jax.Array]], di: int, totals: list[jax.Array]
            ) -> list[jax.Array]:
                added = []
                for phase, total in zip(phases, totals, strict=True):
                    for t in reaching[phase]:
                        if t // fw == di:
                            total = add_tap(t, item(sources.index(source(phase, t))), total)
                    added.append(total)
                return added

            def sum_row(r: Any, item: Callable[[int], list[jax.Array]], carry: None) -> None:
                p = first + r
                totals = [zeros] * len(phases)
                for di in range(fh):
                    read_tile = item
                    if launch.reuse_rows and conv.strides[0] > 1:
                        # A kept row is read for the next row whether or not this
                        # one uses it, so the reads come before the branch; the
                        # products and sums stay in it, as without kept rows.
                        tiles = {k: item(k) for k, (row, _) in enumerate(sources) if row == di}
                        read_tile = tiles.__getitem__
                    add_row = functools.partial(add_filter_row, read_tile, di)
                    totals = if_row_reached(p, di, add_row, totals)
                write(p, totals)
                return carry

            reads = [read(k) for k in range(len(sources))]
            _row_loop(launch.rows, reads, reused, sum_row, None, ahead=launch.read_ahead)
            return

        # More taps than registers hold: the taps are loaded where they are used,
        # in a loop over the filter rows.
        def row(r: Any, carry: None) -> None:
            p = first + r

            def filter_row(di: Any, totals: list[jax.Array]) -> list[jax.Array]:
                def add_row(totals: list[jax.Array]) -> list[jax.Array]:
                    tiles: dict[int, list[jax.Array]] = {}
                    added = []
                    for phase, total in zip(phases, totals, strict=True):
                        for dj in _phase_taps(conv, phase):
                            shift = _column_shift(conv, phase, dj)
                            if shift not in tiles:
                                tiles[shift] = gradients(p, di, shift)
                            total = add_tap(di * fw + dj, tiles[shift], total)
                        added.append(total)
                    return added

                return if_row_reached(p, di, add_row, totals)  # type: ignore[no-any-return]

            write(p, taps.sum_over_filter_rows(filter_row, [zeros] * len(phases)))
            return carry

        _kernels.fori_loop(0, launch.rows, row, None)

    if _writes_column_pairs(conv, launch):
        phases_rows((0, 1))
    else:
        for phase in range(conv.strides[1]):
            phases_rows((phase,))


def input_gradient(f: jax.Array, dy: jax.Array, conv: Conv, *, interpret: bool) -> jax.Array:
    launch, kernel, grid = _chosen(conv, interpret, "input", _input_kernel, _walk_input_kernel)
    fh, fw = conv.kernel
    return launch.call(
        functools.partial(kernel, conv=conv),
        _struct(conv.input_shape, dy.dtype),
        grid,
        f.reshape(fh * fw, conv.channels * conv.multiplier),
        dy,
    )


# --------------------------------------------------------------------------------------
# Filter gradient
# --------------------------------------------------------------------------------------


def _tap_groups(conv: Conv, launch: _Launch) -> list[tuple[int, int]]:
    """The taps, flat index ``di * fw + dj``, cut into runs of whole filter rows of
    at most ``launch.taps`` taps (one row when a row alone is longer)."""
    fh, fw = conv.kernel
    rows = max(1, launch.taps // fw)
    return [(top * fw, min(top + rows, fh) * fw) for top in range(0, fh, rows)]


def _partials_kernel(
    x_ref: Any, dy_ref: Any, part_ref: Any, *, conv: Conv, launch: _Launch
) -> None:
    dtype = _checks.compute_dtype(x_ref.dtype)
    groups = _tap_groups(conv, launch)
    program, group = divmod(pl.program_id(0), len(groups))  # the group varies fastest
    n, first = _image_and_first_row(program, conv, launch, "filter")
    out_chans = _kernels.lanes(pl.program_id(1), launch.channels)
    in_chans = _input_lanes(conv, launch)
    sh, dh = conv.strides[0], conv.dilations[0]
    fw = conv.kernel[1]
    col_tiles = pl.cdiv(conv.out_size[1], launch.cols)
    # Output row i + 1's filter row di reads the input row that filter row
    # di + sh / dh reads for row i.
    shift = sh // dh if sh % dh == 0 else None

    def group_partials(top: Any, filter_rows: int) -> None:
        """The partials of filter rows ``top`` to ``top + filter_rows - 1``."""
        taps = filter_rows * fw

        def reads(c: Any) -> list[Callable[[Any], jax.Array]]:
            """What a row reads in column tile ``c``, by row: item 0 the output
            gradient's tile, item 1 + k the window of the group's tap k."""
            cols = _kernels.lanes(c, launch.cols)

            def read_window(k: int) -> Callable[[Any], jax.Array]:
                row, dj = divmod(k, fw)
                return lambda r: _tap_window(
                    x_ref,
                    conv,
                    launch,
                    n,
                    first + r,
                    c,
                    in_chans,
                    top + row,
                    dj,
                    dtype,
                    masked_past_output=True,
                )

            def read_gradient(r: Any) -> jax.Array:
                return _read(dy_ref, conv, launch, n, first + r, cols, out_chans, dtype)

            return [read_gradient, *(read_window(k) for k in range(taps))]

        def add_row(
            r: Any, item: Callable[[int], jax.Array], sums: tuple[jax.Array, ...]
        ) -> tuple[jax.Array, ...]:
            grad = item(0)
            return tuple(total + item(1 + k) * grad for k, total in enumerate(sums))

        def rows_of_col_tile(c: Any, sums: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            # The rows stop at the last output row: a window kept from the row
            # before is not masked again.
            rows = jnp.minimum(launch.rows, conv.out_size[0] - first)
            shared = _shared_taps(launch, filter_rows, fw, shift)
            reused = [None, *(None if k is None else 1 + k for k in shared)]
            loop = _row_loop(rows, reads(c), reused, add_row, sums, ahead=launch.read_ahead)
            return loop  # type: ignore[no-any-return]

        def col_tiles_of_row(r: Any, sums: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            def col_tile(c: Any, sums: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
                tile_reads = reads(c)
                return add_row(r, lambda k: tile_reads[k](r), sums)

            return _kernels.fori_loop(0, col_tiles, col_tile, sums)  # type: ignore[no-any-return]

        zeros = (jnp.zeros((launch.cols, launch.channels), dtype),) * taps
        if launch.reuse_rows:
            # Rows kept in registers are shared down a column tile, so the loop
            # over a tile's rows runs inside the loop over the tiles.
            sums = _kernels.fori_loop(0, col_tiles, rows_of_col_tile, zeros)
        else:
            sums = _kernels.fori_loop(0, launch.rows, col_tiles_of_row, zeros)
        _store_partials(part_ref, launch, program, top * fw, out_chans, sums)

    # Every group of ``full_rows`` filter rows runs one body of code, which takes
    # the group's first filter row as a value: Triton's compile time grows faster
    # than the code it compiles, and a body per group made a 7x7 filter's gradient
    # 4-12x slower to compile. A last, shorter group has a body of
    # its own. Where one group is full, its rows stay constants, so the compiler
    # can drop the bounds checks a constant row rules out.
    fh = conv.kernel[0]
    full_rows = groups[0][1] // fw
    full_groups, last_rows = divmod(fh, full_rows)
    top = 0 if full_groups == 1 else group * full_rows
    if not last_rows:
        group_partials(top, full_rows)
        return
    lax.cond(group < full_groups, lambda: group_partials(top, full_rows), lambda: None)
    lax.cond(group == full_groups, lambda: group_partials(fh - last_rows, last_rows), lambda: None)


def _store_partials(
    part_ref: Any,
    launch: _Launch,
    program: Any,
    first_tap: Any,
    out_chans: jax.Array,
    sums: tuple[jax.Array, ...],
) -> None:
    """Writes a program's sums of the taps from ``first_tap`` on, each summed over
    its tile's columns, as its partials ``[program, tap, channel]``."""
    size = part_ref.shape[2]
    lanes = launch.index(out_chans, size, store=True)
    for k, total in enumerate(sums):
        tap = first_tap + k
        plgpu.store(part_ref.at[program, tap, lanes], jnp.sum(total, axis=0), mask=out_chans < size)


def _walk_partials_kernel(
    x_ref: Any, dy_ref: Any, part_ref: Any, *, conv: Conv, launch: _Launch
) -> None:
    """A program's partials of the filter gradient, walking its rows' columns or
    a segment of them.

    The tile is a block of output rows by a block of channels, and the program
    owns the output gradient's columns ``start`` to ``start + cols - 1``. Step
    ``t`` reads the output gradient's column ``start + t`` and, for each filter
    row, at the rows it reads for the tile's rows, the input columns of that
    output column's own step (``_walk_steps``: ``sw`` columns from ``(start + t)
    * sw - left``, the phases some tap reads). Tap ``(di, dj)`` multiplies its
    phase by the output gradient's column it pairs with, read ``dj * dw // sw``
    steps before and kept in registers since. Where that column lies outside the
    program's (the walk's first and last steps) the product is left out, not
    taken with a zero: an infinite input there must not make a NaN. Each tap's
    sums are added over the columns in order, then over the tile's rows, in
    float32: one partial per row block and segment.
    """
    dtype = _checks.compute_dtype(x_ref.dtype)
    n, first = _image_and_first_row(pl.program_id(0), conv, launch, "filter")
    segments = conv.out_size[1] // launch.cols
    start = pl.program_id(2) * launch.cols
    out_chans = _kernels.lanes(pl.program_id(1), launch.channels)
    in_chans = _input_lanes(conv, launch)
    (fh, fw), (sh, sw), dh = conv.kernel, conv.strides, conv.dilations[0]
    top, left = conv.pads[0][0], conv.pads[1][0]
    rows = first + jnp.arange(launch.rows, dtype=jnp.int32)
    rows_ok = rows < conv.out_size[0]  # past the last output row, the input reads as zero too
    cols, lag, kept = launch.cols, _walk_lag(conv), _walk_steps(conv)

    Sums = tuple[list[jax.Array], list[Any]]
    Columns = tuple[Any, list[dict[int, jax.Array]]]

    def inside(t: Any, unrolled: bool) -> list[int]:
        """The filter columns whose products step ``t`` adds: an ``unrolled`` step
        leaves out those whose output column lies outside the program's; a looped
        step has none."""
        return [dj for dj in range(fw) if not unrolled or 0 <= t - kept[dj][0] < cols]

    def columns(t: Any, unrolled: bool) -> Columns:
        """Step ``t``'s columns: the output gradient's column ``start + t`` (None
        past the program's last), and for each filter row its input columns by
        the phases its taps read."""
        newest = None
        if not unrolled or t < cols:
            newest = _read_rows(dy_ref, launch, n, rows, start + t, out_chans, dtype, rows_ok)
        phases = sorted({kept[dj][1] for dj in inside(t, unrolled)})
        by_row = []
        for di in range(fh):
            x_rows = rows * sh - top + di * dh
            by_phase = {}
            for p in phases:
                x_col = (start + t) * sw - left + p
                column = _read_rows(x_ref, launch, n, x_rows, x_col, in_chans, dtype, rows_ok)
                by_phase[p] = _on_output_lanes(column, conv)
            by_row.append(by_phase)
        return newest, by_row

    def step(t: Any, new: Columns, carry: Sums, unrolled: bool) -> Sums:
        """Step ``t``, whose columns are ``new``. ``carry``: the taps' sums, and
        ``recent[k]``, the output gradient's column ``start + t - 1 - k`` (None
        where the walk's first steps would read one before the program's)."""
        (newest, by_row), (sums, recent) = new, (list(carry[0]), carry[1])
        window = [newest, *recent]  # window[k]: column start + t - k
        for di in range(fh):
            for dj in inside(t, unrolled):
                back, phase = kept[dj]
                sums[di * fw + dj] = sums[di * fw + dj] + by_row[di][phase] * window[back]
        return sums, window[:lag]

    zeros = [jnp.zeros((launch.rows, launch.channels), dtype)] * (fh * fw)
    # Every step from the lag-th on reads columns that each tap pairs with, until
    # the program's last.
    looped = range(lag, max(lag, cols))
    sums, _ = _walk(columns, step, (zeros, [None] * lag), lag, cols + lag, looped)
    partial = pl.program_id(0) * segments + pl.program_id(2)
    _store_partials(part_ref, launch, partial, 0, out_chans, tuple(sums))


# The partials are added up by programs of 4 warps in blocks of this many elements
# (16 KiB of float32: each of 128 threads has eight 128-bit loads in flight at
# once, and a program waits on memory once per block) ...
_SUM_WARPS = 4
_SUM_BLOCK = 4096
# ... spanning this many of the filter gradient's elements at most, one program
# for each such span; the rest of a block is more programs' partials.
_SUM_LANES = 32


def _sum_block(size: int) -> tuple[int, int]:
    """The (partials, elements) of a block when the filter gradient has ``size``
    elements: a small filter's block takes more partials."""
    lanes = min(pl.next_power_of_2(size), _SUM_LANES)
    return _SUM_BLOCK // lanes, lanes


def _sum_kernel(part_ref: Any, out_ref: Any, *, block: tuple[int, int], launch: _Launch) -> None:
    """Adds the partials of all programs up in a fixed order. The blocks of
    ``block[0]`` partials are added elementwise, one after another, so that row
    ``r`` of the running total sums partials ``r, r + block[0], ...`` in turn; then
    the total's rows are summed as one tree, the same shape every time. Only that
    last sum crosses threads: the loop itself needs no barrier."""
    programs, size = part_ref.shape
    block_rows, block_lanes = block
    lanes = _kernels.lanes(pl.program_id(0), block_lanes)
    inside = lanes < size

    def add_block(b: Any, total: jax.Array) -> jax.Array:
        rows = _kernels.lanes(b, block_rows)
        partials = plgpu.load(
            part_ref.at[launch.index(rows, programs)[:, None], launch.index(lanes, size)[None, :]],
            mask=(rows < programs)[:, None] & inside[None, :],
            other=0,
        )
        return total + partials

    blocks = pl.cdiv(programs, block_rows)
    zeros = jnp.zeros(block, part_ref.dtype)
    total = jnp.sum(_kernels.fori_loop(0, blocks, add_block, zeros), axis=0)
    plgpu.store(
        out_ref.at[launch.index(lanes, size, store=True)],
        total.astype(out_ref.dtype),
        mask=inside,
    )


def filter_gradient(
    x: jax.Array, dy: jax.Array, conv: Conv, *, interpret: bool, dtype: Any = None
) -> jax.Array:
    """The filter gradient, in ``dtype`` (default: the input's; the sums stay in
    float32 for a caller that adds several up before it rounds)."""
    out_dtype = x.dtype if dtype is None else dtype
    launch, kernel, grid = _chosen(
        conv, interpret, "filter", _partials_kernel, _walk_partials_kernel
    )
    fh, fw = conv.kernel
    channels = conv.channels * conv.multiplier
    # One partial per tap and channel from each block of rows (and a walk's
    # segment of columns; the tiled programs have one block of columns).
    programs = _row_programs(conv, launch, "filter") * grid[2]
    partials = launch.call(
        functools.partial(kernel, conv=conv),
        _struct((programs, fh * fw, channels), _checks.compute_dtype(x.dtype)),
        grid,
        x,
        dy,
    )
    return _sum_partials(partials, conv, launch, out_dtype)


def _sum_partials(partials: jax.Array, conv: Conv, launch: _Launch, dtype: Any) -> jax.Array:
    """The filter gradient, in ``dtype``, from the partials ``[programs, taps,
    channels]`` of every program: the second, small kernel."""
    programs, taps, channels = partials.shape
    size = taps * channels
    block = _sum_block(size)
    summed = dataclasses.replace(launch, warps=_SUM_WARPS).call(
        functools.partial(_sum_kernel, block=block),
        _struct((size,), dtype),
        (pl.cdiv(size, block[1]),),
        partials.reshape(programs, size),
    )
    return summed.reshape(conv.filter_shape)
