"""Resample's implementations: choosing one (``implementation=``), the Pallas kernel
against the float64 reference and the scatter-add oracle (in Pallas' interpret mode
on the CPU), and the kernel's lowering for CUDA GPUs, checked here without one."""

import contextlib
import functools
import math
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    H100_CAPABILITY,
    TOLERANCE,
    TRITON_CALL,
    bounds_checked_kernels,
    examples,
    kernel_launches,
    kernel_primitives,
    lowered_text,
    needs_kernels,
    transformed,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads
from test_resample import (
    CASES,
    INTEGER_DTYPES,
    configs,
    kwargs,
    ref_args,
    reference_resample,
    reference_resample_grad,
    scatter_add_oracle,
)

import jaxgrad
from jaxgrad import _implementation, _kernels
from jaxgrad._kernels import pl, plgpu
from jaxgrad._resample import _pallas, _plan, _xla

KERNEL = dict(implementation="pallas")


def both_ways(x, dy, in_shape, scales, out_shape=None, **kw):
    """resample and resample_grad with the kernel."""
    y = jaxgrad.resample(x, scales, output_shape=out_shape, **KERNEL, **kw)
    dx = jaxgrad.resample_grad(dy, in_shape, scales, **KERNEL, **kw)
    return y, dx


# ----------------------------------------------------------------------------------
# The kernel against the references
# ----------------------------------------------------------------------------------


# Each example compiles a new interpreted kernel (about half a second a direction).
@needs_kernels
@settings(max_examples=examples(15), deadline=None)
@given(configs(), st.integers(0, 2**31 - 1))
def test_kernel_matches_reference(c, seed):
    assert_kernel_matches_references(c, seed)


def assert_kernel_matches_references(c, seed):
    """The kernel's forward and gradient of config ``c``, on arrays drawn from
    ``seed``, match the references (``assert_matches_references``)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=c["in_shape"])
    dy = rng.normal(size=c["out_shape"])
    y, dx = both_ways(
        jnp.asarray(x), jnp.asarray(dy), c["in_shape"], c["scales"], c["out_shape"], **kwargs(c)
    )
    assert_matches_references(c, x, dy, y, dx)


def assert_matches_references(c, x, dy, y, dx):
    """``y`` and ``dx`` are the float64 reference's forward of ``x`` and gradient of
    ``dy`` under config ``c``, and ``dx`` the scatter-add oracle's too."""
    expected = reference_resample(x, c["out_shape"], *ref_args(c))
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    expected = reference_resample_grad(dy, c["in_shape"], *ref_args(c))
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)
    oracle = scatter_add_oracle(dy, c["in_shape"], *ref_args(c))
    np.testing.assert_allclose(dx, oracle, rtol=1e-12, atol=1e-12)


def dtype_grid():
    """(case, dtype): each case in a half and a full type, float16 and bfloat16,
    float32 and float64 by turns (the kernels differ between the dtypes only in the
    type they load and store), so that every dtype meets half of the cases."""
    for i, case in enumerate(CASES):
        for dtype in ((jnp.float16, jnp.bfloat16)[i % 2], (jnp.float32, jnp.float64)[i % 2]):
            yield pytest.param(case, dtype, id=f"{i}-{dtype.__name__}")


@needs_kernels
@pytest.mark.parametrize(("case", "dtype"), list(dtype_grid()))
def test_kernel_in_every_float_dtype(case, dtype):
    in_shape, scales, out_shape, mode, rounding = case
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=in_shape), dtype)
    kw = dict(mode=mode, rounding=rounding)
    y = jaxgrad.resample(x, scales, output_shape=out_shape, **KERNEL, **kw)
    dy = jnp.asarray(rng.normal(size=y.shape), dtype)
    dx = jaxgrad.resample_grad(dy, in_shape, scales, **KERNEL, **kw)
    assert y.dtype == dx.dtype == dtype and dx.shape == in_shape
    args = scales, (0.5,) * len(in_shape), (-0.5,) * len(in_shape), mode, rounding
    tol = TOLERANCE[np.dtype(dtype)]
    expected = reference_resample(np.asarray(x, np.float64), y.shape, *args)
    np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=tol, atol=tol)
    expected = reference_resample_grad(np.asarray(dy, np.float64), in_shape, *args)
    np.testing.assert_allclose(
        np.asarray(dx, np.float64), expected, rtol=tol, atol=tol * np.abs(expected).max()
    )


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize(
    "in_shape, scales",
    [((16, 16), (4, 4)), ((2, 6, 5, 3), (1, 2, 2, 1)), ((6, 5, 7), (2, 2, 2))],
)
def test_kernel_half_precision_accumulates_in_float32(dtype, in_shape, scales):
    # The linear gradient of an upsampling sums several terms per element: in half
    # precision the kernel sums in float32 and rounds once, so its result is the
    # float32 result rounded, bit for bit. Signs, zeros and infinities included.
    rng = np.random.default_rng(2)
    out_shape = tuple(n * s for n, s in zip(in_shape, scales, strict=True))
    dy = rng.normal(size=out_shape)
    dy.flat[:4] = [-0.0, np.inf, -np.inf, -1e-30]
    dy = jnp.asarray(dy, dtype)
    kw = dict(mode="linear", **KERNEL)
    half = jaxgrad.resample_grad(dy, in_shape, scales, **kw)
    full = jaxgrad.resample_grad(dy.astype(jnp.float32), in_shape, scales, **kw)
    np.testing.assert_array_equal(
        np.asarray(half, np.float32), np.asarray(full.astype(dtype), np.float32)
    )


@needs_kernels
@pytest.mark.parametrize("dtype", [*INTEGER_DTYPES, jnp.bool_, jnp.bfloat16, jnp.float32])
def test_kernel_nearest_forward_moves_values_exactly(dtype):
    # A pure gather moves the values as they are: every integer, every bool, the
    # bits of every float, with no detour through float32.
    info = jnp.iinfo(dtype) if jnp.issubdtype(dtype, jnp.integer) else None
    rng = np.random.default_rng(3)
    if info is not None:
        x = rng.integers(info.min, info.max, size=(3, 5, 7), dtype=np.int64, endpoint=True)
    else:
        x = rng.normal(size=(3, 5, 7)) > 0 if dtype == jnp.bool_ else rng.normal(size=(3, 5, 7))
    x = jnp.asarray(x, dtype)
    for scales in [(1, 2.0, 1.7), (0.7, 0.5, 3.0)]:
        kernel = jaxgrad.resample(x, scales, **KERNEL)
        portable = jaxgrad.resample(x, scales, implementation="xla")
        assert kernel.dtype == dtype
        np.testing.assert_array_equal(np.asarray(kernel), np.asarray(portable))


@needs_kernels
def test_kernel_does_not_read_taps_of_weight_zero():
    # Sampling exactly on input pixels: the second linear tap has weight 0, so an inf
    # beside it must not turn into NaN (0 * inf).
    x = jnp.array([1.0, np.inf, 3.0])
    kw = dict(mode="linear", input_pixel_offsets=0, output_pixel_offsets=0, **KERNEL)
    np.testing.assert_array_equal(jaxgrad.resample(x, (1.0,), **kw), x)
    dx = jaxgrad.resample_grad(jnp.array([np.inf, 1.0]), (4,), (0.5,), **kw)
    np.testing.assert_array_equal(dx, [np.inf, 0, 1, 0])


@needs_kernels
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_kernel_loops_over_many_taps(mode):
    # Each input of a 40x upsampling feeds 40 (nearest) or 80 (linear) outputs, more
    # than the kernel unrolls: its gradient sums them in a loop.
    axis = _plan.Axis(8, 320, _plan.Affine(40.0, 0.5, -0.5), mode == "linear", "half_up")
    assert _plan.plan(axis, True).width > _pallas._MAX_UNROLLED_TAPS
    rng = np.random.default_rng(0)
    dy = rng.normal(size=(2, 320))
    dx = jaxgrad.resample_grad(jnp.asarray(dy), (2, 8), (1, 40.0), mode=mode, **KERNEL)
    args = ((1, 40.0), (0.5, 0.5), (-0.5, -0.5), mode, "half_up")
    np.testing.assert_allclose(dx, reference_resample_grad(dy, (2, 8), *args), rtol=1e-12)


