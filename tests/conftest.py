"""Strict numerics for the whole suite, as equinox does: float64 available for gradient
checks, no silent rank or dtype promotion, warnings are errors (pyproject.toml)."""

import jax
import pytest
from helpers import TRANSFORMS
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


@pytest.fixture(params=TRANSFORMS)
def transform(request):
    return request.param


@pytest.fixture
def patch(monkeypatch):
    """``monkeypatch.setattr`` for what an op's choice of implementation reads, with
    JAX's caches cleared around it: the ops' compiled cores are traced once per
    configuration, and a traced choice would outlive the patch."""
    jax.clear_caches()
    yield monkeypatch.setattr
    monkeypatch.undo()
    jax.clear_caches()
