"""Depthwise conv2d and its backprops: the default implementation against a loop
reference and lax, closure under differentiation, dtypes, transforms, determinism and
errors. tests/test_depthwise_implementations.py covers the choice of implementation
and the Pallas kernels."""

import math
import re
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from depthwise_reference import (
    CASES,
    configs,
    from_nchw,
    make_cfg,
    op_kwargs,
    out_shape,
    random_operands,
    ref_backprop_filter,
    ref_backprop_input,
    ref_forward,
    run_all_three,
    to_nchw,
)
from helpers import TOLERANCE, TRANSFORMS, compiled_entry, examples, needs_kernels, transformed
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax.test_util import check_grads

import jaxgrad

# ----------------------------------------------------------------------------------
# Against the reference and the lax oracle
# ----------------------------------------------------------------------------------


def assert_matches_reference(cfg, x, f, dy, results):
    """The three ops' results (forward, input and filter gradient) equal the loop
    reference's in float64."""
    y, dx, df = results
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(df, ref_backprop_filter(x, dy, cfg), rtol=1e-10, atol=1e-10)


# Each example compiles new shapes, so the expensive properties draw fewer examples.
@settings(max_examples=examples(16))
@given(configs(), st.sampled_from(["NHWC", "NCHW"]), st.booleans(), st.integers(0, 2**31 - 1))
def test_all_three_ops_match_reference(cfg, data_format, four_ints, seed):
    x, f, dy = random_operands(cfg, seed)
    assert_matches_reference(cfg, x, f, dy, run_all_three(cfg, data_format, x, f, dy, four_ints))


# Filters of more than 25 taps read padded copies, and their filter gradient loops
# over kernel rows (so that compile time grows with the taps, not with taps times
# blocks): the same properties over that formulation.
@settings(max_examples=examples(10))
@given(
    configs(kernel=(4, 9), min_taps=26),
    st.sampled_from(["NHWC", "NCHW"]),
    st.integers(0, 2**31 - 1),
)
def test_large_filters_match_reference(cfg, data_format, seed):
    x, f, dy = random_operands(cfg, seed)
    assert_matches_reference(cfg, x, f, dy, run_all_three(cfg, data_format, x, f, dy))