@needs_kernels
def test_kernel_computes_the_rows_of_a_long_axis(monkeypatch):
    # A long axis with a pattern has its rows computed in the program from one
    # period, not listed: the same tables, so the same bits.
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(3, 37, 29)), jnp.float32)
    dy = jnp.asarray(rng.normal(size=(3, 50, 39)), jnp.float32)
    kw = dict(mode="linear", input_pixel_offsets=0.25, output_pixel_offsets=-0.5)
    scales = (1, 1.37, 1.37)
    listed = both_ways(x, dy, x.shape, scales, dy.shape, **kw)
    jax.clear_caches()
    monkeypatch.setattr(_plan, "LISTED_ROWS", 0)
    computed = both_ways(x, dy, x.shape, scales, dy.shape, **kw)
    jax.clear_caches()
    for a, b in zip(listed, computed, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# The launch options of a resampled last axis, neither, alone and together.
LAUNCH_OPTIONS = [
    {"paired": False, "rows_together": False},
    {"paired": True, "rows_together": False},
    {"paired": False, "rows_together": True},
    {"paired": True, "rows_together": True},
]


# Every resample kernel launched with ``_Launch`` fields set: ``launches_with(paired=True)``.
launches_with = functools.partial(kernel_launches, _pallas)


def drawn_config(draw, in_shape, scales, longer_axis):
    """A config of ``in_shape`` and ``scales``, with the output the scales give,
    or one with axis ``longer_axis`` longer or shorter than they say; any offsets,
    mode and rounding. The offsets are eighths, where samples fall on pixels and
    rounding ties, and others; not ones so small that float64 loses them beside a
    coordinate (the library computes such coordinates exactly, the reference
    rounds them away)."""
    rank = len(in_shape)
    offset = st.one_of(
        st.integers(-8, 8).map(lambda k: k / 8),
        st.floats(-1.0, 1.0).filter(lambda v: abs(v) > 1e-6),
    )
    out_shape = [max(1, math.floor(n * s)) for n, s in zip(in_shape, scales, strict=True)]
    if draw(st.booleans()):
        out_shape[longer_axis] = max(1, out_shape[longer_axis] + draw(st.integers(-2, 2)))
    return dict(
        in_shape=in_shape,
        out_shape=tuple(out_shape),
        scales=scales,
        a=draw(st.lists(offset, min_size=rank, max_size=rank)),
        b=draw(st.lists(offset, min_size=rank, max_size=rank)),
        mode=draw(st.sampled_from(["nearest", "linear"])),
        rounding=draw(st.sampled_from(["half_up", "down", "up"])),
    )


@st.composite
def last_axis_configs(draw):
    """Configs whose last axis is scaled by 2 or 0.5 (read in pairs, forward and
    gradient), any offsets, rounding and earlier axes."""
    rank = draw(st.integers(1, 3))
    in_shape = (*draw(st.lists(st.integers(1, 4), min_size=rank - 1, max_size=rank - 1)),)
    in_shape += (draw(st.integers(1, 24)),)
    scales = (*(draw(st.sampled_from([1.0, 2.0, 0.5])) for _ in in_shape[:-1]),)
    scales += (draw(st.sampled_from([2.0, 0.5])),)
    return drawn_config(draw, in_shape, scales, longer_axis=-1)


@needs_kernels
@settings(max_examples=examples(12), deadline=None)
@given(last_axis_configs(), st.integers(0, 2**31 - 1), st.booleans())
def test_kernel_reading_columns_in_pairs_matches_reference(c, seed, rows_together):
    with launches_with(paired=True, rows_together=rows_together):
        assert_kernel_matches_references(c, seed)


# Each example compiles a new interpreted kernel.
@needs_kernels
@settings(max_examples=examples(10), deadline=None)
@given(configs(), st.integers(0, 2**31 - 1))
def test_kernel_with_rows_together_matches_reference(c, seed):
    with launches_with(rows_together=True):
        assert_kernel_matches_references(c, seed)


@needs_kernels
@pytest.mark.parametrize(("in_rows", "most_rows"), [(2, 4), (3, 8)], ids=["3 of 4", "5 of 8"])
def test_rows_together_fewer_than_a_power_of_two(in_rows, most_rows, monkeypatch):
    # A program's rows together are one tile, whose sides Triton's blocks must make
    # powers of two: an output of 3 rows (5 where a program holds 8) takes a tile of
    # 4 (8), whose rows past the output are read inside the input and not stored.
    monkeypatch.setattr(_pallas, "_ROWS", most_rows)
    in_shape, scales = (1, in_rows, 5), (1, 1.7, 2.0)
    out_shape = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
    c = dict(in_shape=in_shape, out_shape=out_shape, scales=scales, a=0.5, b=-0.5)
    c.update(mode="linear", rounding="half_up")
    x, dy = (jax.ShapeDtypeStruct(shape, jnp.float32) for shape in (in_shape, out_shape))
    with launches_with(rows_together=True):
        assert_kernel_matches_references(c, seed=in_rows)
        forward = lowered_text(
            lambda x: jaxgrad.resample(x, scales, mode="linear", **KERNEL), x, platform="cuda"
        )
        gradient = lowered_text(
            lambda dy: jaxgrad.resample_grad(dy, in_shape, scales, mode="linear", **KERNEL),
            dy,
            platform="cuda",
        )
    assert forward.count(TRITON_CALL) == gradient.count(TRITON_CALL) == 1


@needs_kernels
@pytest.mark.parametrize(
    ("in_shape", "scales"),
    [
        ((1, 3, 4, 2), (1, 8, 8, 1)),
        ((2, 1, 3, 4), (1, 1, 8, 8)),
        # A volume's last axis read in pairs: 4 column taps, and two edge columns of
        # 3 taps each, read on their own in every row.
        ((1, 2, 4, 4, 8), (1, 1, 2, 2, 2)),
    ],
    ids=["NHWC", "NCHW", "NCDHW 2x, edges"],
)
def test_many_row_taps_of_many_column_taps_are_summed_in_a_loop(in_shape, scales):
    # The gradient of a 2-D 8x linear upsampling sums 16 row taps of 16 column taps
    # each: unrolled, 256 reads in the kernel's code (320 loads), and Triton's
    # compile time grows faster than the code it compiles. The gradient of a 3-D
    # 2x one sums 16 row taps (4 of each row axis) of 10 column reads: unrolled,
    # 208 loads, which Triton compiled 20x slower than the loop. Past 64 column reads
    # a row, the row taps are summed in a loop, in the same order.
    out_shape = tuple(n * s for n, s in zip(in_shape, scales, strict=True))
    c = dict(in_shape=in_shape, out_shape=out_shape, scales=scales, a=0.5, b=-0.5)
    c.update(mode="linear", rounding="half_up")
    assert_kernel_matches_references(c, seed=8)
    dy = jax.ShapeDtypeStruct(out_shape, jnp.float32)
    gradient = kernel_primitives(
        lambda dy: jaxgrad.resample_grad(dy, in_shape, scales, mode="linear", **KERNEL), dy
    )[0]
    assert gradient["masked_load"] < 64


@needs_kernels
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_kernel_reads_a_last_axis_across_column_tiles(monkeypatch, mode):
    # Rows longer than a tile (here 8 columns) are cut into column tiles: each reads
    # its own columns through the table, or its own runs in pairs, where the edge
    # columns land in the first and the last tile; a row at a time or together.
    monkeypatch.setattr(_pallas, "_TILE", 8)
    rng = np.random.default_rng(8)
    for in_shape, scales in [((2, 3, 37), (1, 2.0, 2.0)), ((2, 6, 75), (1, 0.5, 0.5))]:
        x = rng.normal(size=in_shape)
        out_shape = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
        dy = rng.normal(size=out_shape)
        c = dict(in_shape=in_shape, out_shape=out_shape, scales=scales, a=0.5, b=-0.5)
        c.update(mode=mode, rounding="half_up")
        for launches in LAUNCH_OPTIONS:
            jax.clear_caches()  # programs traced with the library's tile
            with launches_with(**launches):
                y, dx = both_ways(jnp.asarray(x), jnp.asarray(dy), in_shape, scales, **kwargs(c))
            assert_matches_references(c, x, dy, y, dx)


@needs_kernels
@pytest.mark.parametrize("launches", LAUNCH_OPTIONS)
def test_kernel_does_not_read_rows_of_missing_taps(launches):
    # Rows sampled exactly on input rows have one linear tap, and rows of the
    # gradient that no output reads have none: a missing row tap reads no row (one
    # row at a time) or reads one inside the input and drops it (the rows
    # together). An infinity in the first row, where a missing tap's row index is
    # clipped to, reaches only the results whose sums read it: never a NaN.
    kw = dict(mode="linear", input_pixel_offsets=0, output_pixel_offsets=0)
    x = np.ones((3, 4))
    x[0, 0] = np.inf
    dy = np.ones((2, 8))
    dy[0, 0] = np.inf
    with launches_with(**launches):
        y = jaxgrad.resample(jnp.asarray(x), (1.0, 2.0), **kw, **KERNEL)
        dx = jaxgrad.resample_grad(jnp.asarray(dy), (4, 4), (0.5, 2.0), **kw, **KERNEL)
    assert not np.isnan(y).any() and not np.isnan(dx).any()
    np.testing.assert_array_equal(y[0], [np.inf, np.inf, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(y[1:], 1)
    np.testing.assert_array_equal(dx[1::2], 0)  # inputs no output reads
    portable = dict(implementation="xla")
    np.testing.assert_array_equal(y, jaxgrad.resample(jnp.asarray(x), (1.0, 2.0), **kw, **portable))
    np.testing.assert_array_equal(
        dx, jaxgrad.resample_grad(jnp.asarray(dy), (4, 4), (0.5, 2.0), **kw, **portable)
    )


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int32, jnp.bool_, jnp.bfloat16])
def test_kernel_launch_options_move_nearest_values_exactly(dtype):
    # Under either option a nearest forward still moves values as they are, in any
    # dtype (bool as uint8): the same as the portable program's, bit for bit.
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.integers(-100, 100, size=(2, 3, 5, 12)), dtype)
    for scales in [(1, 1, 2.0, 2.0), (1, 1, 0.5, 0.5)]:
        portable = jaxgrad.resample(x, scales, implementation="xla")
        for fields in LAUNCH_OPTIONS[1:]:
            with launches_with(**fields):
                kernel = jaxgrad.resample(x, scales, **KERNEL)
            assert kernel.dtype == dtype
            np.testing.assert_array_equal(np.asarray(kernel), np.asarray(portable), str(fields))


