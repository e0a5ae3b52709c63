"""resample and resample_grad against SPEC §2: a literal reference, a scatter-add oracle,
the seeds' examples, adjoint identity, gradients, determinism and errors."""

import collections
import fractions
import functools
import itertools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FLOAT_DTYPES, TOLERANCE, compiled_entry, examples, needs_kernels, transformed
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import jaxgrad

# ----------------------------------------------------------------------------------
# References, written from SPEC §2 literally (in float64: each axis's taps, their
# weights' products and sums), not from the code.
# ----------------------------------------------------------------------------------


def period(s, longest=4096):
    """``(P, Q)`` with ``s == P / Q`` in float64 and both at most ``longest``, or None:
    the scales whose samples the docs define to repeat exactly (docs/resample.md)."""
    ratio = fractions.Fraction(s).limit_denominator(longest)
    p, q = ratio.numerator, ratio.denominator
    return (p, q) if p <= longest and p / q == s else None


def axis_taps(n_in, n_out, s, a, b, mode, rounding):
    """For each output index o, the list of (input index, weight) pairs (SPEC §2.1-2.3),
    with the coordinates repeating exactly at a scale P / Q, as the docs define them:
    u(kP + j) = u(j) + kQ, whose taps are u(j)'s moved kQ inputs on. (Evaluated
    directly in float64, u(o) would round: (1 - 0) / 0.5 - 1e-236 is 2.0, where
    u(0) + 2 = 2 - 1e-236 lies below input 2, and rounds down to input 1.)"""
    ratio = period(s)
    taps = []
    for o in range(n_out):
        k, j = divmod(o, ratio[0]) if ratio else (0, o)
        shift = k * ratio[1] if ratio else 0
        u = (j - b) / s - a
        if mode == "nearest":
            r = {"half_up": math.floor(u + 0.5), "down": math.floor(u), "up": math.ceil(u)}
            taps.append([(min(max(r[rounding] + shift, 0), n_in - 1), 1.0)])
        else:
            i0 = math.floor(u)
            t = u - i0
            i0 += shift
            taps.append([(min(max(i0, 0), n_in - 1), 1.0 - t), (min(max(i0 + 1, 0), n_in - 1), t)])
    return taps


def all_taps(in_shape, out_shape, scales, a, b, mode, rounding):
    return [
        axis_taps(n, m, s, ai, bi, mode, rounding)
        for n, m, s, ai, bi in zip(in_shape, out_shape, scales, a, b, strict=True)
    ]


def tap_combinations(taps):
    """Each choice of one tap per axis (SPEC §2.4's product of the axes' taps), in
    itertools.product's order, for every output at once: the inputs the chosen taps
    read, as an open mesh over the outputs, and the products of their weights (taken
    left to right, as ``math.prod``)."""
    for slots in itertools.product(*(range(len(axis[0])) for axis in taps)):
        chosen = [[tap[k] for tap in axis] for axis, k in zip(taps, slots, strict=True)]
        inputs = np.ix_(*([i for i, _ in axis] for axis in chosen))
        weights = (np.array([w for _, w in axis]) for axis in chosen)
        yield inputs, functools.reduce(np.multiply.outer, weights, np.float64(1.0))


def reference_resample(x, out_shape, scales, a, b, mode, rounding):
    """y[o] = the sum over tap combinations of weight * x[inputs], in float64, the
    combinations in a fixed order; a term of weight 0 is left out, so an infinite
    input it would read stays out of y[o]."""
    x = np.asarray(x, np.float64)
    out = np.zeros(out_shape)
    if out.size:
        for inputs, weight in tap_combinations(
            all_taps(x.shape, out_shape, scales, a, b, mode, rounding)
        ):
            with np.errstate(invalid="ignore"):  # inf * 0, left out by the where
                out += np.where(weight != 0, weight * x[inputs], 0.0)
    return out


def reference_resample_grad(dy, in_shape, scales, a, b, mode, rounding):
    """dx[i] = sum over o of w(o, i) * dy[o]: a literal scatter-add, each output's
    weighted value added into the inputs its taps read (terms of weight 0 left out)."""
    dy = np.asarray(dy, np.float64)
    dx = np.zeros(in_shape)
    if dy.size:
        for inputs, weight in tap_combinations(
            all_taps(in_shape, dy.shape, scales, a, b, mode, rounding)
        ):
            with np.errstate(invalid="ignore"):
                np.add.at(dx, inputs, np.where(weight != 0, weight * dy, 0.0))
    return dx


def scatter_add_oracle(dy, in_shape, scales, a, b, mode, rounding):
    """The gradient as XLA scatter-adds, one axis at a time (what jaxgrad avoids)."""
    taps = all_taps(in_shape, dy.shape, scales, a, b, mode, rounding)
    frozen = tuple(tuple(tuple(tap) for tap in axis) for axis in taps)
    return _scatter_add_axes(jnp.asarray(dy, jnp.float64), tuple(in_shape), frozen)