# The stride-1 gradients of filters of 21 to 25 taps read padded copies on the CPU
# too (their forward and strided gradients read blocks): SAME with a multiplier,
# dilated VALID, and EXPLICIT, in both layouts.
@pytest.mark.parametrize(
    ("f_shape", "dilations", "padding", "explicit", "data_format"),
    [
        ((5, 5), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC"),
        ((7, 3), (2, 1), "VALID", ((0, 0), (0, 0)), "NCHW"),
        ((5, 5), (1, 2), "EXPLICIT", ((3, 1), (0, 2)), "NCHW"),
    ],
)
def test_stride_1_gradients_of_21_to_25_taps_match_reference(
    f_shape, dilations, padding, explicit, data_format
):
    cfg = make_cfg((2, 17, 13, 3), (*f_shape, 3, 2), (1, 1), dilations, padding, explicit)
    x, f, dy = random_operands(cfg, 5)
    assert_matches_reference(cfg, x, f, dy, run_all_three(cfg, data_format, x, f, dy))


# Thin filters: each step of the filter gradient's loop takes several kernel rows,
# and the rows left over are summed after the loop.
@pytest.mark.parametrize("f_shape", [(27, 1), (13, 2), (1, 27), (3, 9)])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_thin_large_filters_match_reference(f_shape, data_format):
    cfg = make_cfg((2, 30, 29, 2), (*f_shape, 2, 2), (1, 2), (1, 1), "SAME", ((0, 0), (0, 0)))
    x, f, dy = random_operands(cfg, 3)
    assert_matches_reference(cfg, x, f, dy, run_all_three(cfg, data_format, x, f, dy))


def test_large_filter_programs_hold_one_term_per_tap_and_block():
    """The `jax.grad` program of a 9x9 filter: the forward and the input gradient
    multiply each tap once in each of two row blocks, the filter gradient holds one
    kernel row's terms (8 row blocks each). The blocked formulation of small filters
    would hold 33 multiplies per tap here (2684)."""
    x, f = jnp.zeros((2, 30, 30, 4), jnp.float32), jnp.zeros((9, 9, 4, 1), jnp.float32)
    loss = lambda x, f: jnp.sum(jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME") ** 2)  # noqa: E731
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, f).as_text()
    multiplies = len(re.findall(r"stablehlo\.multiply .*f32>$", text, re.MULTILINE))
    assert multiplies <= 2 * 2 * 81 + 9 * 8 + 8, multiplies


def lax_depthwise(x, f, cfg):
    """The second oracle: XLA's grouped convolution (NHWC)."""
    c, m = f.shape[2], f.shape[3]
    (_oh, _top), (_ow, _left) = cfg["geom"]
    pads = []
    for a, (out, before) in enumerate(cfg["geom"]):
        e = (cfg["f_shape"][a] - 1) * cfg["dilations"][a] + 1
        pads.append((before, (out - 1) * cfg["strides"][a] + e - cfg["x_shape"][1 + a] - before))
    return lax.conv_general_dilated(
        x,
        f.reshape(*f.shape[:2], 1, c * m),
        cfg["strides"],
        pads,
        rhs_dilation=cfg["dilations"],
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=c,
    )


@settings(max_examples=examples(12))
@given(configs(), st.integers(0, 2**31 - 1))
def test_gradients_match_lax_autodiff(cfg, seed):
    x, f, dy = (jnp.asarray(a) for a in random_operands(cfg, seed))
    strides, padding, kw = op_kwargs(cfg, "NHWC")

    @jax.jit
    def both(x, f, dy):
        ours = jax.vjp(lambda x, f: jaxgrad.depthwise_conv2d(x, f, strides, padding, **kw), x, f)
        theirs = jax.vjp(lambda x, f: lax_depthwise(x, f, cfg), x, f)
        return (ours[0], *ours[1](dy)), (theirs[0], *theirs[1](dy))

    for a, b in zip(*both(x, f, dy), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------
# Dtypes, transforms, closure, gradients
# ----------------------------------------------------------------------------------

# Every case under jit; the first case also eagerly and under vmap (eager mode
# dispatches each tap separately, which makes the full grid slow). A filter of 36
# taps, strided and dilated, with a multiplier: the large-filter formulation.
LARGE_CASE = ((2, 13, 12, 3), (6, 6, 3, 2), (2, 1), (1, 2), "SAME", ((0, 0), (0, 0)))
TRANSFORM_GRID = (
    [(CASES[0], t) for t in TRANSFORMS]
    + [(case, "jit") for case in CASES[1:]]
    + [(LARGE_CASE, t) for t in ("jit", "vmap")]
)


def dtype_grid():
    """(case, transform, layout, dtype): each case and transform in both layouts,
    each layout in a half and a full type. The programs differ between float16 and
    bfloat16 and between half and full types, not between float32 and float64; the
    half types and the full types alternate, so that every case and every layout
    meets all four dtypes."""
    for i, (case, transform) in enumerate(TRANSFORM_GRID):
        for j, data_format in enumerate(("NHWC", "NCHW")):
            turn = (i + j) % 2
            for dtype in ((jnp.float16, jnp.bfloat16)[turn], (jnp.float32, jnp.float64)[turn]):
                name = f"{i}-{transform}-{data_format}-{dtype.__name__}"
                yield pytest.param(case, data_format, dtype, transform, id=name)


@pytest.mark.parametrize(("case", "data_format", "dtype", "transform"), list(dtype_grid()))
def test_dtypes_formats_and_transforms(case, data_format, dtype, transform):
    cfg = make_cfg(*case)
    x, f, dy = random_operands(cfg, 0)
    strides, padding, kw = op_kwargs(cfg, data_format)
    nchw = data_format == "NCHW"
    layout = to_nchw if nchw else (lambda a: a)
    back = from_nchw if nchw else (lambda a: a)
    xj, fj, dyj = (
        jnp.asarray(layout(x), dtype),
        jnp.asarray(f, dtype),
        jnp.asarray(layout(dy), dtype),
    )
    # References on the rounded operands, so only the computation's error remains.
    xr, fr, dyr = (np.asarray(a, np.float64) for a in (xj, fj, dyj))
    xr, dyr = back(xr), back(dyr)
    tol = TOLERANCE[np.dtype(dtype)]

    def close(got, want):
        assert got.dtype == dtype
        np.testing.assert_allclose(
            np.asarray(got, np.float64), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max())
        )

    fwd = transformed(
        lambda x, f: jaxgrad.depthwise_conv2d(x, f, strides, padding, **kw), transform
    )
    close(back(fwd(xj, fj)), ref_forward(xr, fr, cfg))
    bpi = transformed(
        lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(
            xj.shape, f, dy, strides, padding, **kw
        ),
        transform,
    )
    close(back(bpi(fj, dyj)), ref_backprop_input(fr, dyr, cfg))
    bpf = transformed(
        lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(
            x, fj.shape, dy, strides, padding, **kw
        ),
        transform,
    )
    close(bpf(xj, dyj), ref_backprop_filter(xr, dyr, cfg))


# check_grads compiles every derivative order of every op: about 10-50 s per case.
# The VJP rules do not depend on the layout or the filter's size, only on the shape
# arithmetic of strides, dilations, paddings and multipliers: stride 1 SAME, a
# strided and dilated VALID filter with a multiplier (in both layouts), EXPLICIT
# padding, and the large filter, strided, dilated SAME with a multiplier. The
# reference tests cover every case's values in both layouts.
CHECK_GRADS_GRID = [(0, "NHWC"), (2, "NHWC"), (3, "NHWC"), (2, "NCHW")]


@pytest.mark.parametrize(
    "case, data_format",
    [(CASES[i], fmt) for i, fmt in CHECK_GRADS_GRID] + [(LARGE_CASE, "NCHW")],
    ids=[f"case{i}-{fmt}" for i, fmt in CHECK_GRADS_GRID] + ["large-NCHW"],
)
def test_check_grads_all_three(case, data_format):
    cfg = make_cfg(*case)
    nchw = data_format == "NCHW"
    layout = to_nchw if nchw else (lambda a: a)
    x, f, dy = random_operands(cfg, 1)
    x, dy = jnp.asarray(layout(x)), jnp.asarray(layout(dy))
    f = jnp.asarray(f)
    strides, padding, kw = op_kwargs(cfg, data_format)
    # Jitted, so that the many evaluations of finite differences compile once.
    check_grads(
        jax.jit(lambda x, f: jaxgrad.depthwise_conv2d(x, f, strides, padding, **kw)),
        (x, f),
        order=2,
        modes=["rev"],
    )
    check_grads(
        jax.jit(
            lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(
                x.shape, f, dy, strides, padding, **kw
            )
        ),
        (f, dy),
        order=2,
        modes=["rev"],
    )
    check_grads(
        jax.jit(
            lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(
                x, f.shape, dy, strides, padding, **kw
            )
        ),
        (x, dy),
        order=2,
        modes=["rev"],
    )


def test_vjps_are_the_ops_of_the_set():
    # SPEC §0, each line of the table, with exact equality.
    cfg = make_cfg(*CASES[1])
    x, f, dy = (jnp.asarray(a) for a in random_operands(cfg, 2))
    strides, padding, kw = op_kwargs(cfg, "NHWC")
    conv = lambda x, f: jaxgrad.depthwise_conv2d(x, f, strides, padding, **kw)  # noqa: E731
    bpi = lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(  # noqa: E731
        x.shape, f, dy, strides, padding, **kw
    )
    bpf = lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(  # noqa: E731
        x, f.shape, dy, strides, padding, **kw
    )

    gx, gf = jax.vjp(conv, x, f)[1](dy)
    np.testing.assert_array_equal(gx, bpi(f, dy))
    np.testing.assert_array_equal(gf, bpf(x, dy))

    c = jnp.asarray(np.random.default_rng(3).normal(size=x.shape))
    cf, cdy = jax.vjp(bpi, f, dy)[1](c)
    np.testing.assert_array_equal(cf, bpf(c, dy))
    np.testing.assert_array_equal(cdy, conv(c, f))

    c = jnp.asarray(np.random.default_rng(4).normal(size=f.shape))
    cx, cdy = jax.vjp(bpf, x, dy)[1](c)
    np.testing.assert_array_equal(cx, bpi(c, dy))
    np.testing.assert_array_equal(cdy, conv(x, c))


def test_adjoint_identities():
    cfg = make_cfg(*CASES[3])
    x, f, dy = (jnp.asarray(a) for a in random_operands(cfg, 5))
    strides, padding, kw = op_kwargs(cfg, "NHWC")
    y = jaxgrad.depthwise_conv2d(x, f, strides, padding, **kw)
    dx = jaxgrad.depthwise_conv2d_backprop_input(x.shape, f, dy, strides, padding, **kw)
    df = jaxgrad.depthwise_conv2d_backprop_filter(x, f.shape, dy, strides, padding, **kw)
    np.testing.assert_allclose(jnp.vdot(y, dy), jnp.vdot(x, dx), rtol=1e-12)
    np.testing.assert_allclose(jnp.vdot(y, dy), jnp.vdot(f, df), rtol=1e-12)


def test_four_int_and_two_int_forms_agree():
    x = jnp.asarray(np.random.default_rng(6).normal(size=(1, 3, 8, 9)))
    f = jnp.asarray(np.random.default_rng(7).normal(size=(3, 3, 3, 2)))
    a = jaxgrad.depthwise_conv2d(
        x, f, (1, 1, 2, 1), "SAME", data_format="NCHW", dilations=(1, 1, 1, 2)
    )
    b = jaxgrad.depthwise_conv2d(x, f, (2, 1), "SAME", data_format="NCHW", dilations=(1, 2))
    np.testing.assert_array_equal(a, b)


def float32_sizes(entry):
    """The element counts of the float32 arrays in a compiled program's text."""
    return [math.prod(map(int, d.split(","))) for d in re.findall(r"f32\[([\d,]+)\]", entry)]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
@pytest.mark.parametrize("op", ["forward", "backprop_input", "backprop_filter"])
def test_float16_is_widened_in_the_loop_that_reads_it(op):
    # float16 operands are read in place and each window (and each slice of the
    # filter gradient's dy) widened to float32 in the loop that uses it. Converted
    # up front, each op wrote a float32 copy of its input first (the NHWC 3x3
    # forward on [8, 64, 64, 64] took 1.7-2.4 ms so, 0.9-1.0 ms now). A property of
    # the portable implementation's program on XLA:CPU.
    xla = dict(implementation="xla")
    x = jnp.zeros((2, 9, 7, 3), jnp.float16)
    f = jnp.zeros((3, 3, 3, 1), jnp.float16)
    calls = {
        "forward": (lambda x, f: jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", **xla), (x, f)),
        "backprop_input": (
            lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(
                x.shape, f, dy, (1, 1), "SAME", **xla
            ),
            (f, x),
        ),
        "backprop_filter": (
            lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(
                x, f.shape, dy, (1, 1), "SAME", **xla
            ),
            (x, x),
        ),
    }
    fn, args = calls[op]
    assert x.size not in float32_sizes(compiled_entry(fn, *args))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
@pytest.mark.parametrize(
    ("op", "kernel", "multiplier", "padded"),
    [
        ("forward", 4, 1, True),
        ("backprop_input", 4, 1, True),
        ("backprop_input", 4, 2, True),
        # Fewer taps, or a forward with a multiplier: the words widened in place.
        ("forward", 3, 1, False),
        ("backprop_input", 3, 1, False),
        ("forward", 4, 2, False),
    ],
)
def test_bfloat16_summed_over_many_taps_is_widened_once(op, kernel, multiplier, padded):
    # bfloat16 is read as 16-bit words and each window widened in the loop, at
    # every read; from 16 taps at stride 1 the forward (without a multiplier) and
    # the input gradient read a float32 padded copy instead, which XLA:CPU runs
    # faster (the design notes have the figures). Either way the result is the
    # float32 computation's, rounded once. A property of the portable
    # implementation's program on XLA:CPU.
    xla = dict(implementation="xla")
    rng = np.random.default_rng(8)
    x_shape = (2, 9, 7, 3)
    f = jnp.asarray(rng.normal(size=(kernel, kernel, 3, multiplier)), jnp.bfloat16)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.bfloat16)
    dy = jnp.asarray(rng.normal(size=(2, 9, 7, 3 * multiplier)), jnp.bfloat16)

    def forward(x, f):
        return jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", **xla)

    def backprop_input(f, dy):
        return jaxgrad.depthwise_conv2d_backprop_input(x_shape, f, dy, (1, 1), "SAME", **xla)

    # Each op, its arguments, and the one its taps read.
    fn, args, read = {
        "forward": (forward, (x, f), x),
        "backprop_input": (backprop_input, (f, dy), dy),
    }[op]
    # A padded copy holds more elements than the array it pads.
    sizes = float32_sizes(compiled_entry(fn, *args))
    assert any(size > read.size for size in sizes) == padded
    widened = [a.astype(jnp.float32) for a in args]
    np.testing.assert_array_equal(fn(*args), fn(*widened).astype(jnp.bfloat16))


# NHWC with multiplier 1 gathers its windows (clamped positions, masked to zero);
# the other layouts slice them out of a padded copy. Both must read padding as 0.
READ_STRATEGIES = pytest.mark.parametrize(
    ("data_format", "m"), [("NHWC", 1), ("NHWC", 2), ("NCHW", 1)]
)


@READ_STRATEGIES
def test_padding_reads_zero_next_to_inf_and_nan(data_format, m):
    # A gathered window clamps its padding positions onto the edge pixels. Those
    # hold inf and NaN here: if the mask came after the product, or not at all,
    # they would leak into outputs whose windows only touch the padding.
    cfg = make_cfg((2, 5, 6, 3), (3, 3, 3, m), (1, 2), (1, 1), "EXPLICIT", ((2, 1), (1, 2)))
    x, f, dy = random_operands(cfg, 4)
    x[0, 0, 0, 0], x[1, -1, -1, 2], x[0, 0, -1, 1] = np.inf, np.nan, -np.inf
    dy[0, 0, 0, 0], dy[1, -1, -1, -1] = np.inf, np.nan
    y, dx, _ = run_all_three(cfg, data_format, x, f, dy)  # the forward reads no dy
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)


