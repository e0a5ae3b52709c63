"""The host-side tables of resample: one period of rows and the edges, expanded back
into every row, against the rows listed one by one; sizes that do not grow with the
axis; the byte-bounded cache."""

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxgrad
from jaxgrad._resample import _plan, _resize, _xla


def expanded(plan):
    """Every row of a plan, listed: the head, the pattern repeated with its columns
    shifted, the tail."""
    pieces = [plan.head]
    for k in range((plan.stop - plan.first) // max(plan.period, 1)):
        p = plan.pattern
        pieces.append(_plan.Table(p.index + k * plan.shift * p.valid, p.weights, p.valid))
    pieces.append(plan.tail)
    return [
        np.concatenate([getattr(t, name) for t in pieces]) for name in ("index", "weights", "valid")
    ]


def listed(axis, transpose):
    rows = _plan._input_rows if transpose else _plan._output_rows
    table = rows(axis, 0, axis.n_in if transpose else axis.n_out)
    return table.index * table.valid, table.weights, table.valid


def assert_same_rows(plan, axis, transpose):
    index, weights, valid = expanded(plan)
    want_index, want_weights, want_valid = listed(axis, transpose)
    width = plan.width
    assert want_index.shape[1] == width  # the same summation slots
    np.testing.assert_array_equal(valid, want_valid)
    np.testing.assert_array_equal(index * valid, want_index)
    np.testing.assert_array_equal(weights, want_weights)
    table = plan.listed()  # what the program embeds for a short axis
    np.testing.assert_array_equal(table.index, want_index)
    np.testing.assert_array_equal(table.weights, want_weights)
    np.testing.assert_array_equal(table.valid, want_valid)


RATIOS = [(2, 1), (1, 2), (3, 1), (1, 3), (3, 2), (2, 3), (4, 3), (7, 5), (5, 8), (8, 1), (1, 8)]


@settings(max_examples=examples(150), deadline=None)
@given(
    n_in=st.integers(1, 90),
    ratio=st.sampled_from(RATIOS),
    a=st.sampled_from([0.5, 0.0, 0.25, -2.0, 3.5]),
    b=st.sampled_from([-0.5, 0.0, 0.5, 1.25]),
    mode=st.sampled_from(["nearest", "linear"]),
    rounding=st.sampled_from(["half_up", "down", "up"]),
    transpose=st.booleans(),
)
def test_a_plan_lists_the_same_rows_as_the_matrix(n_in, ratio, a, b, mode, rounding, transpose):
    p, q = ratio
    scale = p / q
    n_out = max(1, math.floor(n_in * scale))
    axis = _plan.Axis(n_in, n_out, _plan.Affine(scale, a, b), mode == "linear", rounding)
    plan = _plan._make_plan(axis, transpose)
    assert_same_rows(plan, axis, transpose)


@pytest.mark.parametrize("ctm", _resize.COORDINATE_TRANSFORMATION_MODES)
@pytest.mark.parametrize(("n_in", "n_out"), [(64, 128), (1000, 1370), (610, 300), (300, 610)])
@pytest.mark.parametrize("transpose", [False, True])
def test_resize_plans_list_the_same_rows(ctm, n_in, n_out, transpose):
    coordinates = _resize._Coordinates(ctm, n_in, n_out, n_out / n_in, 0.0, None)
    axis = _plan.Axis(n_in, n_out, coordinates, True, "half_up")
    plan = _plan._make_plan(axis, transpose)
    if ctm != "align_corners":  # (n_out - 1) / (n_in - 1): periods too long for these
        assert plan.period
    assert_same_rows(plan, axis, transpose)


def test_coordinates_repeat_exactly_and_start_as_written():
    # u(kP + j) = u(j) + kQ, the first period as (o - b) / s - a in float64.
    axis = _plan.Axis(1000, 1370, _plan.Affine(1.37, 0.5, -0.5), True, "half_up")
    o = np.arange(1370)
    base, rest = _plan._split_coordinates(axis, o)
    np.testing.assert_array_equal(rest[:137], (o[:137] + 0.5) / 1.37 - 0.5)
    np.testing.assert_array_equal(rest, np.tile(rest[:137], 10))
    np.testing.assert_array_equal(base, np.repeat(np.arange(10) * 100, 137))


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (2.0, (2, 1)),
        (0.5, (1, 2)),
        (1.37, (137, 100)),
        (1 / 3, (1, 3)),
        (1000.0, (1000, 1)),
        (math.pi, None),
        (5000.0, None),
        (1e-9, None),
        (1 / 4097, None),
    ],
)
def test_period_of(ratio, expected):
    assert _plan.period_of(ratio) == expected


@pytest.mark.parametrize("transpose", [False, True])
def test_tables_do_not_grow_with_the_axis(transpose):
    sizes = []
    for n_in in (1000, 100_000, 10_000_000):
        axis = _plan.Axis(
            n_in, math.floor(n_in * 1.37), _plan.Affine(1.37, 0.5, -0.5), True, "half_up"
        )
        sizes.append(_plan._make_plan(axis, transpose).nbytes)
    assert sizes[0] == sizes[1] == sizes[2] < 8192


def test_an_axis_without_a_pattern_lists_every_row():
    axis = _plan.Axis(50, 157, _plan.Affine(math.pi, 0.5, -0.5), True, "half_up")
    plan = _plan._make_plan(axis, False)
    assert plan.period == 0 and plan.head.rows == 157
    assert_same_rows(plan, axis, False)


