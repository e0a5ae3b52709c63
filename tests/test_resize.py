"""resize against SPEC §2.7: an ONNX-style reference, PyTorch's and jax.image's results."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import needs_kernels, transformed
from hypothesis import given
from hypothesis import strategies as st
from jax.test_util import check_grads

import jaxgrad
from jaxgrad._resample import _plan, _resize

CTMS = [
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "half_pixel_symmetric",
]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def onnx_coordinate(ctm, o, n_in, n_out, scale):
    """ONNX Resize's original coordinate of output index o, as its reference evaluator."""
    length = scale * n_in
    if ctm == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if length != 1 else 0.0
    if ctm == "align_corners":
        return o * (n_in - 1) / (length - 1) if length != 1 else 0.0
    if ctm == "asymmetric":
        return o / scale
    if ctm == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    adjustment = n_out / length
    center = n_in / 2
    offset = center * (1 - adjustment)
    return offset + (o + 0.5) / scale - 0.5


def onnx_axis_weights(ctm, mode, nearest_mode, n_in, n_out, scale):
    """Dense n_out x n_in weights: neighbours floor(u), floor(u) + 1 (edge-padded), as ONNX."""
    w = np.zeros((n_out, n_in))
    for o in range(n_out):
        u = onnx_coordinate(ctm, o, n_in, n_out, scale)
        lo = math.floor(u)
        ratio = u - lo
        if mode == "linear":
            coeffs = [1 - ratio, ratio]
        elif ratio == 0:
            coeffs = [1.0, 0.0]
        else:
            up = {
                "round_prefer_floor": ratio > 0.5,
                "round_prefer_ceil": ratio >= 0.5,
                "floor": False,
                "ceil": True,
            }[nearest_mode]
            coeffs = [0.0, 1.0] if up else [1.0, 0.0]
        for i, c in zip((lo, lo + 1), coeffs, strict=True):
            w[o, min(max(i, 0), n_in - 1)] += c
    return w


def onnx_resize(x, out_shape, scales, ctm, mode, nearest_mode):
    out = np.asarray(x, np.float64)
    for d, (n_out, s) in enumerate(zip(out_shape, scales, strict=True)):
        w = onnx_axis_weights(ctm, mode, nearest_mode, out.shape[d], n_out, s)
        out = np.moveaxis(np.tensordot(w, np.moveaxis(out, d, 0), axes=1), 0, d)
    return out


@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=3),
    st.data(),
    st.sampled_from(CTMS),
    st.sampled_from(["nearest", "linear"]),
    st.sampled_from(NEAREST_MODES),
    st.booleans(),
)
def test_matches_onnx_reference(in_shape, data, ctm, mode, nearest_mode, use_scales):
    rank = len(in_shape)
    x = np.random.default_rng(sum(in_shape)).normal(size=in_shape)
    kw = dict(mode=mode, coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    if use_scales:
        # Scales that are exact binary fractions make exact ties, the hard case.
        pick = st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 0.6, 1.7])
        scales = tuple(data.draw(st.lists(pick, min_size=rank, max_size=rank)))
        out_shape = tuple(math.floor(n * s) for n, s in zip(in_shape, scales, strict=True))
        if 0 in out_shape:
            return
        got = jaxgrad.resize(jnp.asarray(x), scales=scales, **kw)
    else:
        out_shape = tuple(data.draw(st.lists(st.integers(1, 12), min_size=rank, max_size=rank)))
        scales = tuple(m / n for m, n in zip(out_shape, in_shape, strict=True))
        got = jaxgrad.resize(jnp.asarray(x), out_shape, **kw)
    expected = onnx_resize(x, out_shape, scales, ctm, mode, nearest_mode)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def read_matrix(plan):
    """The dense matrix of a plan's rows, as the program reads them."""
    table = plan.listed()
    rows = np.broadcast_to(np.arange(plan.n_rows)[:, None], table.index.shape)
    matrix = np.zeros((plan.n_rows, plan.n_cols))
    np.add.at(matrix, (rows[table.valid], table.index[table.valid]), table.weights[table.valid])
    return matrix


# Axes of 1 to 24 inputs and outputs, by output_shape (scale n_out / n_in) and by
# the scales of the property above.
SHORT_AXES = [(n_in, n_out, n_out / n_in) for n_in in range(1, 25) for n_out in range(1, 25)] + [
    (n_in, math.floor(n_in * s), s)
    for n_in in range(1, 25)
    for s in (0.25, 0.5, 0.75, 1.25, 1.5, 2.5, 3.0, 0.6, 1.7)
    if math.floor(n_in * s) > 0
]


