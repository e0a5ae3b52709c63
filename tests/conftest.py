"""Strict numerics for the whole suite, as equinox does: float64 available for gradient
checks, no silent rank or dtype promotion, warnings are errors (pyproject.toml). And
one compilation of each program per run."""

import gc
import os
import shutil
import tempfile

import jax
import pytest
from helpers import CAMPAIGN, SUITE_GC_THRESHOLDS, SUITE_XLA_FLAGS, TRANSFORMS, examples
from hypothesis import HealthCheck, settings

# The suite's XLA flags (helpers.py says which and why), read by XLA when it first
# compiles; pytest-xdist's workers inherit them with the environment.
if SUITE_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()

# Python's cycle collector runs less often in the suite (helpers.py says why).
gc.set_threshold(*SUITE_GC_THRESHOLDS)

# Compiling is most of the suite's time, and many tests compile the same programs
# (a reference, an op met in several tests' grids, a program compiled again after
# a test cleared JAX's caches). JAX's persistent compilation cache, in a directory
# of this run's, compiles each once: the first process of a run (pytest, or
# pytest-xdist's controller) makes the directory and removes it at the end, and the
# worker processes and the scripts the tests start inherit it with the
# environment, which JAX reads when it is imported. A cached program is the
# executable the same program compiled to, so nothing a test checks changes, but
# for one thing: the cross-process determinism check compiles in every process
# itself (tests/determinism_check.py). A run under a cache of the user's keeps it.
# JAX writes an entry in place, so a worker may read one half written: it warns
# and compiles (pyproject.toml lets that warning pass). JAX's file lock, which a
# size limit turns on, would prevent that but costs more than the cache saves: it
# writes an access time on every read and sizes the directory on every write.
RUN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    RUN_CACHE = tempfile.mkdtemp(prefix="jaxgrad-tests-xla-cache-")
    for option, value in {
        "jax_compilation_cache_dir": RUN_CACHE,
        "jax_persistent_cache_min_compile_time_secs": 0,  # every program, however quick
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }.items():
        jax.config.update(option, value)
        os.environ[option.upper()] = str(value)

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

# A fixed, derandomized profile so that CI sees the same examples on every run; a
# campaign (helpers.py) draws fresh ones, more of them, and keeps none.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("campaign", settings.get_profile("ci"), derandomize=False, database=None)
settings.load_profile("campaign" if CAMPAIGN else "ci")


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


def pytest_unconfigure(config):
    if RUN_CACHE is not None:
        shutil.rmtree(RUN_CACHE, ignore_errors=True)