@READ_STRATEGIES
def test_an_empty_input_reads_only_padding(data_format, m):
    # Zero rows, and explicit padding wide enough for outputs: every window lies
    # wholly in the padding.
    cfg = make_cfg((2, 0, 4, 3), (2, 1, 3, m), (1, 1), (1, 1), "EXPLICIT", ((2, 1), (0, 0)))
    x, f, dy = random_operands(cfg, 5)
    y, dx, df = run_all_three(cfg, data_format, x, f, dy)
    assert y.shape == (2, 2, 4, 3 * m) and not y.any()
    assert dx.shape == (2, 0, 4, 3)
    np.testing.assert_array_equal(df, np.zeros(cfg["f_shape"]))


@pytest.mark.parametrize("implementation", ["xla", pytest.param("pallas", marks=needs_kernels)])
def test_an_empty_input_gives_zeros_whatever_the_filter(implementation):
    # Nothing to multiply: no 0 * inf, as TensorFlow 2.21 gives it.
    cfg = make_cfg((2, 0, 4, 3), (2, 1, 3, 2), (1, 1), (1, 1), "EXPLICIT", ((2, 1), (0, 0)))
    x, f, dy = random_operands(cfg, 5)
    f[0, 0, 0, 0], f[1, 0, 2, 1] = np.inf, np.nan
    y, _, _ = run_all_three(cfg, "NHWC", x, f, dy, implementation=implementation)
    np.testing.assert_array_equal(y, np.zeros(out_shape(cfg)))