@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("ctm", CTMS)
def test_nearest_reads_the_input_onnx_reads_on_every_short_axis(ctm, nearest_mode):
    # Where a coordinate is whole (or half) in real numbers, ONNX's float64
    # expression can land either side of it, output by output; a scale's period
    # (u(kP + j) = u(j) + kQ) may land elsewhere, and would read another input.
    # (A random search of the property above found 7 inputs at 0.5, half-pixel
    # symmetric, rounding up: ONNX reads inputs 2, 3 and 5, the period 2, 4 and 6.)
    for n_in, n_out, scale in SHORT_AXES:
        axis = _resize.axis_of(ctm, "nearest", nearest_mode, n_in, n_out, scale)
        want = onnx_axis_weights(ctm, "nearest", nearest_mode, n_in, n_out, scale)
        case = f"{n_in} -> {n_out} at {scale}"
        np.testing.assert_array_equal(read_matrix(_plan._make_plan(axis, False)), want, case)
        np.testing.assert_array_equal(read_matrix(_plan._make_plan(axis, True)), want.T, case)


@pytest.mark.parametrize("implementation", ["xla", pytest.param("pallas", marks=needs_kernels)])
def test_nearest_reads_the_input_onnx_reads_where_a_period_would_not(implementation):
    # ONNX's coordinates of 7 inputs at 0.5, half-pixel symmetric: 1.0000000000000002,
    # 3.0 and 5.0, rounded up to 2, 3 and 5 (the period: 2, 4 and 6).
    y = jaxgrad.resize(
        jnp.arange(7.0),
        scales=(0.5,),
        mode="nearest",
        coordinate_transformation_mode="half_pixel_symmetric",
        nearest_mode="ceil",
        implementation=implementation,
    )
    np.testing.assert_array_equal(y, [2, 3, 5])

    # 14 inputs to 18 outputs, as PyTorch's "nearest" by size: output 9 at
    # 9 / (18 / 14) = 6.999999999999999 reads input 6 (the period, 9 outputs to 7
    # inputs, puts it at 7). Its gradient is the transpose.
    def torch_nearest(x):
        return jaxgrad.resize(
            x,
            (18,),
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
            implementation=implementation,
        )

    x = jnp.arange(14.0)
    np.testing.assert_array_equal(torch_nearest(x), np.floor(np.arange(18) / (18 / 14)))
    assert torch_nearest(x)[9] == 6
    dx = jax.grad(lambda x: jnp.vdot(jnp.arange(18.0), torch_nearest(x)))(x)
    np.testing.assert_array_equal(dx[6:8], [8 + 9, 10])  # input 6: outputs 8, 9; 7: 10


X5 = np.arange(1.0, 6.0) ** 2  # [1, 4, 9, 16, 25]

# Outputs of torch.nn.functional.interpolate (PyTorch 2.13, float64) on X5[None, None].
PYTORCH = [
    (8, dict(mode="linear"), [1.0, 2.3125, 4.3125, 7.4375, 11.1875, 15.5625, 21.0625, 25.0]),
    (3, dict(mode="linear"), [2.0, 9.0, 22.000000000000004]),
    (
        8,
        dict(mode="linear", coordinate_transformation_mode="align_corners"),
        [
            1.0,
            2.7142857142857144,
            4.7142857142857135,
            7.571428571428571,
            11.0,
            14.999999999999996,
            19.857142857142854,
            25.0,
        ],
    ),
    (2, dict(mode="linear", coordinate_transformation_mode="align_corners"), [1.0, 25.0]),
    (
        8,
        dict(coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        [1.0, 1.0, 4.0, 4.0, 9.0, 16.0, 16.0, 25.0],
    ),
    (3, dict(coordinate_transformation_mode="asymmetric", nearest_mode="floor"), [1.0, 4.0, 16.0]),
    (8, dict(nearest_mode="round_prefer_ceil"), [1.0, 1.0, 4.0, 9.0, 9.0, 16.0, 25.0, 25.0]),
    (3, dict(nearest_mode="round_prefer_ceil"), [1.0, 9.0, 25.0]),
]


@pytest.mark.parametrize(("size", "kw", "expected"), PYTORCH)
def test_pytorch_interpolate_ports(size, kw, expected, transform):
    f = transformed(lambda x: jaxgrad.resize(x, (size,), **kw), transform)
    np.testing.assert_allclose(f(jnp.asarray(X5)), expected, rtol=1e-14)


# F.interpolate(X5[None, None], scale_factor=...) in PyTorch 2.13 (float64), its
# gradient of sum(y * [1, 2, ...]), and the resize call that ports it.
PYTORCH_BY_FACTOR = [
    (  # align_corners=True: the corners of the rounded length, 7, not of 7.5
        dict(output_shape=(7,), coordinate_transformation_mode="align_corners"),
        [1.0, 3.0, 5.666666666666666, 9.0, 13.666666666666666, 18.999999999999996, 25.0],
        [1.6666666666666667, 3.3333333333333335, 6.666666666666668, 7.333333333333334, 9.0],
    ),
    (  # scale_factor=1.1 leaves the length 5, and PyTorch copies the axis
        dict(scales=(1.0,)),
        list(X5),
        [1.0, 2.0, 3.0, 4.0, 5.0],
    ),
    (
        dict(scales=(0.9,)),
        [1.1666666666666667, 4.833333333333334, 10.944444444444443, 19.500000000000004],
        [0.9444444444444444, 1.722222222222222, 2.5, 3.277777777777776, 1.5555555555555571],
    ),
]


@pytest.mark.parametrize(("kw", "expected", "gradient"), PYTORCH_BY_FACTOR)
def test_pytorch_interpolate_by_factor_ports(kw, expected, gradient):
    y, vjp = jax.vjp(lambda x: jaxgrad.resize(x, mode="linear", **kw), jnp.asarray(X5))
    np.testing.assert_allclose(y, expected, rtol=1e-14)
    dy = jnp.arange(1.0, len(expected) + 1)
    np.testing.assert_allclose(vjp(dy)[0], gradient, rtol=1e-13)


def test_align_corners_by_scales_aligns_the_unrounded_length():
    # ONNX's align_corners with scales: u = o * (n_in - 1) / (n_in * s - 1), the
    # corners of 7.5 outputs, where PyTorch's scale_factor aligns those of 7.
    y = jaxgrad.resize(
        jnp.asarray(X5),
        scales=(1.5,),
        mode="linear",
        coordinate_transformation_mode="align_corners",
    )
    u = np.arange(7) * 4 / 6.5
    np.testing.assert_allclose(y, np.interp(u, np.arange(5), X5), rtol=1e-14)


def test_nearest_by_a_factor_that_keeps_the_length():
    # 5 pixels at factor 1.1, as PyTorch's 1-D nearest forward reads them (its
    # gradient copies [1, 2, 3, 4, 5] back instead of this transpose).
    def nearest(x):
        return jaxgrad.resize(
            x, scales=(1.1,), coordinate_transformation_mode="asymmetric", nearest_mode="floor"
        )

    y, vjp = jax.vjp(nearest, jnp.asarray(X5))
    np.testing.assert_array_equal(y, [1.0, 1.0, 4.0, 9.0, 16.0])
    np.testing.assert_array_equal(vjp(jnp.arange(1.0, 6.0))[0], [1 + 2, 3, 4, 5, 0])


@pytest.mark.parametrize("out_shape", [(3, 9, 12), (5, 16, 7)])
def test_jax_image_resize_linear_when_growing(out_shape):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4, 5)))
    expected = jax.image.resize(x, out_shape, "linear")
    np.testing.assert_allclose(jaxgrad.resize(x, out_shape, mode="linear"), expected, rtol=1e-12)


