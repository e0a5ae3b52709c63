"""The depthwise ops as a composition of jnp/lax operations, tuned for XLA:CPU.

The portable implementation (``implementation="xla"``): it runs on every backend.
All three ops are sums over the filter taps of shifted (strided, dilated) windows:
the forward multiplies each window of the input by one tap; the input gradient,
split by the residue of the input index modulo the stride (polyphase), sums
shifted windows of the output gradient times taps; and the filter gradient
multiplies each window by the output gradient and sums. Sums run over the taps in
a fixed order, in float32 for half types: deterministic, and no scatter anywhere.
On TPUs the same sums are XLA's grouped convolution (``_convolution``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgrad import _bits, _checks, _sharding, _tiles
from jaxgrad._depthwise import _convolution
from jaxgrad._depthwise._plan import Conv

# The platforms whose XLA gets the GPU formulations below (``_on_gpus``).
_GPU_PLATFORMS = ("cuda", "rocm")
# The platforms whose XLA gets its own convolution instead (``_convolution``).
_TPU_PLATFORMS = ("tpu",)

T = TypeVar("T")


def _spatial_axes(conv: Conv) -> tuple[int, int]:
    return (3, 4) if conv.nchw else (1, 2)


def _five_d(v: jax.Array, conv: Conv, multiplier: int) -> jax.Array:
    """Splits the channel axis of a 4-D array into (C, multiplier)."""
    n, a, b, c = v.shape
    if conv.nchw:
        return v.reshape(n, conv.channels, multiplier, b, c)
    return v.reshape(n, a, b, conv.channels, multiplier)


def _four_d(v: jax.Array, conv: Conv) -> jax.Array:
    """Merges (C, M) back into one channel axis, channel k*M + q."""
    if conv.nchw:
        n, c, m, h, w = v.shape
        return v.reshape(n, c * m, h, w)
    n, h, w, c, m = v.shape
    return v.reshape(n, h, w, c * m)


def _filter_taps(f: jax.Array, conv: Conv) -> dict[tuple[int, int], jax.Array]:
    """Each tap (di, dj) of the filter, [C, M], shaped to broadcast against the 5-D
    view, in the order the sums take them. Read once here rather than in every
    block: an op's blocks would otherwise each slice the same taps again, which
    costs tracing and lowering time and leaves XLA to merge the copies."""
    shape = (1, *f.shape[2:], 1, 1) if conv.nchw else (1, 1, 1, *f.shape[2:])
    return {(di, dj): f[di, dj].reshape(shape) for di, dj in _taps(conv)}


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
# - Padded (on the CPU: the strided input gradient, whose phases interleave, the
#   NCHW half-precision forward and input gradient, and bfloat16 summed over many
#   taps, `_widened_too_often`): pad the array once and slice each window out of
#   the padded copy. XLA:CPU never fuses a pad that several slices read, so this
#   writes that copy first. (GPUs gather those windows: `_read_per_platform`.)
#
# In NCHW, W is the minor axis, and XLA:CPU does not fuse a concatenation along
# it; `_tile` joins the blocks along W last, one copy of the output. The NCHW
# half-precision forward and input gradient keep the padded copy: gathered, as
# float32 or as 16-bit words, they measured slower. So does the strided input
# gradient: blocks inside its interleaved phases made the loop slower. (The
# measurements behind each rule are in the commit history and the design notes.)
#
# Large filters read padded copies (see `_few_taps`), isolated: every window comes
# from the copy, and each op's output is two blocks of rows (`_Reader.runs`).
class _Read(enum.Enum):
    """How an op reads its windows (the three ways above)."""

    GATHER = enum.auto()
    SLICE = enum.auto()  # from a padded copy
    ISOLATE = enum.auto()  # from an isolated padded copy, for a large filter


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
    # Padded for a large filter: the output is cut into two blocks of rows.
    isolated: bool = False

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

    def runs(
        self, out: int, n: int, offsets: Sequence[int], stride: int, *, rows: bool
    ) -> list[range]:
        """The blocks of ``range(out)`` along one axis whose windows are all inside or not.

        Output ``i`` reads positions ``i * stride + offset`` of an axis of length
        ``n``. Gathered, the outputs are cut before and after those that read
        inside for every offset (empty blocks left out); padded, nothing is cut;
        isolated, the rows are cut in two (``rows`` set), because XLA:CPU fuses
        a sum that is one block into each of its consumers, computing it again in
        each, but leaves a concatenation of blocks alone.
        """
        if self.isolated and rows and out > 1:
            return [range(out // 2), range(out // 2, out)]
        if not self.gathered:
            return [range(out)]
        first = min(out, max(0, -(min(offsets) // stride)))
        stop = min(out, max(first, (n - 1 - max(offsets)) // stride + 1))
        runs = [run for run in (range(first), range(first, stop), range(stop, out)) if run]
        return runs or [range(out)]  # out == 0: one empty block keeps the shape


def _reader(
    v5: jax.Array,
    conv: Conv,
    pads: Sequence[tuple[int, int]],
    dtype: Any,
    reading: _Read,
) -> _Reader:
    """A reader of windows of ``v5`` as ``dtype``, gathered or sliced from a padded copy.

    ``pads`` bounds how far outside (before, after) any window reaches, per axis.
    """
    axes = _spatial_axes(conv)
    pads = tuple(pads)
    gather, isolate = reading is _Read.GATHER, reading is _Read.ISOLATE
    if gather and v5.dtype in (jnp.bfloat16, jnp.float16) and dtype == jnp.float32:
        # Half types are read in place and each window widened, instead of a
        # float32 copy of the whole input written first. bfloat16 is read as its
        # 16-bit words and widened with a shift: XLA:CPU moves a bfloat16 convert
        # up onto the whole input, but not a float16 one.
        array = _bits.words(v5) if v5.dtype == jnp.bfloat16 else v5
        return _Reader(array, axes, pads, gathered=True, half=True)
    if gather:
        return _Reader(v5.astype(dtype), axes, pads, gathered=True)
    config = [(0, 0, 0)] * 5
    for axis, (before, after) in zip(axes, pads, strict=True):
        config[axis] = (before, after, 0)
    padded = lax.pad(v5, jnp.zeros((), v5.dtype), config)
    if padded.dtype != dtype or isolate:
        # Behind a barrier, XLA reads every window from the copy. Otherwise it
        # reads the windows that lie inside from ``v5``: from a second, separately
        # written float32 copy of it when widening; from its producer fused into
        # the sum when isolated, which XLA:CPU emits as a call where two blocks
        # share it, leaving the loop unvectorized (11x11: 7x slower).
        padded = lax.optimization_barrier(padded.astype(dtype))  # type: ignore[no-untyped-call]
    return _Reader(padded, axes, pads, gathered=False, isolated=isolate)


def _slice_run(v: jax.Array, axis: int, run: range) -> jax.Array:
    """``v`` at a run of positions inside it along ``axis``: a strided slice."""
    limit = run.start + (len(run) - 1) * run.step + 1 if len(run) else run.start
    return lax.slice_in_dim(v, run.start, limit, run.step, axis)


def _gather_window(v: jax.Array, runs: Sequence[tuple[int, range]]) -> jax.Array:
    """``v`` at a run of positions along each of some axes, zero outside ``v``."""
    inside_masks = []
    for axis, run in runs:
        n = v.shape[axis]
        if not run or (run[0] >= 0 and run[-1] < n):  # runs step forwards
            # Decided from the ends: a long run (an output's middle block) would
            # otherwise cost an index table of its length on the host.
            v = _slice_run(v, axis, run)
            continue
        index = np.arange(run.start, run.stop, run.step)
        inside = (index >= 0) & (index < n)
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
    conv: Conv,
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


def _window(read: _Reader, di: int, dj: int, conv: Conv, rows: range, cols: range) -> jax.Array:
    """The input pixels tap (di, dj) reads for the output pixels ``rows`` x ``cols``."""
    runs = [
        range(t * d - before + out.start * s, t * d - before + out.stop * s, s)
        for t, s, d, (before, _), out in zip(
            (di, dj), conv.strides, conv.dilations, conv.pads, (rows, cols), strict=True
        )
    ]
    return read(runs[0], runs[1])


def _window_runs(read: _Reader, conv: Conv, axis: int, taps: Sequence[int]) -> list[range]:
    """``read.runs`` for the output positions along spatial ``axis`` (0 or 1), read
    through the given taps."""
    before, d = conv.pads[axis][0], conv.dilations[axis]
    offsets = [t * d - before for t in taps]
    return read.runs(
        conv.out_size[axis], conv.in_size[axis], offsets, conv.strides[axis], rows=axis == 0
    )


def _taps(conv: Conv) -> list[tuple[int, int]]:
    return [(di, dj) for di in range(conv.kernel[0]) for dj in range(conv.kernel[1])]


# XLA:CPU compiles every term of every block, so with up to nine blocks of reads
# a program holds up to nine terms per tap, and its compile time grows with the
# filter's area nine times over. Filters with more taps than this read isolated
# padded copies instead (two blocks; the filter gradient a loop over kernel
# rows), whose programs hold one or two terms per tap and ran as fast or faster;
# the blocked reads stay faster for small filters (see the design notes).
_MAX_BLOCKED_TAPS = 25
# On the CPU the gradients of a stride-1 convolution leave the blocked reads
# sooner: a 5x5 filter's gradients compile in half the time padded, and a
# jax.grad through them runs as fast or faster, while its forward, and strided
# gradients (whose loop reads strided windows), run faster blocked. GPUs keep the
# limit above for every op: XLA:GPU writes the padded copy out.
_MAX_BLOCKED_GRADIENT_TAPS = 20


def _few_taps(conv: Conv, most: int = _MAX_BLOCKED_TAPS) -> bool:
    return conv.kernel[0] * conv.kernel[1] <= most


def _few_gradient_taps(conv: Conv) -> bool:
    """Whether the gradients read blocks on the CPU (on GPUs, ``_few_taps`` decides
    for every op)."""
    if conv.strides != (1, 1):
        return _few_taps(conv)
    return _few_taps(conv, _MAX_BLOCKED_GRADIENT_TAPS)


def _read_mode(*, few: bool, sliced: bool) -> _Read:
    """``ISOLATE`` for a filter of more taps than blocks hold, else ``SLICE`` or
    ``GATHER``."""
    if not few:
        return _Read.ISOLATE
    return _Read.SLICE if sliced else _Read.GATHER


def _on_gpus(args: tuple[jax.Array, ...], gpus: Callable[..., T], default: Callable[..., T]) -> T:
    """``gpus(*args)`` on GPU platforms and ``default(*args)`` elsewhere (an array,
    or a tuple of them), chosen when the program is lowered for its platform."""
    chosen: T = lax.platform_dependent(
        *args, **dict.fromkeys(_GPU_PLATFORMS, gpus), default=default
    )
    return chosen


def _from_memory_on_gpus(*operands: jax.Array) -> tuple[jax.Array, ...]:
    """``operands``, on GPU platforms behind an optimization barrier, so that the
    filter gradient reads them from memory.

    Without it XLA:GPU fuses their producers (the layer's input, say, a
    concatenation of an upsampling and a skip connection) into the first kernel
    of the filter gradient's sum, which reads each element once per tap and per
    partial: every read computes the producers again, and the kernel's code grows
    with them (``benchmarks/xla_gpu_report.py --sections train``). Elsewhere the
    operands pass as they are: XLA:CPU's program is tuned without the barrier.
    """

    def barrier(*arrays: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(lax.optimization_barrier(arrays))  # type: ignore[no-untyped-call]

    return _on_gpus(operands, gpus=barrier, default=lambda *arrays: arrays)


def _half_nchw(conv: Conv, operand: jax.Array) -> bool:
    """Whether ``operand`` is a half-precision NCHW array."""
    return conv.nchw and _checks.compute_dtype(operand.dtype) != operand.dtype


# No instruction widens bfloat16 (F16C widens float16): a gathered window of it is
# read as 16-bit words and widened with integer instructions, at every read. A
# stride-1 sum over more taps than this widens each element so often that XLA:CPU
# runs it slower than from a float32 padded copy, written once and read by slices
# (in AVX2 code and in AVX-512 alike; the design notes have the figures).
_MOST_WIDENED_TAPS = 15


def _widened_too_often(conv: Conv, operand: jax.Array) -> bool:
    """Whether ``operand`` is bfloat16 and summed at stride 1 over more taps than
    XLA:CPU widens faster in place than it reads a float32 copy."""
    taps = conv.kernel[0] * conv.kernel[1]
    return operand.dtype == jnp.bfloat16 and conv.strides == (1, 1) and taps > _MOST_WIDENED_TAPS


def _read_per_platform(
    op: Callable[..., jax.Array],
    args: tuple[jax.Array, ...],
    conv: Conv,
    *,
    gpus: _Read,
    elsewhere: _Read,
) -> jax.Array:
    """``op(*args, conv=conv, reading=...)``, its windows read as each platform reads
    them faster. XLA:CPU reads some windows faster from a padded copy (the NCHW
    half-precision ones, the strided input gradient's, a 5x5 filter's stride-1
    gradients'); XLA:GPU writes such a copy out, moving 1.8-4.3x the op's bytes
    where gathered windows move 1.00x
    (``benchmarks/xla_gpu_report.py --sections depthwise``)."""
    if gpus == elsewhere:
        return op(*args, conv=conv, reading=gpus)
    return _on_gpus(
        args,
        gpus=functools.partial(op, conv=conv, reading=gpus),
        default=functools.partial(op, conv=conv, reading=elsewhere),
    )


def _on_tpus(
    convolution: Callable[..., jax.Array],
    portable: Callable[..., jax.Array],
    args: tuple[jax.Array, ...],
    conv: Conv,
) -> jax.Array:
    """``convolution(*args, conv)`` on TPU platforms and ``portable(*args, conv)``
    elsewhere, chosen when the program is lowered for its platform. Under explicit
    sharding, and inside ``jax.shard_map`` on arrays that vary across its manual
    axes, the portable arithmetic everywhere: lax's convolution there asks for
    its result's sharding, and the transposes for the gradients take types
    without those axes, which they cannot match (and every platform's branch is
    traced, whichever is lowered)."""
    if (
        not _convolution.covers(conv)
        or _sharding.explicit_mesh(args) is not None
        or any(_sharding.varying(a) for a in args)
    ):
        return portable(*args, conv)
    chosen: jax.Array = lax.platform_dependent(
        *args,
        **dict.fromkeys(_TPU_PLATFORMS, functools.partial(convolution, conv=conv)),
        default=functools.partial(portable, conv=conv),
    )
    return chosen


def forward(x: jax.Array, f: jax.Array, conv: Conv) -> jax.Array:
    return _on_tpus(_convolution.forward, _portable_forward, (x, f), conv)


def _portable_forward(x: jax.Array, f: jax.Array, conv: Conv) -> jax.Array:
    few = _few_taps(conv)
    return _read_per_platform(
        _forward,
        (x, f),
        conv,
        gpus=_read_mode(few=few, sliced=False),
        # With a multiplier, the padded copy's windows broadcast over it, which
        # measured slower than widening in place.
        elsewhere=_read_mode(
            few=few,
            sliced=_half_nchw(conv, x) or (conv.multiplier == 1 and _widened_too_often(conv, x)),
        ),
    )


def _forward(x: jax.Array, f: jax.Array, conv: Conv, *, reading: _Read) -> jax.Array:
    dtype = _checks.compute_dtype(x.dtype)
    read = _reader(_five_d(x, conv, 1), conv, conv.pads, dtype, reading)
    taps = _filter_taps(f.astype(dtype), conv)

    def block(rows: range, cols: range) -> jax.Array:
        return functools.reduce(
            operator.add,
            (_window(read, di, dj, conv, rows, cols) * tap for (di, dj), tap in taps.items()),
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


def input_gradient(f: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    return _on_tpus(_convolution.input_gradient, _portable_input_gradient, (f, dy), conv)


def _portable_input_gradient(f: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    sliced = _half_nchw(conv, dy) or conv.strides != (1, 1) or _widened_too_often(conv, dy)
    return _read_per_platform(
        _input_gradient,
        (f, dy),
        conv,
        gpus=_read_mode(few=_few_taps(conv), sliced=False),
        elsewhere=_read_mode(few=_few_gradient_taps(conv), sliced=sliced),
    )


def _input_gradient(f: jax.Array, dy: jax.Array, conv: Conv, *, reading: _Read) -> jax.Array:
    # Polyphase: the input pixels of one residue class per axis receive a fixed set
    # of taps at shifts that do not depend on the pixel, so each class is a stride-1
    # shifted sum over the gradient, and the classes interleave back into place.
    # (Spreading the gradient with interior padding instead was 66x slower for 5x5
    # stride 2.) Each multiplier
    # slice sums its taps, and the slices are summed with explicit adds: no
    # reduction, no scatter.
    dtype = _checks.compute_dtype(dy.dtype)
    dy5 = _five_d(dy, conv, conv.multiplier)
    taps = _filter_taps(f.astype(dtype), conv)
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
    read = _reader(dy5, conv, (h_pads, w_pads), dtype, reading)

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
                    * taps[th, tw]
                    for th, ch in h_taps
                    for tw, cw in w_taps
                ),
            )
            return functools.reduce(
                operator.add,
                (lax.slice_in_dim(total, q, q + 1, axis=m_axis) for q in range(conv.multiplier)),
            )

        row_runs = read.runs(rows, conv.out_size[0], [c for _, c in h_taps], 1, rows=True)
        col_runs = read.runs(cols, conv.out_size[1], [c for _, c in w_taps], 1, rows=False)
        return _tile(block, row_runs, col_runs, conv)

    by_rows = [
        _interleave([phase(h, w) for w in w_phases], w_axis, conv.in_size[1]) for h in h_phases
    ]
    return _four_d(_interleave(by_rows, h_axis, conv.in_size[0]), conv).astype(dy.dtype)


# The filter gradient's reduction runs in two stages. XLA:CPU emits a reduction
# whose input is a shifted slice as a slow scalar loop, but runs elementwise
# fusions and reductions of whole arrays at memory speed. So stage 1 adds up
# blocks of output rows with explicit adds, each term slicing the input and the
# gradient itself (a product shared by many slices gets materialized), and stage
# 2 reduces that small, whole array: about 9x
# faster than one reduction. 8 row blocks per element was the fastest in a sweep
# from 4 to 64.
_ROW_BLOCKS = 8
# Taps per stage-1 fusion (see below): 9 was the best compromise across 3x3, 5x5
# and strided cases; more made the strided 5x5 gradient slower.
_TAPS_PER_FUSION = 9


def _gradient_operand(dy: jax.Array, conv: Conv, dtype: Any) -> jax.Array:
    """``dy`` as the 5-D view the filter gradient multiplies the windows by.

    A float16 ``dy`` stays float16 and each slice is widened where it is read, as
    the windows are (`_reader`), instead of a float32 copy written first.
    """
    dy5 = _five_d(dy, conv, conv.multiplier)
    return dy5 if dy5.dtype == jnp.float16 else dy5.astype(dtype)


def _stage_one(terms: Iterable[jax.Array], rows: int, row_axis: int, dtype: Any) -> jax.Array:
    """The sum of row blocks of products, each padded with zero rows to ``rows``."""

    def padded(term: jax.Array) -> jax.Array:
        if term.shape[row_axis] == rows:
            return term
        config = [(0, 0, 0)] * term.ndim
        config[row_axis] = (0, rows - term.shape[row_axis], 0)
        return lax.pad(term, jnp.zeros((), dtype), config)

    return functools.reduce(operator.add, map(padded, terms))


# Partials one level of the fixed-order sum adds up (``_tree_sum``).
_FAN_IN = 8


def _sum_partials(partials: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Stage 2: ``partials`` summed over ``axes`` (the batch axis first of them),
    in an order fixed on every backend.

    XLA:GPU tiles a reduction by autotuning it, anew in each process, and the
    tiling sets the order of the sum. On GPU platforms the partials are added up
    in a tree of elementwise adds instead, which no compiler reorders. Elsewhere
    XLA's own reduction keeps one order, and on the CPU it is the faster.
    """
    tree = functools.partial(_tree_sum, axes=axes)
    return _on_gpus((partials,), gpus=tree, default=functools.partial(jnp.sum, axis=axes))


def _tree_sum(partials: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``partials`` summed over ``axes``: each axis after the first in levels of
    ``_FAN_IN`` slices, the last axis first; then the first axis (the batch, the
    one a sharded program splits) in one level, so that each device sums its own
    shard before only the small remainders move between devices."""
    shape = [n for a, n in enumerate(partials.shape) if a not in axes]
    if partials.size == 0:  # a sum of no terms (a batch of no images, say)
        return jnp.zeros(shape, partials.dtype)
    batch, *rest = sorted(axes)
    total = partials
    for axis in reversed(rest):
        while total.shape[axis] > 1:
            total = _sum_level(total, axis, _FAN_IN)
    if _checks.is_symbolic(total.shape[batch]):
        total = _sum_in_a_loop(total, batch)
    else:
        total = _sum_level(total, batch, total.shape[batch])
    return total.reshape(shape)


def _sum_in_a_loop(total: jax.Array, axis: int) -> jax.Array:
    """``total`` summed along ``axis``, of a symbolic length (an exported batch),
    one slice after another: a fixed order however long the axis turns out."""

    def add(i: jax.Array, acc: jax.Array) -> jax.Array:
        summed: jax.Array = acc + lax.dynamic_index_in_dim(total, i, axis, keepdims=False)
        return summed

    first = lax.index_in_dim(total, 0, axis, keepdims=False)
    summed: jax.Array = lax.fori_loop(1, total.shape[axis], add, first)
    return summed


def _sum_level(total: jax.Array, axis: int, fan_in: int) -> jax.Array:
    """One level: ``total`` cut along ``axis`` into ``fan_in`` runs (the last one
    padded with zeros), added up in order. The level is a kernel of its own:
    merged, XLA:GPU made one thread add up a whole axis."""
    total = _whole_along(total, axis)
    fan_in = min(fan_in, total.shape[axis])
    run = -(-total.shape[axis] // fan_in)
    if run * fan_in > total.shape[axis]:
        padding = [(0, 0, 0)] * total.ndim
        padding[axis] = (0, run * fan_in - total.shape[axis], 0)
        total = lax.pad(total, jnp.zeros((), total.dtype), padding)
    runs = (lax.slice_in_dim(total, i * run, (i + 1) * run, axis=axis) for i in range(fan_in))
    summed = functools.reduce(operator.add, runs)
    kept: jax.Array = lax.optimization_barrier(summed)  # type: ignore[no-untyped-call]
    return kept


def _whole_along(total: jax.Array, axis: int) -> jax.Array:
    """``total`` with ``axis`` whole on every device where its type shards it:
    explicit sharding refuses to cut a sharded axis into runs shorter than its
    shards. Under automatic sharding XLA's partitioner moves the runs."""
    spec = _sharding.typed_spec(total)
    if spec is None or axis >= len(spec) or spec[axis] is None:
        return total
    whole = [*spec, *[None] * (total.ndim - len(spec))]
    whole[axis] = None
    return _sharding.reshard(total, whole)


def filter_gradient(x: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    return _on_tpus(_convolution.filter_gradient, _portable_filter_gradient, (x, dy), conv)


def _portable_filter_gradient(x: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    x, dy = _from_memory_on_gpus(x, dy)

    def gradient(x: jax.Array, dy: jax.Array, *, blocked: bool) -> jax.Array:
        if blocked:
            return _blocked_filter_gradient(x, dy, conv)
        return _filter_gradient_by_kernel_rows(x, dy, conv)

    on_gpus, elsewhere = _few_taps(conv), _few_gradient_taps(conv)
    if on_gpus == elsewhere:
        return gradient(x, dy, blocked=on_gpus)
    return _on_gpus(
        (x, dy),
        gpus=functools.partial(gradient, blocked=on_gpus),
        default=functools.partial(gradient, blocked=elsewhere),
    )


def _blocked_filter_gradient(x: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    """The filter gradient summed tap by tap over blocks of gathered windows."""
    dtype = _checks.compute_dtype(x.dtype)
    read = _reader(_five_d(x, conv, 1), conv, conv.pads, dtype, _Read.GATHER)
    dy5 = _gradient_operand(dy, conv, dtype)
    row_axis, col_axis = _spatial_axes(conv)
    out_rows = conv.out_size[0]
    block = -(-out_rows // _ROW_BLOCKS)

    @functools.cache
    def gradient_block(rows: range, cols: range) -> jax.Array:
        # Every tap multiplies its window by the same block of the gradient:
        # sliced once here rather than by every tap.
        return _slice_run(_slice_run(dy5, row_axis, rows), col_axis, cols).astype(dtype)

    def block_term(di: int, dj: int, first: int) -> jax.Array:
        def product(rows: range, cols: range) -> jax.Array:
            return _window(read, di, dj, conv, rows, cols) * gradient_block(rows, cols)

        rows = range(first, min(first + block, out_rows))
        return _tile(product, [rows], _window_runs(read, conv, 1, [dj]), conv)

    def tap_rows(di: int, dj: int) -> jax.Array:
        terms = (block_term(di, dj, first) for first in range(0, out_rows, block))
        return _stage_one(terms, block, row_axis, dtype)

    # Stacking the taps' partial sums before a reduction keeps stage 1 in XLA's own
    # loop fusion (reduced directly, its slices would be copied out one by one to
    # feed the library reduction). Stacked after the batch axis, the taps of one
    # image are computed while that image is in cache. Stacked kernel row by kernel
    # row, because XLA:CPU fuses a concatenate of at most 8 operands, and at most
    # _TAPS_PER_FUSION taps per stack: more made the strided 5x5 case slower, and
    # beyond 15 taps XLA:CPU copies out the gradient blocks they share.
    fh, fw = conv.kernel
    reduced = (0, 5, 6) if conv.nchw else (0, 3, 4)

    def kernel_rows_gradient(kernel_rows: range) -> jax.Array:
        partial = jnp.stack(
            [jnp.stack([tap_rows(di, dj) for dj in range(fw)], axis=1) for di in kernel_rows],
            axis=1,
        )
        return _sum_partials(partial, reduced)

    rows_per_stack = max(1, _TAPS_PER_FUSION // fw)
    grad = jnp.concatenate(
        [
            kernel_rows_gradient(range(top, min(top + rows_per_stack, fh)))
            for top in range(0, fh, rows_per_stack)
        ]
    )
    return grad.reshape(conv.filter_shape).astype(x.dtype)


# At most this many taps are stacked into one stage-1 fusion of the loop below:
# XLA:CPU fuses a concatenation of at most 8 operands, and wrote each tap of an
# 11-wide stack out separately (11x slower).
_MAX_STACKED_TAPS = 8


def _chunks(items: Sequence[Any], most: int) -> list[Sequence[Any]]:
    """``items`` cut into runs of at most ``most``, as even in length as possible."""
    count = -(-len(items) // most)
    size = -(-len(items) // count)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _filter_gradient_by_kernel_rows(x: jax.Array, dy: jax.Array, conv: Conv) -> jax.Array:
    """The filter gradient of a large filter: a loop over its kernel rows.

    Each step computes a few kernel rows of taps (at most 8 taps, or one row) in
    the two stages above, reading the input at those rows' offsets from an
    isolated padded copy. The program holds one step's terms, not every tap's,
    and each step's stage-1 array is reused by the next.
    """
    dtype = _checks.compute_dtype(x.dtype)
    padded = _reader(_five_d(x, conv, 1), conv, conv.pads, dtype, _Read.ISOLATE).array
    dy5 = _gradient_operand(dy, conv, dtype)
    row_axis, col_axis = _spatial_axes(conv)
    (sh, sw), (dh, dw) = conv.strides, conv.dilations
    (out_rows, out_cols), (fh, fw) = conv.out_size, conv.kernel
    block = -(-out_rows // _ROW_BLOCKS)
    reduced = (0, 4, 5) if conv.nchw else (0, 2, 3)

    def term(di: jax.Array, dj: int, rows: range) -> jax.Array:
        # The window of tap (di, dj) for output ``rows``: a dynamic slice of the
        # copy (padded, so it never clamps), then the strides. Each term slices
        # its own window: XLA:CPU emits a slice that several terms share as a
        # call, and leaves the loop unvectorized.
        start = [jnp.zeros((), jnp.int32)] * 5
        start[row_axis] = di * dh + rows.start * sh
        start[col_axis] = jnp.asarray(dj * dw, jnp.int32)
        size = list(padded.shape)
        size[row_axis] = (len(rows) - 1) * sh + 1
        size[col_axis] = (out_cols - 1) * sw + 1
        window = lax.dynamic_slice(padded, start, size)
        window = _slice_run(window, row_axis, range(0, size[row_axis], sh))
        window = _slice_run(window, col_axis, range(0, size[col_axis], sw))
        return window * _slice_run(dy5, row_axis, rows).astype(dtype)

    def tap_rows(di: jax.Array, dj: int) -> jax.Array:
        tops = range(0, out_rows, block)
        terms = (term(di, dj, range(top, min(top + block, out_rows))) for top in tops)
        return _stage_one(terms, block, row_axis, dtype)

    def kernel_rows(first: jax.Array | int, count: int) -> jax.Array:
        """The gradient of kernel rows ``first`` to ``first + count - 1``."""
        first = jnp.asarray(first, jnp.int32)
        taps = [(r, dj) for r in range(count) for dj in range(fw)]
        sums = [
            _sum_partials(jnp.stack([tap_rows(first + r, dj) for r, dj in chunk], axis=1), reduced)
            for chunk in _chunks(taps, _MAX_STACKED_TAPS)
        ]
        return jnp.concatenate(sums).reshape(count, fw, conv.channels, conv.multiplier)

    per_step = max(1, _MAX_STACKED_TAPS // fw)
    steps, rest = divmod(fh, per_step)

    def step(i: jax.Array, grad: jax.Array) -> jax.Array:
        rows = kernel_rows(i * per_step, per_step)
        updated: jax.Array = lax.dynamic_update_slice_in_dim(grad, rows, i * per_step, 0)
        return updated

    zeros = jnp.zeros((steps * per_step, fw, conv.channels, conv.multiplier), dtype)
    zeros = _sharding.vary_as(zeros, padded, dy5)  # as the steps' sums, in a shard_map
    spec = _sharding.typed_spec(dy5)
    if spec is not None:  # the rows are sharded as dy's channels, and so is the carry
        c = 1 if conv.nchw else 3
        parts = [None, None, spec[c], spec[c + 1]]
        zeros = _sharding.reshard(zeros, parts, _sharding.explicit_mesh([dy5]))
    grad: jax.Array = lax.fori_loop(0, steps, step, zeros)
    if rest:
        grad = jnp.concatenate([grad, kernel_rows(steps * per_step, rest)])
    return grad.reshape(conv.filter_shape).astype(x.dtype)