def last_axis_plan(n_in, n_out, scale, linear, transpose, a=0.5, b=-0.5):
    axis = _plan.Axis(n_in, n_out, _plan.Affine(scale, a, b), linear, "half_up")
    return _plan.plan(axis, transpose)


def kernel_work(sizes, linear=True, transpose=False):
    """The resample kernel's work for axes of ``(input, output)`` sizes, each scaled
    by their ratio with half-pixel offsets."""
    axes = tuple(
        _plan.Axis(n_in, n_out, _plan.Affine(n_out / n_in, 0.5, -0.5), linear, "half_up")
        for n_in, n_out in sizes
    )
    return _pallas._work(axes, transpose)


def test_launch_reads_pairs_and_holds_short_rows_together():
    # Every launch reads a last axis in pairs where it repeats so (``_pairs`` says
    # where), and holds a program's rows as one tile where they are of one channel
    # and a row alone would leave a thread one element or less: a tile of 128
    # columns on 4 warps.
    work = kernel_work([(1, 1), (32, 64), (64, 192)])  # 3x: not read in pairs

    def launch(out):
        return _pallas._launch(out, work, 4, False)

    assert all(launch(out).paired for out in [(8, 64, 512, 1), (8, 64, 512, 32)])
    assert launch((8, 64, 128, 1)).rows_together
    assert launch((8, 64, 100, 1)).rows_together  # a tile of 128 columns
    assert not launch((8, 64, 129, 1)).rows_together  # 256
    assert not launch((8, 64, 512, 1)).rows_together
    assert not launch((8, 64, 128, 32)).rows_together  # 32 channels, 32 columns


def test_launch_holds_rows_of_two_outputs_a_lane_together_for_whole_vector_stores():
    # With two outputs a lane (a 2x upsampling along the last axis) and two row
    # taps, a row alone of 512 columns on 128 threads stores 8 bytes a thread in
    # half precision: the rows are held together, whose tile stores 16-byte
    # vectors (so in the gradient of 0.5x). A float32 row of 512 stores 16; a row
    # of two inputs a lane (the gradient of 2x) and a row of four row taps (a 3-D
    # linear 2x upsampling) stay alone.
    def together(sizes, itemsize, linear=True, transpose=False):
        work = kernel_work(sizes, linear, transpose)
        out_shape = _pallas._out_shape(tuple(n for n, _ in sizes), work)
        view = _pallas._view(out_shape, work.first, work.last)
        return _pallas._launch(view, work, itemsize, False).rows_together

    upsampling = [(8, 8), (256, 512), (256, 512)]
    assert together(upsampling, 2)
    assert together(upsampling, 2, linear=False)  # one row tap
    assert together(upsampling, 1)
    assert not together(upsampling, 4)
    assert together([(8, 8), (128, 256), (128, 256)], 4)  # 8 bytes a thread
    assert not together([(8, 8), (256, 512), (512, 1024)], 2)  # 16 bytes a thread
    assert not together(upsampling, 2, transpose=True)  # the gradient of 2x
    assert together([(8, 8), (512, 256), (512, 256)], 2, transpose=True)  # of 0.5x
    assert not together([(8, 16), (16, 32), (256, 512)], 2)  # 4 row taps
    assert together([(8, 16), (16, 32), (256, 512)], 2, linear=False)


@needs_kernels
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_default_launch_of_a_half_precision_2x_upsampling_matches_the_reference(patch, mode):
    # A bfloat16 2x upsampling along a last axis of 160 columns (a tile of 512
    # output columns) is launched with its rows together (above), and its results
    # are float64's to bfloat16's rounding; nearest neighbour moves the values.
    chosen, launched = _pallas._launch, []

    def recording(*args, **kwargs):
        launched.append(chosen(*args, **kwargs))
        return launched[-1]

    patch(_pallas, "_launch", recording)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((1, 2, 3, 160)), jnp.bfloat16)
    scales = (1, 1, 2.0, 2.0)
    y = jaxgrad.resample(x, scales, mode=mode, **KERNEL)
    assert {(launch.cols, launch.rows_together) for launch in launched} == {(512, True)}
    args = scales, (0.5,) * 4, (-0.5,) * 4, mode, "half_up"
    want = reference_resample(np.asarray(x, np.float64), y.shape, *args)
    tol = TOLERANCE[np.dtype(jnp.bfloat16)]
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=tol, atol=tol)
    if mode == "nearest":
        portable = jaxgrad.resample(x, scales, mode=mode, implementation="xla")
        np.testing.assert_array_equal(np.asarray(y), np.asarray(portable))