# One program of a config's scatter-adds: eager, each op of the oracle would be a
# program of its own, and compiling them was most of the oracle's time.
@functools.partial(jax.jit, static_argnums=(1, 2))
def _scatter_add_axes(dy, in_shape, taps):
    out = dy
    for d, axis in enumerate(taps):
        moved = jnp.moveaxis(out, d, 0)
        acc = jnp.zeros((in_shape[d], *moved.shape[1:]), jnp.float64)
        for k in range(max(len(t) for t in axis)):
            idx = np.array([t[k][0] for t in axis])
            w = np.array([t[k][1] for t in axis]).reshape((-1,) + (1,) * (moved.ndim - 1))
            acc = acc.at[idx].add(w * moved)
        out = jnp.moveaxis(acc, 0, d)
    return out


def per_axis(value, rank):
    return (value,) * rank if np.isscalar(value) else tuple(value)


# ----------------------------------------------------------------------------------
# The seeds' example (SPEC §2.6)
# ----------------------------------------------------------------------------------

SEED_X = np.array([[[[1, 2], [3, 4]]]], np.float32)
SEED_SCALES = (1, 1, 0.5, 1.5)
SEED_DY = np.array([[[[4, 5, 6]]]], np.float32)
SEED_FORMS = [
    dict(rounding="down"),  # RESAMPLE2 / RESAMPLE_GRAD1, decreasing direction
    dict(rounding="half_up", input_pixel_offsets=0.5, output_pixel_offsets=0),  # RESAMPLE_GRAD
]


@pytest.mark.parametrize("form", SEED_FORMS)
def test_seed_example(form, transform):
    fwd = transformed(lambda x: jaxgrad.resample(x, SEED_SCALES, **form), transform)
    np.testing.assert_array_equal(fwd(jnp.asarray(SEED_X)), [[[[1, 1, 2]]]])
    bwd = transformed(
        lambda dy: jaxgrad.resample_grad(dy, (1, 1, 2, 2), SEED_SCALES, **form), transform
    )
    np.testing.assert_array_equal(bwd(jnp.asarray(SEED_DY)), [[[[9, 6], [0, 0]]]])
    # And the custom VJP of resample gives the same.
    vjp = jax.vjp(lambda x: jaxgrad.resample(x, SEED_SCALES, **form), jnp.asarray(SEED_X))[1]
    np.testing.assert_array_equal(vjp(jnp.asarray(SEED_DY))[0], [[[[9, 6], [0, 0]]]])


def test_half_up_equals_down_with_shifted_offset():
    # SPEC §2.2: "half_up" with offset a equals "down" with offset a - 0.5.
    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 7)))
    for a in (0.5, 0.0, -0.3, 0.8):
        up = jaxgrad.resample(x, (1.7, 0.6), input_pixel_offsets=a)
        down = jaxgrad.resample(x, (1.7, 0.6), rounding="down", input_pixel_offsets=a - 0.5)
        np.testing.assert_array_equal(up, down)


# ----------------------------------------------------------------------------------
# Random configurations against the references
# ----------------------------------------------------------------------------------


@st.composite
def configs(draw, max_elements=200):
    rank = draw(st.integers(1, 5))
    in_shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    scales = tuple(draw(st.lists(st.floats(0.2, 5.0), min_size=rank, max_size=rank)))
    offset = st.floats(-1.0, 1.0)
    a = draw(st.one_of(offset, st.lists(offset, min_size=rank, max_size=rank)))
    b = draw(st.one_of(offset, st.lists(offset, min_size=rank, max_size=rank)))
    mode = draw(st.sampled_from(["nearest", "linear"]))
    rounding = draw(st.sampled_from(["half_up", "down", "up"]))
    default = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
    if 0 in default or draw(st.booleans()):  # output shapes that disagree with the scale
        out_shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    else:
        out_shape = default
    if math.prod(in_shape) > max_elements or math.prod(out_shape) > max_elements:
        in_shape = tuple(min(n, 3) for n in in_shape)
        out_shape = tuple(min(n, 3) for n in out_shape)
    return dict(
        in_shape=in_shape,
        out_shape=out_shape,
        scales=scales,
        a=a,
        b=b,
        mode=mode,
        rounding=rounding,
    )


def kwargs(c):
    return dict(
        mode=c["mode"],
        rounding=c["rounding"],
        input_pixel_offsets=c["a"],
        output_pixel_offsets=c["b"],
    )


def ref_args(c):
    rank = len(c["in_shape"])
    return c["scales"], per_axis(c["a"], rank), per_axis(c["b"], rank), c["mode"], c["rounding"]