def test_the_program_does_not_grow_with_the_axis():
    def text_bytes(n):
        spec = jax.ShapeDtypeStruct((1, n), jnp.float32)
        forward = jax.jit(lambda x: jaxgrad.resample(x, (1, 1.37), mode="linear")).lower(spec)
        m = math.floor(n * 1.37)
        grad = jax.jit(
            lambda dy: jaxgrad.resample_grad(dy, (1, n), (1, 1.37), mode="linear")
        ).lower(jax.ShapeDtypeStruct((1, m), jnp.float32))
        return len(forward.as_text()), len(grad.as_text())

    small, large = text_bytes(8192), text_bytes(4 * 2**20)
    assert large[0] < 1.05 * small[0] and large[1] < 1.05 * small[1]
    assert max(large) < 100_000


def test_the_cache_is_bounded_by_bytes():
    cache = _plan._BytesCache(budget=200_000)
    axes = [
        _plan.Axis(n, 3 * n, _plan.Affine(math.pi, 0.5, -0.5), True, "half_up")
        for n in range(1000, 1010)
    ]
    for axis in axes:
        cache.get(axis, False)  # about 78 KiB each: no pattern, one row per output
        assert 0 < cache._bytes <= 200_000
    assert len(cache._plans) == 2
    assert cache.get(axes[-1], False) is cache.get(axes[-1], False)


@contextlib.contextmanager
def patched(*limits):
    """Each ``(module, name, value)`` of ``limits`` set (then restored), the caches
    cleared."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in limits]
    for module, name, value in limits:
        setattr(module, name, value)
    jax.clear_caches()
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        jax.clear_caches()


LISTED_NONE = (_plan, "LISTED_ROWS", 0)  # every axis computes its rows in the program
UNROLLED_NONE = (_xla, "_MAX_UNROLLED_TAPS", 0)  # every axis loops over its taps


@settings(max_examples=examples(15), deadline=None)
@given(
    n_in=st.integers(2, 40),
    ratio=st.sampled_from(RATIOS),
    offsets=st.sampled_from([(0.5, -0.5), (0.0, 0.0), (-2.0, 1.25)]),
    mode=st.sampled_from(["nearest", "linear"]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
)
def test_computed_indices_and_loops_give_the_listed_results(n_in, ratio, offsets, mode, dtype):
    # Long axes compute their indices from the pattern, and rows with many taps
    # sum them in a loop: the same terms in the same order as the listed tables.
    scales = (1.0, ratio[0] / ratio[1])
    n_out = max(1, math.floor(n_in * scales[1]))
    kw = dict(mode=mode, input_pixel_offsets=offsets[0], output_pixel_offsets=offsets[1])
    rng = np.random.default_rng(n_in)
    x = jnp.asarray(rng.normal(size=(3, n_in)), dtype)
    dy = jnp.asarray(rng.normal(size=(3, n_out)), dtype)

    def both():
        y = jaxgrad.resample(x, scales, output_shape=(3, n_out), **kw)
        return y, jaxgrad.resample_grad(dy, (3, n_in), scales, **kw)

    listed = both()
    with patched(LISTED_NONE):  # every axis computes its indices: the same program
        computed = both()
    for a, b in zip(listed, computed, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    # Every axis loops over its taps. The terms and their order are the same, but
    # XLA:CPU may fuse a multiply-add in the loop body, so a sum can round
    # differently in its last bit.
    ulp = {"float32": 2.0**-23, "bfloat16": 2.0**-7}[dtype]
    for limits in ((UNROLLED_NONE,), (LISTED_NONE, UNROLLED_NONE)):
        with patched(*limits):
            looped = both()
        for a, b in zip(listed, looped, strict=True):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            np.testing.assert_allclose(b, a, rtol=4 * ulp, atol=4 * ulp * np.abs(a).max())


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_a_large_upsampling_gradient_loops_over_its_taps(mode):
    # Each input of a 40x upsampling feeds 40 (nearest) or 80 (linear) outputs: its
    # gradient row sums them in a loop, against the float64 scatter-add reference.
    from test_resample import reference_resample_grad

    rng = np.random.default_rng(0)
    dy = rng.normal(size=(2, 320))
    kw = dict(mode=mode)
    dx = jaxgrad.resample_grad(jnp.asarray(dy), (2, 8), (1, 40.0), **kw)
    args = ((1, 40.0), (0.5, 0.5), (-0.5, -0.5), mode, "half_up")
    np.testing.assert_allclose(dx, reference_resample_grad(dy, (2, 8), *args), rtol=1e-12)
    axis = _plan.Axis(8, 320, _plan.Affine(40.0, 0.5, -0.5), mode == "linear", "half_up")
    assert _plan.plan(axis, True).width > _xla._MAX_UNROLLED_TAPS

    def text_bytes(scale):
        n_out = 64 * scale
        lowered = jax.jit(
            lambda dy: jaxgrad.resample_grad(dy, (1, 64), (1, float(scale)), **kw)
        ).lower(jax.ShapeDtypeStruct((1, n_out), jnp.float32))
        return len(lowered.as_text())

    # The tables hold a few rows of 1000-2000 taps; nothing is unrolled per tap.
    assert text_bytes(1000) < 250_000