def test_columns_are_read_in_pairs_where_they_repeat_every_two():
    # Two outputs a lane, one input on: 2x upsampling and the gradient of 0.5x. A
    # half-pixel linear 2x reads its first and last output columns on their own
    # (clamped).
    linear_2x = _pallas._pairs(last_axis_plan(8, 16, 2.0, True, False), channels=1)
    assert linear_2x == _pallas._Pairs(
        outputs=2,
        inputs=1,
        taps=(((-1, 0.25), (0, 0.75)), ((0, 0.75), (1, 0.25))),
        edges=((0, ((0, 1.0),)), (15, ((7, 1.0),))),
    )
    # One output a lane, two inputs on: 0.5x and the gradient of 2x.
    linear_half = _pallas._pairs(last_axis_plan(16, 8, 0.5, True, False), channels=1)
    assert linear_half == _pallas._Pairs(
        outputs=1, inputs=2, taps=(((0, 0.5), (1, 0.5)),), edges=()
    )
    for linear in (False, True):
        for n_in, n_out, scale, transpose, outputs in [
            (8, 16, 2.0, False, 2),
            (16, 8, 0.5, True, 2),
            (16, 8, 0.5, False, 1),
            (8, 16, 2.0, True, 1),
        ]:
            plan = last_axis_plan(n_in, n_out, scale, linear, transpose)
            assert _pallas._pairs(plan, channels=1).outputs == outputs
            # Channels after the axis: the tile's loads run along them already.
            assert not _pallas._pairs(plan, channels=3)
        assert not _pallas._pairs(last_axis_plan(10, 17, 1.7, linear, False), channels=1)
        assert not _pallas._pairs(last_axis_plan(8, 24, 3.0, linear, False), channels=1)
    # An output far longer than the scale says clamps many columns: the table reads them.
    assert not _pallas._pairs(last_axis_plan(8, 40, 2.0, True, False), channels=1)


@st.composite
def row_pattern_configs(draw):
    """Configs of a resampled row axis long enough for blocks of whole periods
    inside its pattern (``row_axis``), after none or one other row axis, and a
    resampled column axis (the last, or channels after it); any offsets, rounding
    and mode."""
    outer = draw(st.sampled_from([(), (3,)]))
    channels = draw(st.sampled_from([(), (3,)]))
    in_shape = (draw(st.integers(1, 2)), *outer, draw(st.integers(12, 40)), draw(st.integers(1, 9)))
    scales = (
        1.0,
        *(draw(st.sampled_from([2.0, 0.5, 1.7])) for _ in outer),
        draw(st.sampled_from([2.0, 0.5, 1.7, 1.3, 3.0, 2.5, 0.75])),
        draw(st.sampled_from([2.0, 0.5, 1.7])),
    )
    row_axis = 1 + len(outer)
    c = drawn_config(
        draw, in_shape + channels, scales + (1.0,) * len(channels), longer_axis=row_axis
    )
    return {**c, "row_axis": row_axis}


@settings(max_examples=examples(200), deadline=None)
@given(row_pattern_configs(), st.integers(1, 8), st.booleans())
def test_row_pattern_reads_the_rows_the_tables_list(c, rows, transpose):
    # A block of whole periods starting at a multiple of the period, inside the
    # rows that follow the pattern, reads for each of its rows the inputs and
    # weights the axis's listed table gives that row, in the same order.
    d = c["row_axis"]
    axis = _plan.Axis(
        c["in_shape"][d],
        c["out_shape"][d],
        _plan.Affine(c["scales"][d], c["a"][d], c["b"][d]),
        c["mode"] == "linear",
        c["rounding"],
    )
    plan = _plan.plan(axis, transpose)
    pattern = _pallas._row_pattern(plan, rows)
    if pattern is None:
        assert not plan.period or plan.period * -(-rows // plan.period) > 32
        return
    block = len(pattern.taps)
    assert block % plan.period == 0 and block >= rows
    listed = plan.listed()
    for start in range(0, plan.n_rows - block + 1, block):
        if start < pattern.first or start + block > pattern.stop:
            continue
        base = start // pattern.period * pattern.shift
        for r, taps in enumerate(pattern.taps):
            valid = listed.valid[start + r]
            assert [base + offset for offset, _ in taps] == list(listed.index[start + r][valid])
            assert [weight for _, weight in taps] == list(listed.weights[start + r][valid])


# Each example compiles a new interpreted kernel.
@needs_kernels
@settings(max_examples=examples(10), deadline=None)
@given(row_pattern_configs(), st.integers(0, 2**31 - 1), st.booleans())
@example(  # two linear row axes: the first's weights scale each row the block reads
    c=dict(
        in_shape=(2, 3, 40, 4, 3),
        out_shape=(2, 5, 122, 8, 3),
        scales=(1.0, 1.7, 3.0, 2.0, 1.0),
        a=0.5,
        b=-0.5,
        mode="linear",
        rounding="half_up",
        row_axis=2,
    ),
    seed=1,
    paired=False,
)
def test_kernel_reading_rows_by_their_pattern_matches_reference(c, seed, paired):
    with launches_with(row_pattern=True, paired=paired):
        assert_kernel_matches_references(c, seed)


@needs_kernels
@pytest.mark.parametrize(
    ("in_shape", "scales", "offsets", "at_x", "at_dy"),
    [
        ((2, 40, 6), (1, 1.7, 2.0), (0.5, -0.5), (1, 17, 2), (0, 30, 5)),
        # Two row axes, sampled on input rows (offsets 0): the first's even rows
        # have one tap, the other missing, and a missing tap's row would be clipped
        # to the first input row, where the infinities are.
        ((2, 4, 24, 6), (1, 2.0, 2.0, 2.0), (0, 0), (0, 0, 0, 0), (0, 0, 0, 1)),
    ],
    ids=["one row axis", "two row axes"],
)
def test_kernel_reading_rows_by_their_pattern_reaches_only_the_results_that_read_an_infinity(
    in_shape, scales, offsets, at_x, at_dy
):
    # Inside the pattern an input row is read once for every output row that reads
    # it: an infinity in it reaches exactly the results whose sums read it (inf,
    # not NaN), those the reference gives a weight, as through the tables.
    out_shape = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
    c = dict(in_shape=in_shape, out_shape=out_shape, scales=scales, a=offsets[0], b=offsets[1])
    c.update(mode="linear", rounding="half_up")
    x, dy = np.ones(c["in_shape"]), np.ones(c["out_shape"])
    x[at_x], dy[at_dy] = np.inf, -np.inf
    results, patterns, pattern_of = {}, [], _pallas._last_row_pattern

    def recorded(*args):
        patterns.append(pattern_of(*args))
        return patterns[-1]

    for pattern in (False, True):
        with (
            launches_with(row_pattern=pattern),
            mock.patch.object(_pallas, "_last_row_pattern", recorded),
        ):
            results[pattern] = both_ways(
                jnp.asarray(x), jnp.asarray(dy), c["in_shape"], c["scales"], **kwargs(c)
            )
    assert patterns and None not in patterns  # every kernel traced: forward and gradient
    one_x, one_dy = np.zeros(c["in_shape"]), np.zeros(c["out_shape"])
    one_x[at_x] = one_dy[at_dy] = 1
    reached = (
        reference_resample(one_x, c["out_shape"], *ref_args(c)) != 0,
        reference_resample_grad(one_dy, c["in_shape"], *ref_args(c)) != 0,
    )
    for by_pattern, by_table, want in zip(results[True], results[False], reached, strict=True):
        assert want.sum() >= 2 and not np.isnan(by_pattern).any()
        np.testing.assert_array_equal(np.isinf(by_pattern), want)
        np.testing.assert_allclose(by_pattern, by_table, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize(
    ("shape", "scales"),
    [
        ((2, 3, 64, 64), (1, 1, 1.7, 1.7)),
        ((2, 64, 64, 8), (1, 2, 2, 1)),
        ((1, 2, 16, 16, 16), (1, 1, 2, 2, 2)),
    ],
    ids=["NCHW 1.7x", "NHWC 2x", "NCDHW 2x"],
)
def test_kernel_reading_rows_by_their_pattern_lowers_for_cuda(shape, scales):
    # The block's branch and its straight-line rows lower for CUDA, beside the row
    # loop through the tables, forward and gradient; with two row axes, the
    # branches around the first axis's taps too.
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    out_shape = jax.eval_shape(lambda x: jaxgrad.resample(x, scales, **KERNEL), x).shape
    dy = jax.ShapeDtypeStruct(out_shape, jnp.bfloat16)
    ops = [
        (lambda x: jaxgrad.resample(x, scales, mode="linear", **KERNEL), x),
        (lambda dy: jaxgrad.resample_grad(dy, shape, scales, mode="linear", **KERNEL), dy),
    ]
    for op, operand in ops:
        table = lowered_text(op, operand, platform="cuda")
        with launches_with(row_pattern=True):
            text = lowered_text(op, operand, platform="cuda")
        assert text.count(TRITON_CALL) == 1 and text != table


# Every launch option a GPU run may time (benchmarks/tune.py, benchmarks/compare.py).
LOWERED_OPTIONS = [{}, *LAUNCH_OPTIONS, {"row_pattern": True}, {"warps": 1}]


# Lowering builds each kernel's Triton program, as a GPU run would, without running
# it: cheap enough to draw from the reference tests' whole space of configurations.
@needs_kernels
@settings(max_examples=examples(25), deadline=None)
@given(configs(), st.sampled_from(LOWERED_OPTIONS), st.data())
def test_kernel_lowers_for_cuda_in_every_configuration(c, fields, data):
    # Nearest neighbour moves integers and booleans too, forward only.
    moved = [jnp.uint8, jnp.int32, jnp.bool_] if c["mode"] == "nearest" else []
    dtype = data.draw(st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16, *moved]))
    x = jax.ShapeDtypeStruct(c["in_shape"], dtype)
    dy = jax.ShapeDtypeStruct(c["out_shape"], dtype)
    ops = [
        (
            lambda x: jaxgrad.resample(
                x, c["scales"], output_shape=c["out_shape"], **kwargs(c), **KERNEL
            ),
            x,
        ),
    ]
    if jnp.issubdtype(dtype, jnp.floating):
        ops.append(
            (
                lambda dy: jaxgrad.resample_grad(
                    dy, c["in_shape"], c["scales"], **kwargs(c), **KERNEL
                ),
                dy,
            )
        )
    for op, operand in ops:
        with launches_with(**fields):
            calls = lowered_text(op, operand, platform="cuda").count(TRITON_CALL)
        # One kernel, or none where the map is the identity (the same shape in and out).
        assert calls == 1 or (calls == 0 and c["in_shape"] == c["out_shape"])


