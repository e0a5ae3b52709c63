"""The pages' examples run as a user would run them: under JAX's default configuration.

tests/conftest.py turns on float64 and strict promotion for the whole pytest process;
the doctests in these pages show what a user sees by default (float32 results), so
each runs with the defaults restored.
"""

import pathlib

import jax
import pytest

from jaxgrad import _kernels

# The Python files here are the site's tooling, not documentation with examples.
collect_ignore = ["conf.py", "make_figures.py"]

# Pages whose examples run the Pallas kernels (interpreted on the CPU): they need a
# JAX with Pallas' Triton backend, as the kernels' tests do (tests/helpers.py).
KERNEL_PAGES = {pathlib.Path(__file__).parent / "resample.md"}

JAX_DEFAULTS = {
    "jax_enable_x64": False,
    "jax_numpy_rank_promotion": "allow",
    "jax_numpy_dtype_promotion": "standard",
}


@pytest.fixture(autouse=True)
def jax_defaults():
    saved = {name: getattr(jax.config, name) for name in JAX_DEFAULTS}
    for name, value in JAX_DEFAULTS.items():
        jax.config.update(name, value)
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


def pytest_collection_modifyitems(items):
    if _kernels.AVAILABLE:
        return
    reason = f"this JAX ({jax.__version__}) does not lower Pallas' Triton kernels"
    for item in items:
        if item.path in KERNEL_PAGES:
            item.add_marker(pytest.mark.skip(reason=reason))