@pytest.mark.parametrize("implementation", ["xla", pytest.param("pallas", marks=needs_kernels)])
@pytest.mark.parametrize("kernel", [3, 7])  # 7x7: "xla" sums the filter gradient by rows
def test_a_batch_of_zero_images(implementation, kernel):
    # No images: empty results, and a filter gradient of zeros (an empty sum), in
    # the ops and through jax.grad.
    cfg = make_cfg((0, 6, 5, 3), (kernel, kernel, 3, 2), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)))
    x, f, dy = random_operands(cfg, 6)
    y, dx, df = run_all_three(cfg, "NHWC", x, f, dy, implementation=implementation)
    assert y.shape == (0, 6, 5, 6) and dx.shape == (0, 6, 5, 3)
    np.testing.assert_array_equal(df, np.zeros(cfg["f_shape"]))

    def loss(x, f):
        y = jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", implementation=implementation)
        return (y**2).sum()

    gx, gf = jax.grad(loss, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(f))
    assert gx.shape == x.shape
    np.testing.assert_array_equal(gf, np.zeros(cfg["f_shape"]))


# Output sizes of 0, as TensorFlow computes them (and returns): a window wider than
# the input by less than a stride (by 1 and by 2 columns, at stride 3), a window
# wider than the input at stride 1 (7x7: "xla" sums the filter gradient by rows),
# explicit padding of 0 around an input narrower than the filter.
EMPTY_OUTPUTS = [
    make_cfg((2, 5, 1, 3), (1, 2, 3, 1), (3, 3), (1, 1), "VALID"),
    make_cfg((2, 7, 1, 3), (3, 3, 3, 2), (3, 3), (1, 1), "VALID"),
    make_cfg((1, 6, 6, 2), (7, 7, 2, 2), (1, 1), (1, 1), "VALID"),
    make_cfg((1, 3, 2, 2), (3, 3, 2, 1), (1, 2), (1, 1), "EXPLICIT", ((0, 0), (0, 0))),
]