# A GPU reads past an array where interpret mode would clamp a lane into it: every
# access checked, over the configurations of the reference tests, of the columns
# read in pairs and of the rows read by their pattern, under every launch option.
@needs_kernels
@settings(max_examples=examples(12), deadline=None)
@given(
    st.one_of(
        st.tuples(configs(), st.sampled_from(LOWERED_OPTIONS)),
        st.tuples(
            last_axis_configs(), st.sampled_from([o for o in LAUNCH_OPTIONS if o.get("paired")])
        ),
        st.tuples(row_pattern_configs(), st.just({"row_pattern": True})),
    ),
    st.integers(0, 2**31 - 1),
)
def test_kernel_accesses_only_lanes_inside_its_arrays(case, seed):
    c, fields = case
    with bounds_checked_kernels(), launches_with(**fields):
        assert_kernel_matches_references(c, seed)


@needs_kernels
def test_bounds_checked_kernels_catch_a_lane_outside():
    # What the property above relies on: a load whose mask lets a lane through past
    # the array's end fails there, where interpret mode alone reads the last element.
    def kernel(x_ref, out_ref, *, shift):
        lanes = jnp.arange(8, dtype=jnp.int32)
        value = plgpu.load(x_ref.at[lanes + shift], mask=lanes + 1 < 8, other=0)
        plgpu.store(out_ref.at[lanes], value)

    def run(shift):
        return pl.pallas_call(
            functools.partial(kernel, shift=shift),
            out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
            interpret=True,
        )(jnp.arange(8.0, dtype=jnp.float32))

    np.testing.assert_array_equal(run(2), [2, 3, 4, 5, 6, 7, 7, 0])  # lane 6 clamped
    with bounds_checked_kernels():
        np.testing.assert_array_equal(run(1), [1, 2, 3, 4, 5, 6, 7, 0])  # lane 7 masked
        with pytest.raises(Exception, match="outside its \\(8,\\) array"):
            run(2).block_until_ready()


@needs_kernels
@pytest.mark.parametrize("fields", [{}, {"row_pattern": True}], ids=["tables", "row pattern"])
def test_kernel_summing_row_taps_in_a_loop_lowers_for_cuda(fields):
    # More row taps than the kernel unrolls are summed in a loop whose index is
    # divided and taken modulo each row axis's taps, through the tables or by the
    # row pattern (every launch option: the lowering property). The gradient of a 4x
    # linear channels-last volume has 8 taps along each of its row axes, the depth
    # and the height; an NCHW image with the input pixel offset 0 two along its
    # batch and its channels, and 8 along its rows at 4x.
    volume = jax.ShapeDtypeStruct((2, 32, 32, 32, 8), jnp.bfloat16)
    image = jax.ShapeDtypeStruct((2, 16, 32, 32), jnp.float32)
    ops = [
        (
            lambda dy: jaxgrad.resample_grad(
                dy, (2, 8, 8, 8, 8), (1, 4, 4, 4, 1), mode="linear", **KERNEL
            ),
            volume,
        ),
        (
            lambda dy: jaxgrad.resample_grad(
                dy, (2, 16, 8, 8), (1, 1, 4, 4), mode="linear", input_pixel_offsets=0.0, **KERNEL
            ),
            image,
        ),
    ]
    for op, operand in ops:
        with launches_with(**fields):
            text = lowered_text(op, operand, platform="cuda")
        assert text.count(TRITON_CALL) == 1


