"""Shared test helpers: per-dtype tolerances, the dtype and transform sweeps.

A plain module rather than conftest.py, which tests cannot import by name reliably:
docs/ has a conftest.py of its own.
"""

import collections
import contextlib
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
from unittest import mock

import jax
import numpy as np
import pytest

from jaxgrad import _kernels

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


def compiled_entry(fn, *args):
    """The entry computation of ``fn``'s program as XLA compiled it for ``args``: the
    arrays it writes between its loops, not the ones inside a fused loop."""
    return jax.jit(fn).lower(*args).compile().as_text().split("ENTRY", 1)[1]


# Tests of the Pallas kernels, which run only on a JAX whose Pallas has the Triton
# backend they are written for (every JAX jaxgrad supports, until JAX drops it). On
# another JAX the ops' default is the portable program, which the rest of the suite
# tests. test_depthwise_implementations.py checks that _kernels.AVAILABLE is true
# wherever the kernels can run, so that they are never skipped by mistake.
needs_kernels = pytest.mark.skipif(
    not _kernels.AVAILABLE,
    reason=f"this JAX ({jax.__version__}) does not lower Pallas' Triton kernels",
)

# The custom call a Pallas Triton kernel lowers to.
TRITON_CALL = "__gpu$xla.gpu.triton"

# An H100's compute capability: patched in as _implementation._cuda_capability's
# answer, it gives a process without a GPU one that compiles the kernels.
H100_CAPABILITY = (9, 0)


def lowered_text(fn, *args, platform):
    """The StableHLO text of ``jax.jit(fn)`` for ``args``, lowered for ``platform``
    whether or not this process has that platform."""
    stand_in = gpu_stand_in() if platform == "cuda" else contextlib.nullcontext()
    with stand_in:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def launched_kernels(text):
    """The names of the Pallas kernels a lowered program's Triton calls launch, in
    order. Read from each call's own ``name`` field: the rest of its serialized
    Triton IR may name other kernels too (before JAX 0.9.1 it keeps the Python
    frames a shared helper was first traced under, a kernel launched elsewhere)."""
    names = []
    for line in text.splitlines():
        if TRITON_CALL in line:
            match = re.search(r', name = "(\w+)"', line)
            assert match, f"a Triton call without a name field (has JAX renamed it?): {line[:200]}"
            names.append(match[1])
    return names