def test_tensorflow_half_pixel_centers_bilinear():
    # tf.image.resize(..., "bilinear") with half_pixel_centers=True on [[0, 1], [2, 3]]
    # to 4x4: the half-pixel grid, edges clamped.
    x = jnp.array([[0.0, 1.0], [2.0, 3.0]])
    row = np.array([0.0, 0.25, 0.75, 1.0])
    expected = row[None, :] + 2 * row[:, None]
    np.testing.assert_allclose(jaxgrad.resize(x, (4, 4), mode="linear"), expected)


def test_gradient_is_resample_grad_and_check_grads():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 5)))

    def f(x):
        return jaxgrad.resize(
            x,
            (7, 3),
            mode="linear",
            coordinate_transformation_mode="align_corners",
        )

    check_grads(f, (x,), order=2, modes=["rev"])
    g = jnp.asarray(np.random.default_rng(2).normal(size=(7, 3)))
    dx = jax.vjp(f, x)[1](g)[0]
    expected = jaxgrad.resample_grad(
        g, (4, 5), (2 / 1, 2 / 4), mode="linear", input_pixel_offsets=0, output_pixel_offsets=0
    )
    np.testing.assert_allclose(dx, expected, rtol=1e-12)


def test_integer_nearest():
    x = jnp.arange(6, dtype=jnp.uint8).reshape(2, 3)
    out = jaxgrad.resize(x, (4, 6))
    assert out.dtype == jnp.uint8
    np.testing.assert_array_equal(out, np.repeat(np.repeat(np.asarray(x), 2, 0), 2, 1))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2))),
            ValueError,
            "resize: give exactly one of output_shape and scales, got neither",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), (4, 4), scales=(2, 2)),
            ValueError,
            "resize: give exactly one of output_shape and scales, got both",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), (4,)),
            ValueError,
            r"resize: output_shape must have one entry per axis \(2\), got 1",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), scales=(2, 0)),
            ValueError,
            "resize: scales must be positive",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), scales=(2, 0.2)),
            ValueError,
            r"resize: floor\(x.shape \* scales\) = \(4, 0\) has a zero length",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), (4, 4), coordinate_transformation_mode="tf"),
            ValueError,
            "resize: coordinate_transformation_mode must be one of 'half_pixel', ",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), (4, 4), nearest_mode="round"),
            ValueError,
            "resize: nearest_mode must be one of 'round_prefer_floor', 'round_prefer_ceil', "
            "'floor', 'ceil', got 'round'",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones((2, 2)), (4, 4), mode="cubic"),
            ValueError,
            "resize: mode must be one of 'nearest', 'linear', got 'cubic'",
        ),
        (
            lambda: jaxgrad.resize(jnp.ones(2, jnp.int32), (4,), mode="linear"),
            TypeError,
            "resize: x must have a floating dtype for this mode, got int32",
        ),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