@needs_kernels
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_kernel_launch_options_lower_for_cuda(mode):
    # What the launch options add are operations the Triton backend must lower: the
    # paired tile's interleave (a join on a new last axis, then a reshape), its
    # split of column pairs, its merged edges; a [rows, columns] tile's row
    # tables read as vectors. NCHW 2x and 0.5x, a 3-D volume, and their
    # gradients, each a program of its own under each option.
    x, volume = (jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in [(2, 3, 64, 64), (1, 2, 8, 8, 16)])
    ops = [
        (lambda x: jaxgrad.resample(x, (1, 1, 2, 2), mode=mode, **KERNEL), x),
        (lambda x: jaxgrad.resample(x, (1, 1, 0.5, 0.5), mode=mode, **KERNEL), x),
        (
            lambda x: jaxgrad.resample_grad(
                x, (2, 3, 128, 128), (1, 1, 0.5, 0.5), mode=mode, **KERNEL
            ),
            x,
        ),
        (lambda x: jaxgrad.resample_grad(x, (2, 3, 32, 32), (1, 1, 2, 2), mode=mode, **KERNEL), x),
        (lambda x: jaxgrad.resample(x, (1, 1, 2, 2, 2), mode=mode, **KERNEL), volume),
        (
            lambda x: jaxgrad.resample_grad(
                x, (1, 2, 4, 4, 8), (1, 1, 2, 2, 2), mode=mode, **KERNEL
            ),
            volume,
        ),
    ]
    for op, operand in ops:
        with launches_with(**LAUNCH_OPTIONS[0]):  # neither option
            table = lowered_text(op, operand, platform="cuda")
        for fields in LAUNCH_OPTIONS[1:]:
            with launches_with(**fields):
                text = lowered_text(op, operand, platform="cuda")
            assert text.count(TRITON_CALL) == 1 and text != table, fields


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_kernel_reading_columns_in_pairs_in_every_float_dtype(dtype, mode):
    # NCHW 2x and 0.5x and their gradients: the table's float32 arithmetic, so its
    # error against float64; nearest moves values exactly.
    rng = np.random.default_rng(7)
    for scales in [(1, 1, 2.0, 2.0), (1, 1, 0.5, 0.5)]:
        x = jnp.asarray(rng.normal(size=(2, 3, 6, 20)), dtype)
        with launches_with(paired=True):
            y = jaxgrad.resample(x, scales, mode=mode, **KERNEL)
            dy = jnp.asarray(rng.normal(size=y.shape), dtype)
            dx = jaxgrad.resample_grad(dy, x.shape, scales, mode=mode, **KERNEL)
        tol = TOLERANCE[np.dtype(dtype)]
        args = scales, (0.5,) * 4, (-0.5,) * 4, mode, "half_up"
        expected = reference_resample(np.asarray(x, np.float64), y.shape, *args)
        np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=tol, atol=tol)
        expected = reference_resample_grad(np.asarray(dy, np.float64), x.shape, *args)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(np.asarray(dx, np.float64), expected, rtol=tol, atol=tol * scale)
        if mode == "nearest":
            portable = jaxgrad.resample(x, scales, mode=mode, implementation="xla")
            np.testing.assert_array_equal(np.asarray(y), np.asarray(portable))


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("rows_together", [False, True])
def test_runs_in_pairs_off_their_alignment_are_read_from_aligned_vectors(dtype, rows_together):
    # A run of columns read in pairs that starts off a vector's alignment (2x reads
    # x[m - 1], x[m], x[m + 1]; with offsets, runs of pairs start at 2m - 2) is read
    # from the aligned vectors under it, each thread's group of columns moved into
    # place in registers. A thread holds a group (8 columns of 16 bits, 4 of 32) of
    # long rows on one warp. The same values: float64's results, to the dtype's
    # rounding, and nearest neighbour's values moved exactly. Rows of 255 columns
    # (and their gradients' of 510) start aligned to no group, so there every run
    # is read as it is (``_kernels.row_aligned``).
    rng = np.random.default_rng(10)
    tol = TOLERANCE[np.dtype(dtype)]
    cases = [
        ((1, 2, 256), (1, 1, 2.0), 0.5, -0.5, True),
        ((1, 2, 1024), (1, 1, 0.5), 0.25, 0.0, True),
        ((1, 2, 255), (1, 1, 2.0), 0.5, -0.5, False),
    ]
    for in_shape, scales, a, b, aligned_rows in cases:
        x = jnp.asarray(rng.normal(size=in_shape), dtype)
        for mode in ("nearest", "linear"):
            spy = mock.patch.object(_kernels, "aligned_run", wraps=_kernels.aligned_run)
            with launches_with(paired=True, rows_together=rows_together, warps=1), spy as read:
                options = dict(mode=mode, input_pixel_offsets=a, output_pixel_offsets=b)
                y = jaxgrad.resample(x, scales, **options, **KERNEL)
                dy = jnp.asarray(rng.normal(size=y.shape), dtype)
                dx = jaxgrad.resample_grad(dy, x.shape, scales, **options, **KERNEL)
            # Nearest neighbour's runs start on a lane here: no run to move.
            assert (read.call_count > 0) == (mode == "linear" and aligned_rows), (in_shape, mode)
            args = scales, (a,) * 3, (b,) * 3, mode, "half_up"
            want = reference_resample(np.asarray(x, np.float64), y.shape, *args)
            np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=tol, atol=tol)
            want = reference_resample_grad(np.asarray(dy, np.float64), x.shape, *args)
            atol = tol * np.abs(want).max()
            np.testing.assert_allclose(np.asarray(dx, np.float64), want, rtol=tol, atol=atol)
            if mode == "nearest":
                portable = jaxgrad.resample(x, scales, **options, implementation="xla")
                np.testing.assert_array_equal(np.asarray(y), np.asarray(portable))


@needs_kernels
@pytest.mark.parametrize("transform", ["eager", "jit", "vmap"])
def test_kernel_under_transforms(transform):
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, 5, 6)), jnp.float32)
    fn = transformed(lambda x: jaxgrad.resample(x, (1, 2, 1.5), mode="linear", **KERNEL), transform)
    expected = transformed(lambda x: jaxgrad.resample(x, (1, 2, 1.5), mode="linear"), transform)
    np.testing.assert_allclose(fn(x), expected(x), rtol=1e-6, atol=1e-6)


@needs_kernels
def test_kernel_check_grads():
    # Second order: resample's VJP is resample_grad's kernel, and its VJP resample's.
    x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 4, 5)))
    check_grads(
        lambda x: jaxgrad.resample(x, (1, 1.5, 2), mode="linear", **KERNEL),
        (x,),
        order=2,
        modes=["rev"],
    )


@needs_kernels
def test_kernel_vjps_are_kernels():
    x = jnp.ones((2, 4, 5), jnp.float32)

    def loss(x):
        return jnp.sum(jaxgrad.resample(x, (1, 2, 2), mode="linear", **KERNEL) ** 2)

    text = lowered_text(jax.grad(loss), x, platform="cuda")
    assert text.count(TRITON_CALL) == 2  # forward and gradient, both kernels