@pytest.mark.parametrize("implementation", ["xla", pytest.param("pallas", marks=needs_kernels)])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
    "cfg", EMPTY_OUTPUTS, ids=["stride", "stride-3x3", "wide-filter", "explicit"]
)
def test_an_output_of_no_pixels(cfg, data_format, implementation):
    # An empty output, and gradients of zeros (empty sums), in the ops and
    # through jax.grad, as TensorFlow gives them.
    assert 0 in (cfg["geom"][0][0], cfg["geom"][1][0])
    x, f, dy = random_operands(cfg, 7)
    y, dx, df = run_all_three(cfg, data_format, x, f, dy, implementation=implementation)
    assert y.shape == out_shape(cfg)
    np.testing.assert_array_equal(dx, np.zeros(cfg["x_shape"]))
    np.testing.assert_array_equal(df, np.zeros(cfg["f_shape"]))

    strides, padding, kw = op_kwargs(cfg, data_format)
    xs = jnp.asarray(to_nchw(x) if data_format == "NCHW" else x)

    def loss(x, f):
        y = jaxgrad.depthwise_conv2d(x, f, strides, padding, implementation=implementation, **kw)
        return (y**2).sum()

    gx, gf = jax.grad(loss, argnums=(0, 1))(xs, jnp.asarray(f))
    np.testing.assert_array_equal(gx, np.zeros(xs.shape))
    np.testing.assert_array_equal(gf, np.zeros(cfg["f_shape"]))


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_lowering_a_wide_image_takes_no_host_memory_per_pixel(data_format):
    # Whether a window lies inside the image is decided from its ends: lowering the
    # forward op and both gradients for an image 2**27 pixels wide builds no index
    # per pixel (that took 1 GiB per window here, and 20 GB at 2**31 pixels).
    wide = (1, 1, 2**27, 1) if data_format == "NHWC" else (1, 1, 1, 2**27)
    x = jax.ShapeDtypeStruct(wide, jnp.float32)
    f = jax.ShapeDtypeStruct((3, 3, 1, 1), jnp.float32)

    def loss(x, f):
        return jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", data_format=data_format).sum()

    tracemalloc.start()
    try:
        jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**26, f"{peak / 2**20:.0f} MiB"


