"""ReLU pair against SPEC §1: a NumPy reference, edge cases, gradients, errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FLOAT_DTYPES, transformed
from jax.test_util import check_grads

import jaxgrad


def reference_relu(x):
    """SPEC §1 literally, one element at a time, in float64."""
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    for i in np.ndindex(x.shape):
        out[i] = x[i] if (np.isnan(x[i]) or x[i] > 0) else 0.0
    return out


def reference_relu_grad(x, dy):
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    out = np.zeros_like(dy)
    for i in np.ndindex(x.shape):
        if x[i] > 0:  # False for 0, -0 and NaN
            out[i] = dy[i]
    return out


EDGES = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-30, -1e-30, 2.5, -2.5])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 1, 5)])
def test_relu_matches_reference(dtype, shape, transform):
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), dtype)
    out = transformed(jaxgrad.relu, transform)(x)
    assert out.dtype == dtype and out.shape == shape
    np.testing.assert_array_equal(np.asarray(out, np.float64), reference_relu(x))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_relu_grad_matches_reference(dtype, transform):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(4, 5)), dtype)
    dy = jnp.asarray(rng.normal(size=(4, 5)), dtype)
    out = transformed(jaxgrad.relu_grad, transform)(x, dy)
    assert out.dtype == dtype and out.shape == x.shape
    np.testing.assert_array_equal(np.asarray(out, np.float64), reference_relu_grad(x, dy))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_edge_cases(dtype):
    # Every pairing of an edge x with an edge dy, NaN and inf in dy included.
    x, dy = (jnp.asarray(v, dtype) for v in zip(*itertools.product(EDGES, EDGES), strict=True))
    np.testing.assert_array_equal(np.asarray(jaxgrad.relu(x), np.float64), reference_relu(x))
    got = np.asarray(jaxgrad.relu_grad(x, dy), np.float64)
    np.testing.assert_array_equal(got, reference_relu_grad(x, dy))


def test_edge_semantics_spelled_out():
    x = jnp.array([0.0, -0.0, np.nan, 1.0, -1.0])
    dy = jnp.array([5.0, 5.0, 5.0, np.nan, np.nan])
    out = np.asarray(jaxgrad.relu_grad(x, dy))
    assert out[0] == 0 and out[1] == 0 and out[2] == 0  # x == 0, -0, NaN give 0
    assert np.isnan(out[3])  # NaN in dy passes where x > 0
    assert out[4] == 0
    assert np.isnan(np.asarray(jaxgrad.relu(jnp.array(np.nan))))  # NaN stays NaN


def test_seed_example():
    # DirectML's ACTIVATION_RELU_GRAD: OutputGradient = X > 0 ? dY : 0.
    x = jnp.array([[-2.0, 0.0], [3.0, 5.0]], jnp.float32)
    dy = jnp.array([[10.0, 20.0], [30.0, 40.0]], jnp.float32)
    np.testing.assert_array_equal(jaxgrad.relu_grad(x, dy), [[0.0, 0.0], [30.0, 40.0]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_vjp_is_relu_grad(dtype, transform):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(3, 6)), dtype)
    g = jnp.asarray(rng.normal(size=(3, 6)), dtype)

    def vjp(x, g):
        return jax.vjp(jaxgrad.relu, x)[1](g)[0]

    out = transformed(vjp, transform)(x, g)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, jaxgrad.relu_grad(x, g))


def test_check_grads_relu():
    # Away from the kink at 0, where finite differences are meaningful.
    x = jnp.array([[-1.5, 0.7, 2.0], [0.3, -0.2, -3.0]], jnp.float64)
    check_grads(jaxgrad.relu, (x,), order=2, modes=["rev"])


def test_check_grads_relu_grad():
    x = jnp.array([[-1.5, 0.7, 2.0], [0.3, -0.2, -3.0]], jnp.float64)
    dy = jnp.array([[1.0, -2.0, 0.5], [4.0, 3.0, -1.0]], jnp.float64)
    check_grads(jaxgrad.relu_grad, (x, dy), order=2, modes=["rev"])


def test_relu_grad_vjp_follows_spec():
    # SPEC §0: w.r.t. dy the VJP is relu_grad(x, c); w.r.t. x it is zero.
    x = jnp.array([-1.0, 0.0, 2.0, np.nan])
    dy = jnp.array([1.0, 2.0, 3.0, 4.0])
    c = jnp.array([7.0, 8.0, 9.0, 10.0])
    dx, ddy = jax.vjp(jaxgrad.relu_grad, x, dy)[1](c)
    np.testing.assert_array_equal(dx, np.zeros(4))
    np.testing.assert_array_equal(ddy, jaxgrad.relu_grad(x, c))


def test_grad_of_grad():
    # d/dx of sum(relu(x)^2) = 2 relu(x) [x > 0]; its derivative again: 2 [x > 0].
    x = jnp.array([-1.0, 0.5, 2.0])
    second = jax.grad(lambda x: jax.grad(lambda x: (jaxgrad.relu(x) ** 2).sum())(x).sum())(x)
    np.testing.assert_array_equal(second, [0.0, 2.0, 2.0])


def test_residual_is_a_boolean_mask():
    x = jnp.ones((4, 4), jnp.float32)
    _, vjp = jax.vjp(jaxgrad.relu, x)
    residuals = [leaf for leaf in jax.tree_util.tree_leaves(vjp) if hasattr(leaf, "dtype")]
    assert residuals and all(r.dtype == jnp.bool_ for r in residuals)


def test_forward_mode_raises():
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(jaxgrad.relu, (jnp.ones(3),), (jnp.ones(3),))


def test_deterministic():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(64, 64)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(64, 64)), jnp.float32)
    f = jax.jit(lambda x, g: jax.vjp(jaxgrad.relu, x)[1](g)[0])
    first = np.asarray(f(x, g))
    for _ in range(5):
        assert np.asarray(f(x, g)).tobytes() == first.tobytes()


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([1.0, 2.0],), TypeError, "relu: x must be an array, got list"),
        ((jnp.array([1, 2]),), TypeError, "relu: x must have dtype float16, .*, got int"),
        ((jnp.array([True]),), TypeError, "relu: x must have dtype .*, got bool"),
        (("abc",), TypeError, "relu: x must be an array, got str"),
    ],
)
def test_relu_errors(args, error, match):
    with pytest.raises(error, match=match):
        jaxgrad.relu(*args)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (
            (jnp.ones(3), jnp.ones(4)),
            ValueError,
            r"relu_grad: dy must have the shape of x \(\(3,\)\), got \(4,\)",
        ),
        ((jnp.ones(3), jnp.ones((1, 3))), ValueError, r"shape of x \(\(3,\)\), got \(1, 3\)"),
        (
            (jnp.ones(3), jnp.ones(3, jnp.float32)),
            TypeError,
            r"relu_grad: dy must have the dtype of x \(float64\), got float32",
        ),
        (
            (jnp.ones(3, jnp.int32), jnp.ones(3)),
            TypeError,
            "relu_grad: x must have dtype .*, got int32",
        ),
        ((jnp.ones(3), None), TypeError, "relu_grad: dy must be an array, got NoneType"),
    ],
)
def test_relu_grad_errors(args, error, match):
    with pytest.raises(error, match=match):
        jaxgrad.relu_grad(*args)