@needs_kernels
@pytest.mark.parametrize("ctm", ["half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_takes_the_kernel(ctm, mode):
    x = jnp.asarray(np.random.default_rng(7).normal(size=(2, 7, 5, 3)), jnp.float32)
    kw = dict(mode=mode, coordinate_transformation_mode=ctm)
    kernel = jaxgrad.resize(x, (2, 12, 4, 3), **kw, **KERNEL)
    portable = jaxgrad.resize(x, (2, 12, 4, 3), **kw, implementation="xla")
    np.testing.assert_allclose(kernel, portable, rtol=1e-6, atol=1e-6)


@needs_kernels
def test_kernel_with_identity_and_empty_axes():
    x = jnp.ones((2, 3), jnp.float32)
    np.testing.assert_array_equal(jaxgrad.resample(x, (1, 1), **KERNEL), x)
    empty = jaxgrad.resample(jnp.ones((0, 3)), (1, 2), output_shape=(0, 6), **KERNEL)
    assert empty.shape == (0, 6)


# ----------------------------------------------------------------------------------
# The portable implementation on GPUs: every axis in one expression
# ----------------------------------------------------------------------------------


@contextlib.contextmanager
def joint_on_the_cpu():
    """``implementation="xla"`` as GPUs run it: every axis's taps in one expression
    where applying the axes one at a time would take XLA:GPU a pass per axis."""
    jax.clear_caches()
    with mock.patch.object(_xla, "_GPU_PLATFORMS", ("cpu", "cuda", "rocm")):
        yield
    jax.clear_caches()


# Where XLA:GPU would take a pass per axis (forward and gradient, but the 2x by 2x
# gradient, one pass): the joint form's cases.
JOINT_CASES = [
    ((2, 5, 7, 3), (1, 1.7, 1.7, 1)),
    ((3, 4, 5), (2, 2, 2)),
    ((6, 5), (3, 2)),
    ((4, 6), (0.7, 1.5)),
    ((2, 3, 5, 7), (1, 1, 2, 2)),
]


@settings(max_examples=examples(15), deadline=None)
@given(configs(), st.integers(0, 2**31 - 1))
def test_joint_form_matches_reference(c, seed):
    rng = np.random.default_rng(seed)
    x, dy = rng.normal(size=c["in_shape"]), rng.normal(size=c["out_shape"])
    kw = dict(output_pixel_offsets=c["b"], input_pixel_offsets=c["a"], implementation="xla")
    kw |= dict(mode=c["mode"], rounding=c["rounding"])
    with joint_on_the_cpu():
        y = jaxgrad.resample(jnp.asarray(x), c["scales"], output_shape=c["out_shape"], **kw)
        dx = jaxgrad.resample_grad(jnp.asarray(dy), c["in_shape"], c["scales"], **kw)
    assert_matches_references(c, x, dy, y, dx)


@pytest.mark.parametrize("in_shape, scales", JOINT_CASES)
def test_joint_form_is_taken_where_gpus_would_take_a_pass_per_axis(in_shape, scales):
    # The joint form is traced for these cases, forward and gradient, and gives the
    # values of the axes applied one at a time, up to rounding.
    # Infinities in two corners reach exactly the outputs that read them (inf, not
    # NaN, where a row has fewer taps than the table or a tap has no weight).
    rng = np.random.default_rng(4)
    x = rng.normal(size=in_shape)
    x.flat[[0, -1]] = np.inf
    out_shape = tuple(int(n * s) for n, s in zip(in_shape, scales, strict=True))
    dy = rng.normal(size=out_shape)
    dy.flat[[0, -1]] = -np.inf
    x, dy = jnp.asarray(x), jnp.asarray(dy)
    kw = dict(mode="linear", implementation="xla")

    def both():
        y = jaxgrad.resample(x, scales, **kw)
        return y, jaxgrad.resample_grad(dy, in_shape, scales, **kw)

    by_axis = both()
    with (
        joint_on_the_cpu(),
        mock.patch.object(_xla, "_apply_jointly", wraps=_xla._apply_jointly) as spy,
    ):
        jointly = both()
    assert spy.call_count == (1 if scales == (1, 1, 2, 2) else 2)
    for result, expected in zip(jointly, by_axis, strict=True):
        assert not np.isnan(expected).any()
        np.testing.assert_allclose(result, expected, rtol=1e-13, atol=1e-13)


def test_joint_form_is_not_taken_where_one_pass_suffices():
    # Nearest neighbour, one resampled axis, a shrinking forward, a 2x gradient.
    x = jnp.ones((2, 3, 8, 8))
    with (
        joint_on_the_cpu(),
        mock.patch.object(_xla, "_apply_jointly", wraps=_xla._apply_jointly) as spy,
    ):
        jaxgrad.resample(x, (1, 1, 2, 2), mode="nearest", implementation="xla")
        jaxgrad.resample(x, (1, 1, 1, 1.7), mode="linear", implementation="xla")
        jaxgrad.resample(x, (1, 1, 0.5, 0.7), mode="linear", implementation="xla")
        jaxgrad.resample_grad(x, (2, 3, 4, 4), (1, 1, 2, 2), mode="linear", implementation="xla")
    assert spy.call_count == 0


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("in_shape, scales", JOINT_CASES[:3])
def test_joint_form_accumulates_half_precision_in_float32(dtype, in_shape, scales):
    # As the kernel: summed in float32 and rounded once, so the half result is the
    # float32 result rounded, bit for bit. Signs, zeros and infinities included.
    rng = np.random.default_rng(5)
    out_shape = tuple(int(n * s) for n, s in zip(in_shape, scales, strict=True))
    dy = rng.normal(size=out_shape)
    dy.flat[:4] = [-0.0, np.inf, -np.inf, -1e-30]
    dy = jnp.asarray(dy, dtype)
    with joint_on_the_cpu():
        half = jaxgrad.resample_grad(dy, in_shape, scales, mode="linear", implementation="xla")
        full = jaxgrad.resample_grad(
            dy.astype(jnp.float32), in_shape, scales, mode="linear", implementation="xla"
        )
    np.testing.assert_array_equal(
        np.asarray(half, np.float32), np.asarray(full.astype(dtype), np.float32)
    )


def test_joint_form_leaves_the_cpu_program_as_it_was(patch):
    # The CPU (and TPU) keep the axes one at a time: XLA:CPU compiles "xla" to the
    # same program as with no joint form at all. (Compiled for the CPU whatever
    # the default device: a GPU takes the joint form.)
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    x = jax.ShapeDtypeStruct((2, 3, 8, 8), jnp.float32, sharding=cpu)

    def program():
        kw = dict(mode="linear", implementation="xla")
        fn = jax.jit(lambda x: jaxgrad.resample(x, (1, 1, 2, 2), **kw))
        text = re.sub(r", metadata=\{[^}]*\}", "", fn.lower(x).compile().as_text())
        return [line for line in text.splitlines() if " = " in line]

    with_joint_form = program()
    patch(_xla, "_joint_fits", lambda plans: False)
    jax.clear_caches()  # the op's traced core would outlive the patch
    assert program() == with_joint_form


# ----------------------------------------------------------------------------------
# Choosing the implementation
# ----------------------------------------------------------------------------------


def lowered(
    implementation, platform, *, mode="linear", dtype=jnp.float32, grad=False, scales=(1, 1, 2, 2)
):
    """The program of resample (or resample_grad) of a [2, 4, 8, 8] array (2x by
    default), lowered for ``platform``."""
    kw = dict(mode=mode, implementation=implementation)
    shape = (2, 4, 8, 8)
    if grad:
        fn = lambda dy: jaxgrad.resample_grad(dy, shape, scales, **kw)  # noqa: E731
        out = tuple(int(n * s) for n, s in zip(shape, scales, strict=True))
        arg = jax.ShapeDtypeStruct(out, dtype)
    else:
        fn = lambda x: jaxgrad.resample(x, scales, **kw)  # noqa: E731
        arg = jax.ShapeDtypeStruct(shape, dtype)
    return lowered_text(fn, arg, platform=platform)


def test_default_is_the_portable_program_on_the_cpu(patch):
    # No CUDA GPU in the process (as on a machine without one, whatever this one has).
    patch(_implementation, "_cuda_capability", lambda: None)
    for grad in (False, True):
        assert lowered(None, "cpu", grad=grad) == lowered("xla", "cpu", grad=grad)


@needs_kernels
def test_default_takes_the_kernel_where_xla_falls_short_on_cuda(patch):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    assert TRITON_CALL not in lowered(None, "cpu")
    # Nearest neighbour in float32, and float64: XLA's program.
    assert TRITON_CALL not in lowered(None, "cuda", mode="nearest")
    assert TRITON_CALL not in lowered(None, "cuda", mode="nearest", grad=True)
    assert TRITON_CALL not in lowered(None, "cuda", dtype=jnp.float64)
    # Nearest neighbour in half precision, forward and gradient: the kernel (but
    # for a gradient along the last axis, below), except a forward that shrinks
    # every axis it resamples.
    for dtype in (jnp.bfloat16, jnp.float16):
        for scales in [(1, 1, 2, 2), (1, 1, 2, 0.5), (1, 1.5, 1, 1)]:
            assert TRITON_CALL in lowered(None, "cuda", mode="nearest", dtype=dtype, scales=scales)
        assert TRITON_CALL in lowered(
            None, "cuda", mode="nearest", dtype=dtype, grad=True, scales=(1, 2, 2, 1)
        )
        assert TRITON_CALL in lowered(
            None, "cuda", mode="nearest", dtype=dtype, grad=True, scales=(1, 0.5, 0.5, 1)
        )
        for scales in [(1, 1, 0.5, 0.5), (1, 1, 1, 0.5), (1, 0.5, 0.7, 1)]:
            got = lowered(None, "cuda", mode="nearest", dtype=dtype, scales=scales)
            assert TRITON_CALL not in got, scales
    # Linear maps XLA compiles into one pass: one axis resampled, forwards that
    # shrink every axis, float32 gradients of two axes each by 2 or 1/k.
    one_axis = [(1, 1, 1.5, 1), (1, 1.5, 1, 1), (1, 1, 1, 3)]
    for dtype in (jnp.float32, jnp.bfloat16):
        for scales in [*one_axis, (1, 1, 0.5, 0.5), (1, 1, 0.25, 0.7), (1, 0.5, 0.5, 0.5)]:
            assert TRITON_CALL not in lowered(None, "cuda", dtype=dtype, scales=scales), scales
    for scales in [*one_axis, (1, 2, 2, 1), (1, 0.5, 2, 1), (1, 0.25, 0.5, 1)]:
        assert TRITON_CALL not in lowered(None, "cuda", grad=True, scales=scales), scales
    # Linear maps XLA splits into a pass per axis: the kernel.
    for dtype in (jnp.float32, jnp.bfloat16):
        for scales in [(1, 1, 2, 2), (1, 1, 2, 0.5), (1, 1, 1.25, 1.25), (1, 2, 2, 2)]:
            assert TRITON_CALL in lowered(None, "cuda", dtype=dtype, scales=scales), scales
    for scales in [(1, 1.5, 1.5, 1), (1, 3, 2, 1), (1, 2, 1.5, 1), (2, 2, 2, 1)]:
        assert TRITON_CALL in lowered(None, "cuda", grad=True, scales=scales), scales
    # Half-precision linear gradients, one pass or not: the kernel.
    for scales in [(1, 2, 2, 1), (1, 0.5, 0.5, 1), (1, 1.5, 1, 1)]:
        for dtype in (jnp.bfloat16, jnp.float16):
            assert TRITON_CALL in lowered(None, "cuda", dtype=dtype, grad=True, scales=scales)
    # Gradients along the last axis (channels first), any mode and dtype: XLA's
    # program, where the kernel would gather along its lanes.
    for mode in ("nearest", "linear"):
        for dtype in (jnp.float32, jnp.bfloat16):
            for scales in [(1, 1, 2, 2), (1, 1, 1.5, 1.5), (1, 2, 2, 2), (1, 1, 1, 0.5)]:
                got = lowered(None, "cuda", mode=mode, dtype=dtype, grad=True, scales=scales)
                assert TRITON_CALL not in got, (mode, dtype, scales)


@needs_kernels
def test_default_is_the_portable_program_on_gpus_older_than_ampere(patch):
    # XLA compiles Triton kernels for compute capability 8.0 and newer only.
    patch(_implementation, "_cuda_capability", lambda: (7, 5))
    for grad in (False, True):
        assert lowered(None, "cuda", grad=grad) == lowered("xla", "cuda", grad=grad)
    patch(_implementation, "_backend_platform", lambda: "cuda")
    with pytest.raises(ValueError, match=r"resample: .* compute capability 8.0 .* 7.5"):
        lowered("pallas", "cpu")


def test_default_falls_back_without_pallas(patch):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    patch(_pallas, "AVAILABLE", False)
    assert TRITON_CALL not in lowered(None, "cuda")
    with pytest.raises(ValueError, match=r"implementation='pallas' needs Pallas' Triton backend"):
        lowered("pallas", "cpu")


# Arrays of more than 2**31 elements (traced, never allocated) that the kernel
# would count past int32: (shape, scales) of bfloat16 linear maps it would take.
PAST_INT32 = [
    # Axes 0 and 1 by 2x: 2**31 channels.
    ((4, 4, 2**29, 4), (2, 2, 1, 1)),
    # Every axis resampled: 2**31 rows in, 2**33 out.
    ((2**16, 2**15, 2), (2, 2, 1.5)),
    # Axes 2 and 3 by 2x: each view fits, the programs (2**31 tiles or more) do not.
    ((2, 2**30, 4, 2, 1), (1, 1, 2, 2, 1)),
]


@needs_kernels
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
@pytest.mark.parametrize("case", PAST_INT32, ids=["channels", "rows", "programs"])
def test_default_leaves_arrays_past_the_kernels_int32_to_xla(patch, case, grad):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    shape, scales = case
    out = tuple(int(n * s) for n, s in zip(shape, scales, strict=True))
    op = "resample_grad" if grad else "resample"

    def program(implementation):
        kw = dict(mode="linear", implementation=implementation)
        if grad:
            fn = lambda dy: jaxgrad.resample_grad(dy, shape, scales, **kw)  # noqa: E731
            return lowered_text(fn, jax.ShapeDtypeStruct(out, jnp.bfloat16), platform="cuda")
        fn = lambda x: jaxgrad.resample(x, scales, **kw)  # noqa: E731
        return lowered_text(fn, jax.ShapeDtypeStruct(shape, jnp.bfloat16), platform="cuda")

    assert program(None) == program("xla")
    with pytest.raises(ValueError, match=rf"^{op}: implementation='pallas' cannot .* int32"):
        program("pallas")


@needs_kernels
def test_explicit_pallas_refuses_more_one_byte_elements_than_int32_offsets_reach(patch):
    # Pallas offsets the elements of an array of at most 4 GiB in int32, of a
    # larger one in int64: 3 * 2**30 bytes in (and 4.5 * 2**30 out) would wrap.
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)

    def program(shape, dtype):
        fn = lambda x: jaxgrad.resample(x, (1, 1.5), implementation="pallas")  # noqa: E731
        return lowered_text(fn, jax.ShapeDtypeStruct(shape, dtype), platform="cuda")

    refused = r"^resample: .* int32, .* the input has 3221225472 elements of one byte"
    for dtype in (jnp.uint8, jnp.int8, jnp.bool_):
        with pytest.raises(ValueError, match=refused):
            program((3, 2**30), dtype)
    # Two bytes: int32 offsets reach every element. Over 4 GiB: int64 offsets.
    assert TRITON_CALL in program((3, 2**30), jnp.int16)
    assert TRITON_CALL in program((5, 2**30), jnp.uint8)


@needs_kernels
def test_the_kernel_takes_the_longest_axis(patch):
    # 2**31 - 1 columns out: the lanes of the last tile stay within int32.
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    x = jax.ShapeDtypeStruct((2, 2**30), jnp.bfloat16)
    longest = (4, 2**31 - 1)
    for implementation in (None, "pallas"):
        kw = dict(mode="linear", output_shape=longest, implementation=implementation)
        forward = lambda x: jaxgrad.resample(x, (2, 2), **kw)  # noqa: E731, B023
        assert TRITON_CALL in lowered_text(forward, x, platform="cuda")


@needs_kernels
def test_explicit_pallas_raises_on_another_backend(patch):
    patch(_implementation, "_backend_platform", lambda: "tpu")
    with pytest.raises(ValueError, match=r"resample: implementation='pallas' runs on CUDA GPUs"):
        lowered("pallas", "cpu")


def test_xla_never_uses_the_kernel(patch):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    assert TRITON_CALL not in lowered("xla", "cuda")


@pytest.mark.parametrize("bad", ["triton", "XLA", 1])
def test_bad_implementation(bad):
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"^resample: implementation must be None"):
        jaxgrad.resample(x, (1, 2), implementation=bad)
    with pytest.raises(ValueError, match=r"^resample_grad: implementation must be None"):
        jaxgrad.resample_grad(x, (2, 3), (1, 1), implementation=bad)
    with pytest.raises(ValueError, match=r"^resize: implementation must be None"):
        jaxgrad.resize(x, (2, 6), implementation=bad)