def test_gradients_of_one_operand_after_gradients_of_both():
    # The backward computes only the gradients asked for. Asking for both, then for
    # one, in one process reuses the traced backward: on JAX 0.7 that failed with
    # an AssertionError unless the backward's results kept one structure. The same
    # for second order, through the gradients' own backward. The custom VJPs are
    # every implementation's (for the kernels: the lowering tests of
    # test_depthwise_implementations.py ask for one gradient after both too).
    cfg = make_cfg((2, 6, 5, 3), (3, 3, 3, 2), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)))
    x, f, _ = (jnp.asarray(a) for a in random_operands(cfg, 7))

    def loss(x, f):
        return (jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME") ** 2).sum()

    def through_gradients(x, f):
        dx, df = jax.grad(loss, argnums=(0, 1))(x, f)
        return (dx**2).sum() + (df**2).sum()

    for fn in (loss, through_gradients):
        both = jax.jit(jax.grad(fn, argnums=(0, 1)))(x, f)
        for i in (0, 1):
            (alone,) = jax.jit(jax.grad(fn, argnums=(i,)))(x, f)
            np.testing.assert_allclose(alone, both[i], rtol=1e-12, atol=1e-12)


def test_same_puts_the_odd_pixel_after():
    # n = 4, k = 2, s = 1: need = 1, so before = 0 and after = 1 (bottom/right).
    x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    f = jnp.zeros((2, 2, 1, 1)).at[0, 0].set(1.0)
    np.testing.assert_array_equal(jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME"), x)


def test_deterministic():
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(4, 32, 32, 16)), jnp.float32)
    f = jnp.asarray(rng.normal(size=(3, 3, 16, 1)), jnp.float32)
    g = jax.jit(
        jax.grad(
            lambda x, f: (jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME") ** 2).sum(), argnums=(0, 1)
        )
    )
    first = [np.asarray(a).tobytes() for a in g(x, f)]
    for _ in range(3):
        assert [np.asarray(a).tobytes() for a in g(x, f)] == first


def test_no_scatter_in_any_gradient():
    x = jnp.ones((2, 8, 8, 4), jnp.float32)
    f = jnp.ones((3, 3, 4, 2), jnp.float32)
    g = jax.jit(
        jax.grad(lambda x, f: jaxgrad.depthwise_conv2d(x, f, (2, 2), "SAME").sum(), argnums=(0, 1))
    )
    assert "scatter" not in g.lower(x, f).as_text()


def test_forward_mode_raises():
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(
            lambda x: jaxgrad.depthwise_conv2d(x, jnp.ones((1, 1, 1, 1)), (1, 1), "VALID"),
            (jnp.ones((1, 2, 2, 1)),),
            (jnp.ones((1, 2, 2, 1)),),
        )


# ----------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------

X = jnp.ones((1, 5, 5, 2))
F = jnp.ones((3, 3, 2, 1))
DY = jnp.ones((1, 5, 5, 2))
conv = jaxgrad.depthwise_conv2d
bpi = jaxgrad.depthwise_conv2d_backprop_input
bpf = jaxgrad.depthwise_conv2d_backprop_filter


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: conv(jnp.ones((5, 5, 2)), F, (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d: input must have rank 4, got rank 3 \(\(5, 5, 2\)\)",
        ),
        (
            lambda: conv(X, jnp.ones((3, 3, 2)), (1, 1), "SAME"),
            ValueError,
            "depthwise_conv2d: filter must have rank 4, got rank 3",
        ),
        (
            lambda: conv(X, jnp.ones((3, 3, 3, 1)), (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d: input channels \(2\) must equal the filter's in_channels \(3\)",
        ),
        (
            # NCHW data with the NHWC default: say which layout would match.
            lambda: conv(jnp.ones((1, 2, 5, 5)), F, (1, 1), "SAME"),
            ValueError,
            r"input channels \(5\) must equal the filter's in_channels \(2\).*The input "
            r"matches the filter if it is NCHW, not NHWC: pass data_format='NCHW'",
        ),
        (
            lambda: conv(X, F, (1, 1), "SAME", data_format="NCHW"),
            ValueError,
            "if it is NHWC, not NCHW: pass data_format='NHWC'",
        ),
        (
            # PyTorch's depthwise weight, [C * M, 1, kh, kw].
            lambda: conv(X, jnp.ones((4, 1, 3, 3)), (1, 1), "SAME"),
            ValueError,
            r"The filter looks like PyTorch's \[out_channels, 1, kh, kw\]; jaxgrad takes "
            r"\[filter_height, filter_width, in_channels, channel_multiplier\]",
        ),
        (
            lambda: conv(X, jnp.ones((3, 3, 2, 0)), (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d: filter must have a positive height, width and "
            r"channel_multiplier .*got shape \(3, 3, 2, 0\)",
        ),
        (
            lambda: conv(X, jnp.ones((0, 3, 2, 1)), (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d: filter must have a positive height.*got shape \(0, 3, 2, 1\)",
        ),
        (
            lambda: bpf(X, (3, 0, 2, 1), DY, (1, 1), "SAME"),
            ValueError,
            "depthwise_conv2d_backprop_filter: filter_sizes must have a positive height",
        ),
        (
            lambda: jax.jit(lambda f, dy, s: bpi(s, f, dy, (1, 1), "SAME"))(F, DY, (1, 5, 5, 2)),
            TypeError,
            "depthwise_conv2d_backprop_input: input_sizes must be static",
        ),
        (
            lambda: conv(X, F, (1, 1), "FULL"),
            ValueError,
            "depthwise_conv2d: padding must be one of 'SAME', 'VALID', 'EXPLICIT', got 'FULL'",
        ),
        (
            lambda: conv(X, F, (1, 1), "SAME", data_format="NCWH"),
            ValueError,
            "depthwise_conv2d: data_format must be one of 'NHWC', 'NCHW', got 'NCWH'",
        ),
        (
            lambda: conv(X, F, (1, 1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d: strides must have 4 entries \(data_format order\) or 2 "
            r"\(height, width\), got 3",
        ),
        (
            lambda: conv(X, F, (1, 0), "SAME"),
            ValueError,
            r"depthwise_conv2d: strides must be >= 1, got \(1, 0\)",
        ),
        (
            lambda: conv(X, F, (2, 1, 1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d: strides must be 1 on the batch and channel dimensions, "
            r"got \(2, 1, 1, 1\)",
        ),
        (
            lambda: conv(X, F, (1, 1), "SAME", data_format="NCHW", dilations=(1, 2, 1, 1)),
            ValueError,
            "depthwise_conv2d: dilations must be 1 on the batch and channel dimensions",
        ),
        (
            lambda: conv(X, F, (1, 1), "SAME", dilations=(1, -1)),
            ValueError,
            "depthwise_conv2d: dilations must be >= 1",
        ),
        (
            lambda: conv(X, F, (1, 1), "SAME", dilations=(1, 1, 1)),
            ValueError,
            "depthwise_conv2d: dilations must have 4 entries",
        ),
        (
            lambda: conv(X, F, (1, 1), "EXPLICIT"),
            ValueError,
            "depthwise_conv2d: explicit_paddings must have 8 entries with padding 'EXPLICIT', "
            "got 0",
        ),
        (
            lambda: conv(X, F, (1, 1), "EXPLICIT", explicit_paddings=(0,) * 6),
            ValueError,
            "explicit_paddings must have 8 entries with padding 'EXPLICIT', got 6",
        ),
        (
            lambda: conv(X, F, (1, 1), "EXPLICIT", explicit_paddings=(0, 0, -1, 0, 0, 0, 0, 0)),
            ValueError,
            "depthwise_conv2d: explicit_paddings must be non-negative",
        ),
        (
            lambda: conv(X, F, (1, 1), "EXPLICIT", explicit_paddings=(1, 0, 0, 0, 0, 0, 0, 0)),
            ValueError,
            "depthwise_conv2d: explicit_paddings must be 0 on the batch and channel dimensions",
        ),
        (
            lambda: conv(X, F, (1, 1), "EXPLICIT", explicit_paddings=(0, 0, 0, 0, 0, 0, 0, 1)),
            ValueError,
            "explicit_paddings must be 0 on the batch and channel dimensions",
        ),
        (
            lambda: conv(X, F, (1, 1), "SAME", explicit_paddings=(0,) * 8),
            ValueError,
            "depthwise_conv2d: explicit_paddings must be empty unless padding is 'EXPLICIT', "
            "got .* with padding 'SAME'",
        ),
        (
            lambda: conv(X, jnp.ones((7, 3, 2, 1)), (1, 1), "VALID"),
            ValueError,
            r"depthwise_conv2d: the computed output height must not be negative, got -1",
        ),
        (
            lambda: conv(X, jnp.ones((3, 3, 2, 1)), (1, 1), "VALID", dilations=(1, 3)),
            ValueError,
            "depthwise_conv2d: the computed output width must not be negative, got -1",
        ),
        (
            lambda: conv(X, jnp.ones((3, 3, 2, 1), jnp.float32), (1, 1), "SAME"),
            TypeError,
            "depthwise_conv2d: filter must have dtype float64, got float32",
        ),
        (
            lambda: conv(jnp.ones((1, 5, 5, 2), jnp.int32), F, (1, 1), "SAME"),
            TypeError,
            "depthwise_conv2d: input must have dtype float16, bfloat16, float32 or float64, "
            "got int32",
        ),
        (
            lambda: conv(X, F, 1, "SAME"),
            TypeError,
            "depthwise_conv2d: strides must be a sequence of ints, got 1",
        ),
        (
            lambda: bpi((1, 5, 5, 2), F, jnp.ones((1, 4, 5, 2)), (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d_backprop_input: out_backprop's shape must equal the computed "
            r"output shape: actual \(1, 4, 5, 2\), computed \(1, 5, 5, 2\)",
        ),
        (
            lambda: bpi((1, 5, 5), F, DY, (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d_backprop_input: input_sizes must be 4 non-negative ints, "
            r"got \(1, 5, 5\)",
        ),
        (
            lambda: bpi((1, 5, -5, 2), F, DY, (1, 1), "SAME"),
            ValueError,
            "input_sizes must be 4 non-negative ints",
        ),
        (
            lambda: bpi((1, 5, 5, 3), F, DY, (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d_backprop_input: input channels \(3\) must equal the filter's "
            r"in_channels \(2\)",
        ),
        (
            lambda: bpi((1, 5, 5, 2), F, jnp.ones((1, 5, 5, 2), jnp.float32), (1, 1), "SAME"),
            TypeError,
            "depthwise_conv2d_backprop_input: out_backprop must have dtype float64",
        ),
        (
            lambda: bpi((1, 5, 5, 2), F, jnp.ones((5, 5, 2)), (1, 1), "SAME"),
            ValueError,
            "depthwise_conv2d_backprop_input: out_backprop must have rank 4",
        ),
        (
            lambda: bpi(jnp.array([1, 5, 5, 2]), F, DY, (1, 1), "SAME"),
            TypeError,
            "depthwise_conv2d_backprop_input: input_sizes must be a sequence of ints",
        ),
        (
            lambda: bpi("1552", F, DY, (1, 1), "SAME"),
            TypeError,
            "depthwise_conv2d_backprop_input: input_sizes must be a sequence of ints",
        ),
        (
            lambda: bpf(X, (3, 3, 2, 2), DY, (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d_backprop_filter: out_backprop's shape must equal the computed "
            r"output shape: actual \(1, 5, 5, 2\), computed \(1, 5, 5, 4\)",
        ),
        (
            lambda: bpf(X, (3, 3, 4, 1), DY, (1, 1), "SAME"),
            ValueError,
            r"depthwise_conv2d_backprop_filter: input channels \(2\) must equal the filter's "
            r"in_channels \(4\)",
        ),
        (
            lambda: bpf(X, (3, 3, 2), DY, (1, 1), "SAME"),
            ValueError,
            "depthwise_conv2d_backprop_filter: filter_sizes must be 4 non-negative ints",
        ),
        (
            lambda: bpf(X, (3, 3, 2, 1), DY, (1, 1), "VALID"),
            ValueError,
            r"actual \(1, 5, 5, 2\), computed \(1, 3, 3, 2\)",
        ),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
