"""Strict numerics for the whole suite, as equinox does: float64 available for gradient
checks, no silent rank or dtype promotion, warnings are errors (pyproject.toml)."""

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

# A fixed, derandomized profile so that CI sees the same examples on every run.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")

# Tolerances per dtype, as JAX's own image tests use them.
TOLERANCE = {
    np.dtype("float16"): 2e-2,
    np.dtype(jax.numpy.bfloat16): 1e-1,
    np.dtype("float32"): 1e-4,
    np.dtype("float64"): 1e-10,
}

FLOAT_DTYPES = [jax.numpy.float16, jax.numpy.bfloat16, jax.numpy.float32, jax.numpy.float64]

# Each op is tested eagerly, under jit and under vmap (over a leading batch of two).
TRANSFORMS = ["eager", "jit", "vmap"]


def transformed(fn, transform):
    """``fn`` applied eagerly, under ``jax.jit``, or under ``jax.vmap`` of two copies.

    The vmapped variant stacks each array argument twice and checks that both
    halves agree, so callers compare one result whatever the transform.
    """
    if transform == "eager":
        return fn
    if transform == "jit":
        return jax.jit(fn)

    def vmapped(*args):
        stacked = [jax.numpy.stack([a, a]) for a in args]
        out = jax.vmap(fn)(*stacked)
        np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(out[1]))
        return out[0]

    return vmapped


@pytest.fixture(params=TRANSFORMS)
def transform(request):
    return request.param