def kernel_primitives(fn, *args):
    """The Pallas kernels ``jax.make_jaxpr(fn)(*args)`` calls, in order: each one's
    primitives, counted through its loops and branches, a measure of the code
    Triton compiles for it."""

    def nested(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                    if hasattr(sub, "eqns"):
                        yield from nested(sub)

    return [
        collections.Counter(e.primitive.name for e in nested(eqn.params["jaxpr"]))
        for eqn in nested(jax.make_jaxpr(fn)(*args).jaxpr)
        if eqn.primitive.name == "pallas_call"
    ]


def gpu_stand_in():
    """Lets a process without a GPU lower Pallas' Triton kernels, for an H100.

    From JAX 0.11 the Triton lowering asks the local GPU for its compute
    capability, and fails where there is none; JAX 0.10 lowers without asking.
    """
    from jax._src.pallas.triton import pallas_call_registration as registration
    from jax.experimental.pallas import triton as plgpu

    if not hasattr(registration, "gpu_info_lib"):
        return contextlib.nullcontext()
    h100 = plgpu.get_gpu_info_from_version(plgpu.GpuVersion.H100)
    return mock.patch.object(registration.gpu_info_lib, "get_gpu_info", lambda: h100)


@contextlib.contextmanager
def kernel_launches(kernels, **fields):
    """Every kernel of a family's kernel module ``kernels`` (its ``_pallas``)
    launched with the ``_Launch`` ``fields`` set, where they apply: launch options
    a GPU run may time, or a tile's warps. Programs are traced anew inside."""
    chosen = kernels._launch

    def launch(*args, **kwargs):
        return dataclasses.replace(chosen(*args, **kwargs), **fields)

    jax.clear_caches()
    try:
        with mock.patch.object(kernels, "_launch", launch):
            yield
    finally:
        jax.clear_caches()


@contextlib.contextmanager
def bounds_checked_kernels():
    """Interpreted kernels that access memory as a GPU does, and check it.

    Interpret mode clamps every lane of a load into its array (``masked_index``),
    since its gathers read every lane: a lane its mask lets through past the
    array's end then reads a real element, where a GPU reads past the allocation.
    Here lanes stay as the kernel computed them, and each ``plgpu.load`` and
    ``plgpu.store`` fails the computation (a ``JaxRuntimeError`` naming the array)
    where a lane its mask lets through lies outside the array; it then moves the
    masked lanes inside (a load) or past the end, where they are dropped (a store),
    as ``masked_index`` does. Programs are traced anew inside the context.
    """
    from jax._src.state import indexing

    masked_index, plgpu = _kernels.masked_index, _kernels.plgpu  # the unpatched ones

    def checked(access, *, store):
        def access_inside(ref, *args, mask=None, **kwargs):
            (indexer,) = ref.transforms  # the kernels index each ref once: ref.at[...]
            inside = np.bool_(True)
            lanes = []
            for index, size in zip(indexer.indices, indexer.shape, strict=True):
                if isinstance(index, indexing.Slice):
                    inside = inside & (index.start >= 0) & (index.start + index.size <= size)
                    lanes.append(index)
                    continue
                inside = inside & (index >= 0) & (index < size)
                lanes.append(masked_index(index, size, interpret=True, store=store))
            wanted = np.bool_(True) if mask is None else mask
            shape = jax.numpy.broadcast_shapes(jax.numpy.shape(inside), jax.numpy.shape(wanted))
            outside = jax.numpy.broadcast_to(wanted, shape) & ~jax.numpy.broadcast_to(inside, shape)

            def fail_if(outside):
                if outside:
                    raise IndexError(f"a kernel accessed a lane outside its {indexer.shape} array")

            jax.debug.callback(fail_if, jax.numpy.any(outside))
            return access(ref.ref.at[tuple(lanes)], *args, mask=mask, **kwargs)

        return access_inside

    def unclamped(lanes, size, *, interpret, store=False):
        return lanes

    jax.clear_caches()
    try:
        with (
            mock.patch.object(_kernels, "masked_index", unclamped),
            mock.patch.object(plgpu, "load", checked(plgpu.load, store=False)),
            mock.patch.object(plgpu, "store", checked(plgpu.store, store=True)),
        ):
            yield
    finally:
        jax.clear_caches()


ROOT = pathlib.Path(__file__).resolve().parent.parent


def as_jax_defaults():
    """A context in which JAX runs as it does by default, as the examples expect:
    float32, ranks and Python scalars promoted (the suite runs in float64,
    strictly)."""
    stack = contextlib.ExitStack()
    if hasattr(jax, "enable_x64"):  # JAX 0.8 and newer
        stack.enter_context(jax.enable_x64(False))
    else:
        from jax import experimental

        stack.enter_context(experimental.disable_x64())
    stack.enter_context(jax.numpy_dtype_promotion("standard"))
    stack.enter_context(jax.numpy_rank_promotion("allow"))
    return stack


# The XLA flags the suite compiles under: LLVM's optimizations off. Optimizing
# machine code that runs once, on small arrays, is a fifth of the suite's time on
# XLA:CPU (the interpreted kernels are large programs). What the tests check does
# not depend on it: results against references to each dtype's rounding, the
# compiled programs' HLO, bits shared by two programs of one process. The
# cross-process determinism check runs under XLA's defaults, as a user's job does.
SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0"

# How often the suite's processes run Python's cycle collector (``gc.set_threshold``):
# young objects are collected every 50,000 allocations instead of 700, and the
# whole heap once in 2,000 of those collections (the default: once in 100).
# Tracing and lowering the interpreted kernels allocates millions of short-lived
# objects while JAX's caches hold a large heap of long-lived ones, which every
# full collection walks: under the default thresholds the collector took about a
# tenth of the kernels' tests' time. Nothing a test checks depends on when cycles
# are freed; the cross-process determinism check runs with the defaults, as a
# user's job does.
SUITE_GC_THRESHOLDS = (50_000, 20, 100)

# A random search of the suite's properties, run by hand (never in CI):
# ``JAXGRAD_CAMPAIGN=N pytest ...`` draws N times each property's examples, fresh
# ones every run, where CI draws the same few on every run (conftest.py's profile).
# It is how the properties of the kernels, whose examples are few because each
# compiles a kernel, meet the corners their strategies reach but CI's examples
# do not: a run of it, 60 examples each, found a reference that had evaluated
# resample's periodic coordinates directly in float64.
CAMPAIGN = int(os.environ.get("JAXGRAD_CAMPAIGN", "0") or 0)


def examples(n):
    """A property's ``max_examples``: ``n``, or ``JAXGRAD_CAMPAIGN`` times it."""
    return n * max(CAMPAIGN, 1)


def run_script(*args, timeout=600, env=None):
    """``python *args`` from the repository's root in a fresh process, under the
    suite's XLA flags rather than the caller's (a script sets its own device count),
    with ``env`` added to the environment."""
    env = {**os.environ, "XLA_FLAGS": SUITE_XLA_FLAGS, **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