# ----------------------------------------------------------------------------------
# The kernel lowers for CUDA (Triton), checked on the CPU
# ----------------------------------------------------------------------------------

LOWERING_CASES = [
    # (shape, scales, mode, dtype): NCHW and NHWC 2-D, a 3-D volume, one long axis
    # at 1000x (looped taps), a 1-D axis, integers.
    ((2, 4, 16, 16), (1, 1, 2, 2), "linear", jnp.bfloat16),
    ((2, 16, 16, 4), (1, 0.5, 1.7, 1), "linear", jnp.float16),
    ((1, 2, 8, 8, 8), (1, 1, 2, 2, 2), "linear", jnp.float32),
    ((2, 3, 8), (1, 1, 1000.0), "linear", jnp.float32),
    ((9,), (2.5,), "nearest", jnp.float32),
    ((2, 3, 8, 8), (1, 1, 2, 0.5), "nearest", jnp.int32),
]


@needs_kernels
@pytest.mark.parametrize("case", LOWERING_CASES, ids=lambda c: f"{c[1]}-{c[2]}")
def test_kernel_lowers_for_cuda(case):
    # Builds the kernel's Triton program, as a GPU run would before compiling it:
    # an operation the Triton backend cannot lower fails here, without a GPU.
    shape, scales, mode, dtype = case
    kw = dict(mode=mode, **KERNEL)

    forward = lambda x: jaxgrad.resample(x, scales, **kw)  # noqa: E731
    x = jax.ShapeDtypeStruct(shape, dtype)
    assert lowered_text(forward, x, platform="cuda").count(TRITON_CALL) == 1
    if jnp.issubdtype(dtype, jnp.floating):
        dy = jax.eval_shape(forward, x)
        backward = lambda dy: jaxgrad.resample_grad(dy, shape, scales, **kw)  # noqa: E731
        assert lowered_text(backward, dy, platform="cuda").count(TRITON_CALL) == 1