# Each example compiles new shapes; these two properties are the suite's slowest, so
# they draw fewer examples than the profile's 40 (the suite must stay near 10 minutes).
@settings(max_examples=examples(20))
@given(configs(), st.integers(0, 2**31 - 1))
def test_forward_and_gradient_match_reference(c, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=c["in_shape"])
    dy = rng.normal(size=c["out_shape"])
    out = jaxgrad.resample(jnp.asarray(x), c["scales"], output_shape=c["out_shape"], **kwargs(c))
    np.testing.assert_allclose(
        out, reference_resample(x, c["out_shape"], *ref_args(c)), rtol=1e-12, atol=1e-12
    )
    dx = jaxgrad.resample_grad(jnp.asarray(dy), c["in_shape"], c["scales"], **kwargs(c))
    expected = reference_resample_grad(dy, c["in_shape"], *ref_args(c))
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)
    oracle = scatter_add_oracle(dy, c["in_shape"], *ref_args(c))
    np.testing.assert_allclose(dx, oracle, rtol=1e-12, atol=1e-12)


@settings(max_examples=examples(25))
@given(configs(), st.integers(0, 2**31 - 1))
def test_adjoint_identity(c, seed):
    # <A x, y> == <x, A^T y>, the defining property of the gradient.
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=c["in_shape"]))
    y = jnp.asarray(rng.normal(size=c["out_shape"]))
    ax = jaxgrad.resample(x, c["scales"], output_shape=c["out_shape"], **kwargs(c))
    aty = jaxgrad.resample_grad(y, c["in_shape"], c["scales"], **kwargs(c))
    np.testing.assert_allclose(jnp.vdot(ax, y), jnp.vdot(x, aty), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------
# Dtypes, transforms, gradients
# ----------------------------------------------------------------------------------

CASES = [
    # (in_shape, scales, output_shape, mode, rounding)
    ((2, 3, 8, 8), (1, 1, 2, 2), None, "linear", "half_up"),
    ((2, 3, 8, 8), (1, 1, 0.5, 0.5), None, "linear", "half_up"),
    ((2, 3, 8, 8), (1, 1, 2, 2), None, "nearest", "half_up"),
    ((2, 3, 8, 8), (1, 1, 0.5, 0.5), None, "nearest", "down"),
    ((4, 6, 5), (0.5, 1.3, 3.0), (3, 7, 11), "linear", "half_up"),
    ((7,), (1.6,), None, "nearest", "up"),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_dtypes_and_transforms(case, dtype, transform):
    in_shape, scales, out_shape, mode, rounding = case
    rng = np.random.default_rng(1)
    x = rng.normal(size=in_shape)
    fwd = transformed(
        lambda x: jaxgrad.resample(x, scales, mode=mode, rounding=rounding, output_shape=out_shape),
        transform,
    )
    out = fwd(jnp.asarray(x, dtype))
    assert out.dtype == dtype
    shape = out.shape
    expected = reference_resample(
        np.asarray(jnp.asarray(x, dtype), np.float64),
        shape,
        scales,
        (0.5,) * len(in_shape),
        (-0.5,) * len(in_shape),
        mode,
        rounding,
    )
    tol = TOLERANCE[np.dtype(dtype)]
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=tol, atol=tol)

    dy = rng.normal(size=shape)
    bwd = transformed(
        lambda dy: jaxgrad.resample_grad(dy, in_shape, scales, mode=mode, rounding=rounding),
        transform,
    )
    dx = bwd(jnp.asarray(dy, dtype))
    assert dx.dtype == dtype and dx.shape == in_shape
    expected = reference_resample_grad(
        np.asarray(jnp.asarray(dy, dtype), np.float64),
        in_shape,
        scales,
        (0.5,) * len(in_shape),
        (-0.5,) * len(in_shape),
        mode,
        rounding,
    )
    # Sums of several terms: the tolerance is relative to the largest magnitude.
    np.testing.assert_allclose(
        np.asarray(dx, np.float64), expected, rtol=tol, atol=tol * np.abs(expected).max()
    )


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize(
    "in_shape, scales",
    [
        ((16, 16), (4, 4)),  # 8 taps per axis
        ((3, 16, 16), (1, 2, 2)),  # 4 taps per axis: the two bfloat16 bit views
        ((6, 5, 7), (2, 2, 2)),  # three resampled axes
        ((2, 8, 8, 3), (1, 2, 2, 1)),  # NHWC: bfloat16 applies one axis per loop
    ],
)
def test_half_precision_accumulates_in_float32(dtype, in_shape, scales):
    # Linear backward of an upsampling: each dx sums several terms. Rounding each
    # partial sum to half precision would drift; accumulating in float32 and
    # rounding once gives exactly the float32 result rounded. Signs, zeros and
    # infinities check that bfloat16's bits are widened exactly.
    rng = np.random.default_rng(2)
    out_shape = tuple(n * s for n, s in zip(in_shape, scales, strict=True))
    dy = rng.normal(size=out_shape)
    dy.flat[:4] = [-0.0, np.inf, -np.inf, -1e-30]
    dy = jnp.asarray(dy, dtype)
    half = jaxgrad.resample_grad(dy, in_shape, scales, mode="linear")
    full = jaxgrad.resample_grad(dy.astype(jnp.float32), in_shape, scales, mode="linear")
    # Compared as float32: NumPy matches NaNs of its own dtypes only.
    np.testing.assert_array_equal(
        np.asarray(half, np.float32), np.asarray(full.astype(dtype), np.float32)
    )


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
def test_bfloat16_bit_views_are_not_written_out():
    # A bfloat16 sum reads its input through 16-bit views (_bit_views). In NHWC
    # nothing is cut along the minor axis, so all the blocks would join one loop
    # that reads the views in more than 15 ways, and XLA:CPU wrote both views out as
    # copies of the input (the 2x linear gradient of [8, 128, 128, 32] took twice as
    # long). Applied one axis per loop, the compiled program holds no array of the
    # input's shape but the input itself.
    dy = jnp.zeros((2, 32, 32, 4), jnp.bfloat16)
    f = lambda dy: jaxgrad.resample_grad(dy, (2, 16, 16, 4), (1, 2, 2, 1), mode="linear")  # noqa: E731
    assert re.findall(r"= (\w+)\[2,32,32,4\]", compiled_entry(f, dy)) == ["bf16"]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_blocks_are_joined_as_words(dtype):
    # A blocked half-precision sum rounds each block in its own loop and joins the
    # blocks as 16-bit words; joined as float32, XLA:CPU wrote and copied them in
    # float32 (the bfloat16 2x linear gradient took twice as long).
    dy = jnp.zeros((2, 32, 32), dtype)
    f = lambda dy: jaxgrad.resample_grad(dy, (2, 16, 16), (1, 2, 2), mode="linear")  # noqa: E731
    joins = [line for line in jax.jit(f).lower(dy).as_text().splitlines() if "concatenate" in line]
    assert joins
    assert all("ui16>" in line and "f32>" not in line for line in joins)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("scales", [(0.5, 0.5), (0.25, 1 / 3)])
def test_half_precision_nearest_gradient_copies_words(dtype, scales):
    # Shrinking, no two outputs read the same input: the nearest gradient only
    # copies or zeroes each element, so it moves 16-bit words (no float32 at all)
    # and keeps every value, specials and subnormals included.
    rng = np.random.default_rng(4)
    in_shape = (12, 12)
    out_shape = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
    dy = rng.normal(size=out_shape)
    dy.flat[:5] = [-0.0, np.inf, -np.inf, np.nan, 1e-40]
    dy = jnp.asarray(dy, dtype)
    f = lambda dy: jaxgrad.resample_grad(dy, in_shape, scales)  # noqa: E731
    assert "f32" not in jax.jit(f).lower(dy).as_text()
    half = f(dy)
    assert half.dtype == dtype
    expected = reference_resample_grad(
        np.asarray(dy, np.float64), in_shape, scales, (0.5, 0.5), (-0.5, -0.5), "nearest", "half_up"
    )
    # Compared as float64, which holds every half value: NaN, infinities and
    # subnormals (the float32 path turned bfloat16's subnormals into zeros).
    np.testing.assert_array_equal(np.asarray(half, np.float64), expected)


# Every integer width: uint16 once came back as float32, mistaken for bfloat16 bits.
INTEGER_DTYPES = [jnp.int8, jnp.uint8, jnp.int16, jnp.uint16, jnp.int32, jnp.uint32, jnp.int64]


@pytest.mark.parametrize("dtype", [*INTEGER_DTYPES, jnp.bool_, *FLOAT_DTYPES])
def test_nearest_forward_is_an_exact_copy_in_every_dtype(dtype):
    x = np.arange(12).reshape(3, 4) % 5
    out = jaxgrad.resample(jnp.asarray(x, dtype), (2, 0.5))
    assert out.dtype == dtype
    expected = reference_resample(
        x.astype(dtype).astype(np.float64),
        (6, 2),
        (2, 0.5),
        (0.5, 0.5),
        (-0.5, -0.5),
        "nearest",
        "half_up",
    )
    np.testing.assert_array_equal(np.asarray(out, np.float64), expected)


@pytest.mark.parametrize("case", CASES)
def test_check_grads(case):
    in_shape, scales, out_shape, mode, rounding = case
    x = jnp.asarray(np.random.default_rng(3).normal(size=in_shape))
    kw = dict(mode=mode, rounding=rounding)
    f = lambda x: jaxgrad.resample(x, scales, output_shape=out_shape, **kw)  # noqa: E731
    check_grads(f, (x,), order=2, modes=["rev"])
    dy = jnp.asarray(np.random.default_rng(4).normal(size=f(x).shape))
    check_grads(
        lambda dy: jaxgrad.resample_grad(dy, in_shape, scales, **kw), (dy,), order=2, modes=["rev"]
    )


def test_vjp_of_resample_grad_is_resample():
    # SPEC §0: resample_grad's VJP is resample(c, ..., output_shape=dy.shape).
    rng = np.random.default_rng(5)
    dy = jnp.asarray(rng.normal(size=(9, 5)))
    c = jnp.asarray(rng.normal(size=(4, 6)))
    kw = dict(mode="linear", input_pixel_offsets=0.2, output_pixel_offsets=(0.1, -0.7))
    vjp = jax.vjp(lambda dy: jaxgrad.resample_grad(dy, (4, 6), (2.3, 0.8), **kw), dy)[1]
    expected = jaxgrad.resample(c, (2.3, 0.8), output_shape=(9, 5), **kw)
    np.testing.assert_array_equal(vjp(c)[0], expected)


def test_grad_of_grad_through_a_model():
    # A second derivative through resample: f(x) = sum(resample(x)^3).
    x = jnp.asarray(np.random.default_rng(6).normal(size=(3, 4)))
    f = lambda x: (jaxgrad.resample(x, (2, 1.5), mode="linear") ** 3).sum()  # noqa: E731
    hvp = jax.grad(lambda x: jnp.vdot(jax.grad(f)(x), jnp.ones_like(x)))(x)
    a = jax.jacrev(lambda x: jaxgrad.resample(x, (2, 1.5), mode="linear"))(x).reshape(-1, 12)
    y = a @ x.reshape(-1)
    expected = a.T @ (6 * y * (a @ np.ones(12)))
    np.testing.assert_allclose(hvp.reshape(-1), expected, rtol=1e-10)


def test_identity_axes_cost_nothing():
    # Resampling one axis of a 4-D array computes with the same ops as resampling a
    # 1-D array: the three identity axes add nothing (the reshapes and broadcasts
    # that shape the weights aside).
    def ops(x, scales):
        f = functools.partial(jaxgrad.resample, scales=scales, mode="linear")
        found = re.findall(r"stablehlo\.(\w+)", jax.jit(f).lower(x).as_text())
        shaping = ("reshape", "broadcast_in_dim", "constant")
        return collections.Counter(op for op in found if op not in shaping)

    x = jnp.ones((2, 3, 8, 8), jnp.float32)
    assert ops(x, (1, 1, 2, 1)) == ops(jnp.ones(8, jnp.float32), (2,))
    np.testing.assert_array_equal(jaxgrad.resample(x, (1, 1, 1, 1), mode="linear"), x)


def dml_axis(n_in, n_out, scale, a=0.5, b=-0.5, mode="nearest", rounding="half_up"):
    from jaxgrad._resample import _plan

    return _plan.Axis(n_in, n_out, _plan.Affine(scale, a, b), mode == "linear", rounding)


@pytest.mark.parametrize(
    ("mode", "scale", "transpose", "expected"),
    [
        ("nearest", 0.5, False, (1, 2)),  # every other input
        ("linear", 2.0, True, (1, 2)),  # four outputs per input, two further on each
        ("nearest", 2.0, False, (2, 1)),  # each input twice in a row
        ("nearest", 3.0, False, (3, 1)),
        ("nearest", 8.0, False, (8, 1)),
        ("linear", 0.5, True, (2, 1)),  # half of each output to both inputs it averaged
        ("linear", 2.0, False, None),  # alternating weights: gathered
        ("nearest", 16.0, False, None),  # 16 equal rows: gathered
    ],
)
def test_the_middle_run_is_strided_and_repeated(mode, scale, transpose, expected):
    # (repeat, step): each group of `repeat` equal rows reads the group before
    # shifted by `step`, so every tap is one strided slice, broadcast.
    from jaxgrad._resample import _plan

    axis = dml_axis(32, int(32 * scale), scale, mode=mode)
    assert _plan.plan(axis, transpose).strided == expected


def test_a_short_strided_stretch_is_not_cut_out():
    # At scale 0.93 nearest neighbour skips an input now and then: the rows repeat
    # every 93, with some strided stretches of 14 rows. Cutting one out would leave
    # most rows in gathered edge blocks and cost a concatenation (7.2 ms against
    # 2.2 ms on [8, 32, 128, 128]), so the axis stays one gathered run.
    from jaxgrad._resample import _plan, _xla

    for n_in in (128, 1024):
        plan = _plan.plan(dml_axis(n_in, int(n_in * 0.93), 0.93), False)
        assert plan.strided is None
        assert _xla._runs(plan) == [range(plan.n_rows)]


def test_repeated_rows_off_the_first_row():
    # Sampling at o / 2 with half-up rounding reads inputs 0, 1, 1, 2, 2, ...: the
    # pairs of equal rows start at row 1, and the edge rows around them are gathered.
    from jaxgrad._resample import _plan, _xla

    plan = _plan.plan(dml_axis(30, 60, 2.0, a=0.0, b=0.0), False)
    assert _xla._runs(plan) == [range(1), range(1, 59), range(59, 60)]
    assert plan.strided == (2, 1)
    x = np.random.default_rng(0).normal(size=(3, 30))
    y = jaxgrad.resample(x, (1, 2), input_pixel_offsets=0, output_pixel_offsets=0)
    args = ((1, 2), (0, 0), (0, 0), "nearest", "half_up")
    np.testing.assert_array_equal(y, reference_resample(x, (3, 60), *args))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scale", [2.0, 0.5, 4.0, 0.25])
def test_strided_blocks_match_the_reference(mode, scale):
    # Long axes are cut into edge blocks (gathered) and a middle block whose rows
    # are strided copies of each other (sliced); the pieces must fit back exactly.
    from jaxgrad._resample import _plan

    rng = np.random.default_rng(3)
    in_shape = (2, 30, 36)
    scales, a, b = (1.0, scale, scale), (0.5, 0.5, 0.5), (-0.5, -0.5, -0.5)
    out_shape = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
    kw = dict(mode=mode, input_pixel_offsets=a, output_pixel_offsets=b)
    x, dy = rng.normal(size=in_shape), rng.normal(size=out_shape)
    y = jaxgrad.resample(x, scales, output_shape=out_shape, **kw)
    dx = jaxgrad.resample_grad(dy, in_shape, scales, **kw)
    args = (scales, a, b, mode, "half_up")
    np.testing.assert_allclose(y, reference_resample(x, out_shape, *args), atol=1e-12)
    np.testing.assert_allclose(dx, reference_resample_grad(dy, in_shape, *args), atol=1e-12)
    # The case really takes the sliced path: some plan is strided.
    axes = [
        dml_axis(n, m, s, mode=mode)
        for n, m, s in zip(in_shape[1:], out_shape[1:], [scale] * 2, strict=True)
    ]
    plans = [_plan.plan(axis, transpose) for axis in axes for transpose in (False, True)]
    assert any(plan.strided is not None for plan in plans)


@pytest.mark.parametrize("implementation", ["xla", pytest.param("pallas", marks=needs_kernels)])
def test_coordinates_repeat_where_a_float64_sum_would_round(implementation):
    # At a scale P / Q the coordinates repeat exactly, u(kP + j) = u(j) + kQ: at 0.5
    # with an input offset of 1e-236, output 1 sits at 2 - 1e-236, below input 2,
    # where (1 - 0) / 0.5 - 1e-236 evaluated in float64 is 2.0. Rounded down, it
    # reads input 1, and every output o > 0 of the axis input 2o - 1.
    # (A random search of the reference properties found the case, in which the
    # reference had computed u(o) directly.)
    x = jnp.arange(10.0)
    kw = dict(mode="nearest", rounding="down", input_pixel_offsets=1e-236, output_pixel_offsets=0)
    y = jaxgrad.resample(x, (0.5,), implementation=implementation, **kw)
    np.testing.assert_array_equal(y, [0, 1, 3, 5, 7])
    assert [taps[0][0] for taps in axis_taps(10, 5, 0.5, 1e-236, 0, "nearest", "down")] == [
        0,
        1,
        3,
        5,
        7,
    ]


def test_zero_weight_taps_are_not_read():
    # Sampling exactly on input pixels: the second linear tap has weight 0, so an inf
    # beside it must not turn into NaN (0 * inf).
    x = jnp.array([1.0, np.inf, 3.0])
    out = jaxgrad.resample(x, (1.0,), mode="linear", input_pixel_offsets=0, output_pixel_offsets=0)
    np.testing.assert_array_equal(out, x)
    dx = jaxgrad.resample_grad(
        jnp.array([np.inf, 1.0]),
        (4,),
        (0.5,),
        mode="linear",
        input_pixel_offsets=0,
        output_pixel_offsets=0,
    )
    np.testing.assert_array_equal(dx, [np.inf, 0, 1, 0])


def test_deterministic():
    rng = np.random.default_rng(7)
    dy = jnp.asarray(rng.normal(size=(4, 8, 64, 64)), jnp.float32)
    f = jax.jit(
        lambda dy: jaxgrad.resample_grad(dy, (4, 8, 29, 37), (1, 1, 2.2, 1.7), mode="linear")
    )
    first = np.asarray(f(dy)).tobytes()
    for _ in range(5):
        assert np.asarray(f(dy)).tobytes() == first


def test_no_scatter_in_the_gradient():
    x = jnp.ones((2, 3, 16, 16), jnp.float32)
    grad = jax.jit(jax.grad(lambda x: jaxgrad.resample(x, (1, 1, 2, 2), mode="linear").sum()))
    assert "scatter" not in grad.lower(x).as_text()


def test_forward_mode_raises():
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(lambda x: jaxgrad.resample(x, (2.0,)), (jnp.ones(3),), (jnp.ones(3),))


# ----------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------

X = jnp.ones((2, 3))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: jaxgrad.resample(X, (2.0,)),
            ValueError,
            r"resample: scales must have one entry per axis of the input \(2\), got 1",
        ),
        (lambda: jaxgrad.resample(X, 2.0), TypeError, "resample: scales must have one entry"),
        (lambda: jaxgrad.resample(X, (2.0, 0.0)), ValueError, "resample: scales must be positive"),
        (lambda: jaxgrad.resample(X, (2.0, -1.0)), ValueError, "scales must be positive"),
        (lambda: jaxgrad.resample(X, (2.0, np.nan)), ValueError, "resample: scales must be finite"),
        (lambda: jaxgrad.resample(X, (np.inf, 1.0)), ValueError, "scales must be finite"),
        (
            lambda: jaxgrad.resample(X, (2, 2), input_pixel_offsets=(0.5,)),
            ValueError,
            r"resample: input_pixel_offsets must have one entry per axis of the input \(2\), got 1",
        ),
        (
            lambda: jaxgrad.resample(X, (2, 2), output_pixel_offsets=np.nan),
            ValueError,
            "resample: output_pixel_offsets must be finite",
        ),
        (
            lambda: jaxgrad.resample(X, (2, 2), mode="cubic"),
            ValueError,
            "resample: mode must be one of 'nearest', 'linear', got 'cubic'",
        ),
        (
            lambda: jaxgrad.resample(X, (2, 2), rounding="nearest"),
            ValueError,
            "resample: rounding must be one of 'half_up', 'down', 'up', got 'nearest'",
        ),
        (
            lambda: jaxgrad.resample(X, (2, 2), output_shape=(4,)),
            ValueError,
            r"resample: output_shape must have one entry per axis \(2\), got 1",
        ),
        (
            lambda: jaxgrad.resample(X, (2, 2), output_shape=(4, -1)),
            ValueError,
            r"resample: output_shape must be non-negative, got \(4, -1\)",
        ),
        (
            lambda: jaxgrad.resample(jnp.ones((0, 4)), (1, 2), output_shape=(1, 8)),
            ValueError,
            r"resample: axis 0 of the input is empty, so there is nothing to sample for its 1 "
            r"outputs \(input shape \(0, 4\), output shape \(1, 8\)\)",
        ),
        (
            lambda: jaxgrad.resample_grad(jnp.ones((1, 8)), (0, 4), (1, 2)),
            ValueError,
            "resample_grad: axis 0 of the input is empty, so there is nothing to sample",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((0, 4)), (2, 8)),
            ValueError,
            "resize: axis 0 of the input is empty",
        ),
        # Taps are indexed with int32: an axis longer than that is refused at once,
        # before any table is built.
        (
            lambda: jaxgrad.resample(X, (1, 1e9)),
            ValueError,
            r"resample: axis 1 must be at most 2\*\*31 - 1 long in the input and the output, "
            r"got 3 and 3000000000 \(input shape \(2, 3\), output shape \(2, 3000000000\)\)",
        ),
        (
            lambda: jaxgrad.resample_grad(X, (2**31, 3), (2**-30, 1)),
            ValueError,
            r"resample_grad: axis 0 must be at most 2\*\*31 - 1 long .* got 2147483648 and 2",
        ),
        (
            lambda: jaxgrad.resize(X, (2, 2**31)),
            ValueError,
            r"resize: axis 1 must be at most 2\*\*31 - 1 long",
        ),
        # NumPy and JAX scalars are numbers like Python's: one scale is not one per axis.
        *[
            (
                lambda scale=scale: jaxgrad.resample(X, scale),
                TypeError,
                r"resample: scales must have one entry per axis of the input \(2\), got",
            )
            for scale in (2.0, np.float32(2.0), jnp.float32(2.0), np.asarray(2.0))
        ],
        # Shapes and parameters traced under jit: say they must be static, and how.
        (
            lambda: jax.jit(lambda x, s: jaxgrad.resample(x, s))(X, jnp.array([2.0, 2.0])),
            TypeError,
            r"resample: scales must be static \(concrete Python values.*functools.partial, "
            r"or mark it with jax.jit's static_argnums",
        ),
        (
            lambda: jax.jit(lambda x, s: jaxgrad.resample(x, (2, 2), output_shape=s))(X, (4, 6)),
            TypeError,
            "resample: output_shape must be static",
        ),
        (
            lambda: jax.jit(lambda x, a: jaxgrad.resample(x, (2, 2), input_pixel_offsets=a))(
                X, 0.5
            ),
            TypeError,
            "resample: input_pixel_offsets must be static",
        ),
        (
            lambda: jax.jit(lambda g, s: jaxgrad.resample_grad(g, s, (1, 1)))(X, (2, 3)),
            TypeError,
            "resample_grad: input_shape must be static",
        ),
        (
            lambda: jax.jit(lambda x, s: jaxgrad.resize(x, s))(X, (4, 6)),
            TypeError,
            "resize: output_shape must be static",
        ),
        (
            lambda: jaxgrad.resample(X, (2, 0.3)),
            ValueError,
            r"resample: the default output shape .* = \(4, 0\) has a zero length",
        ),
        (
            lambda: jaxgrad.resample(jnp.ones(()), ()),
            ValueError,
            "resample: x must have rank >= 1, got a 0-d array",
        ),
        (
            lambda: jaxgrad.resample(jnp.ones(3, jnp.int32), (2,), mode="linear"),
            TypeError,
            "resample: x must have a floating dtype for this mode, got int32",
        ),
        (
            lambda: jaxgrad.resample(jnp.ones(3, jnp.complex64), (2,)),
            TypeError,
            "resample: x must have a floating, integer or bool dtype for this mode, got complex64",
        ),
        (lambda: jaxgrad.resample([1.0, 2.0], (2,)), TypeError, "resample: x must be an array"),
        (
            lambda: jaxgrad.resample_grad(X, (2, 3, 1), (1, 1)),
            ValueError,
            r"resample_grad: input_shape must have one entry per axis \(2\), got 3",
        ),
        (
            lambda: jaxgrad.resample_grad(X, (2, -3), (1, 1)),
            ValueError,
            r"resample_grad: input_shape must be non-negative, got \(2, -3\)",
        ),
        (
            lambda: jaxgrad.resample_grad(X, (2, 3), (1, 1, 1)),
            ValueError,
            r"resample_grad: scales must have one entry per axis of the input \(2\), got 3",
        ),
        (
            lambda: jaxgrad.resample_grad(jnp.ones(3, jnp.int32), (3,), (1,)),
            TypeError,
            "resample_grad: dy must have a floating dtype for this mode, got int32",
        ),
        (
            lambda: jaxgrad.resample_grad(X, (2, 3), (1, 1), mode="area"),
            ValueError,
            "resample_grad: mode must be one of 'nearest', 'linear', got 'area'",
        ),
        (
            lambda: jaxgrad.resample_grad(X, "ab", (1, 1)),
            TypeError,
            "resample_grad: input_shape must be a sequence of ints",
        ),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_the_longest_axis_traces(mode):
    # 2**31 - 1 long, in and out: traced (nothing that large is allocated).
    longest = jax.ShapeDtypeStruct((1, 2**31 - 1), jnp.float32)
    half = jax.ShapeDtypeStruct((1, 2**30), jnp.float32)
    y = jax.eval_shape(
        lambda x: jaxgrad.resample(x, (1, 2), mode=mode, output_shape=longest.shape), half
    )
    dx = jax.eval_shape(
        lambda dy: jaxgrad.resample_grad(dy, half.shape, (1, 2), mode=mode), longest
    )
    assert (y.shape, dx.shape) == (longest.shape, half.shape)


def test_scalars_of_every_kind_are_numbers():
    # An offset may be one number for every axis, whatever its type.
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 5)))
    want = jaxgrad.resample(x, (2, 2), input_pixel_offsets=0.25, mode="linear")
    for offset in (np.float32(0.25), jnp.float32(0.25), np.asarray(0.25), jnp.asarray(0.25)):
        got = jaxgrad.resample(x, (2, 2), input_pixel_offsets=offset, mode="linear")
        np.testing.assert_array_equal(got, want)
    scales = (jnp.float32(2), np.int64(2))
    np.testing.assert_array_equal(
        jaxgrad.resample(x, scales, input_pixel_offsets=0.25, mode="linear"), want
    )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_empty_in_empty_out(mode):
    # As jax.image.resize: an empty input gives an empty output, and explicit zero
    # output lengths are allowed; the gradients are empty or zero alike.
    empty = jaxgrad.resample(jnp.ones((0, 4)), (1, 2), mode=mode, output_shape=(0, 8))
    assert empty.shape == (0, 8)
    assert jaxgrad.resample(jnp.ones((3, 4)), (1, 2), mode=mode, output_shape=(3, 0)).shape == (
        3,
        0,
    )
    assert jaxgrad.resample_grad(jnp.ones((0, 8)), (0, 4), (1, 2), mode=mode).shape == (0, 4)
    # No output reads any input: the gradient is zero.
    grad = jaxgrad.resample_grad(jnp.ones((3, 0)), (3, 4), (1, 2), mode=mode)
    np.testing.assert_array_equal(grad, np.zeros((3, 4)))
    x = jnp.ones((3, 4))
    g = jax.grad(lambda x: jaxgrad.resample(x, (1, 2), mode=mode, output_shape=(3, 0)).sum())(x)
    np.testing.assert_array_equal(g, np.zeros((3, 4)))
    assert jaxgrad.resize(jnp.ones((0, 4)), (0, 8), mode=mode).shape == (0, 8)
    assert jax.image.resize(jnp.ones((0, 4)), (0, 8), mode).shape == (0, 8)
