"""Host-side costs: program size, lowering and compile time, memory, eager calls.

    python benchmarks/host.py [--probes NAME ...] [--timeout 300] [--json FILE]

Each probe runs in a fresh Python process, so that its time, peak memory and
memory growth are its own and no cache of an earlier probe helps it. The peers run
the same probe in their own processes: ``jax.image.resize`` for resample,
``lax.conv_general_dilated`` (``feature_group_count``) for depthwise.

Probes (``--probes`` picks some):

- ``lower_long``: lowering ``resample`` (linear, scale 1.37, half-pixel) of a
  (1, 4194304) array, and ``resample_grad`` of its output, under ``jax.jit``:
  seconds and bytes of StableHLO text.
- ``upsample_1000x``: (1, 65536) resampled 1000x on the last axis, nearest and
  linear, forward and gradient, each compiled and run once under ``jax.jit``:
  seconds in all and the process's peak memory.
- ``grad_64_1000x``: compiling ``resample_grad`` of a 64-element axis upsampled
  1000x (linear).
- ``many_axes``: 24 distinct axes of about 2**20 elements (linear, scale 1.5),
  each lowered and compiled in one process: the growth of its resident memory.
- ``depthwise_3x3``, ``depthwise_5x5``, ``depthwise_7x7``, ``depthwise_11x11``:
  ``jax.grad`` of a loss through ``depthwise_conv2d`` on [8, 64, 64, 32] (SAME,
  float32, NHWC): trace and lower, compile, and the median run time.
- ``depthwise_derivatives``: tracing and lowering ``jax.jit`` of the first three
  derivatives of a 3x3 ``depthwise_conv2d`` loss in its input on [8, 64, 64, 32]
  (the gradient, a Hessian-vector product, the gradient of its sum of squares).
- ``eager_depthwise``: an un-jitted 7x7 ``depthwise_conv2d`` on [1, 512, 512, 8]
  against the same call under ``jax.jit`` (medians after the first call).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

LONG = 4194304
SCALE = 1.37


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _median_ms(fn: Callable[[], Any], repeats: int = 15, warmup: int = 5) -> float:
    import jax

    # The first calls of a program run slower while the allocator settles (a 7x7
    # depthwise gradient: 12, 10, 8, 6 ms, then 5 ms): they are not timed.
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


# --------------------------------------------------------------------------------------
# Resample probes: (forward, gradient) functions for jaxgrad and for jax.image.resize
# --------------------------------------------------------------------------------------


def _resample_fns(impl: str, n: int, scale: float, mode: str) -> tuple[Any, Any, tuple[int, int]]:
    """``fwd(x)`` and ``bwd(dy)`` on a (1, n) array resampled on its last axis."""
    import math

    import jax

    import jaxgrad

    in_shape = (1, n)
    out_shape = (1, math.floor(n * scale))
    if impl == "jaxgrad":
        scales = (1.0, scale)

        def fwd(x):
            return jaxgrad.resample(x, scales, mode=mode)

        def bwd(dy):
            return jaxgrad.resample_grad(dy, in_shape, scales, mode=mode)

    else:
        method = "linear" if mode == "linear" else "nearest"

        def fwd(x):
            return jax.image.resize(x, out_shape, method)

        def bwd(dy):
            return jax.vjp(fwd, jax.numpy.zeros(in_shape, dy.dtype))[1](dy)[0]

    return fwd, bwd, out_shape


def probe_lower_long(impl: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    fwd, bwd, out_shape = _resample_fns(impl, LONG, SCALE, "linear")
    result = {}
    for name, fn, shape in (("forward", fwd, (1, LONG)), ("gradient", bwd, out_shape)):
        spec = jax.ShapeDtypeStruct(shape, jnp.float32)
        seconds, lowered = _timed(lambda fn=fn, spec=spec: jax.jit(fn).lower(spec))
        result[f"{name} lower s"] = seconds
        result[f"{name} text bytes"] = len(lowered.as_text())
    return result


def probe_upsample_1000x(impl: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    start = time.perf_counter()
    for mode in ("nearest", "linear"):
        fwd, bwd, _ = _resample_fns(impl, 65536, 1000.0, mode)
        x = jnp.ones((1, 65536), jnp.float32)
        y = jax.block_until_ready(jax.jit(fwd)(x))
        jax.block_until_ready(jax.jit(bwd)(y))
        del y
    return {"seconds": time.perf_counter() - start, "peak bytes": _peak_bytes()}


def probe_grad_64_1000x(impl: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    _, bwd, out_shape = _resample_fns(impl, 64, 1000.0, "linear")
    spec = jax.ShapeDtypeStruct(out_shape, jnp.float32)
    lower_s, lowered = _timed(lambda: jax.jit(bwd).lower(spec))
    compile_s, _ = _timed(lowered.compile)
    return {"lower s": lower_s, "compile s": compile_s}


def probe_many_axes(impl: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    before = _rss_bytes()
    start = time.perf_counter()
    for k in range(24):
        fwd, _, _ = _resample_fns(impl, 2**20 + 7 * k, 1.5, "linear")
        jax.jit(fwd).lower(jax.ShapeDtypeStruct((1, 2**20 + 7 * k), jnp.float32)).compile()
    return {"seconds": time.perf_counter() - start, "growth bytes": _rss_bytes() - before}


# --------------------------------------------------------------------------------------
# Depthwise probes
# --------------------------------------------------------------------------------------


def _depthwise_fn(impl: str) -> Callable[[Any, Any], Any]:
    from jax import lax

    import jaxgrad

    if impl == "jaxgrad":
        return lambda x, f: jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME")

    def conv(x, f):
        fh, fw, c, m = f.shape
        return lax.conv_general_dilated(
            x,
            f.reshape(fh, fw, 1, c * m),
            (1, 1),
            "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=c,
        )

    return conv


def _probe_depthwise_grad(impl: str, k: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    conv = _depthwise_fn(impl)
    grad = jax.jit(jax.grad(lambda x, f: jnp.sum(conv(x, f) ** 2), argnums=(0, 1)))
    x = jax.random.normal(jax.random.key(0), (8, 64, 64, 32), jnp.float32)
    f = jax.random.normal(jax.random.key(1), (k, k, 32, 1), jnp.float32)
    lower_s, lowered = _timed(lambda: grad.lower(x, f))
    compile_s, compiled = _timed(lowered.compile)
    return {
        "lower s": lower_s,
        "compile s": compile_s,
        "run ms": _median_ms(lambda: compiled(x, f)),
    }


def probe_depthwise_derivatives(impl: str) -> dict[str, Any]:
    """Tracing and lowering ``jax.jit`` of derivatives of a 3x3 depthwise loss of
    each order, in the input (the filter fixed): the gradient, a Hessian-vector
    product, and the gradient of that product's sum of squares."""
    import jax
    import jax.numpy as jnp

    conv = _depthwise_fn(impl)
    x = jax.random.normal(jax.random.key(0), (8, 64, 64, 32), jnp.float32)
    f = jax.random.normal(jax.random.key(1), (3, 3, 32, 1), jnp.float32)
    v = jax.random.normal(jax.random.key(2), x.shape, jnp.float32)
    first = jax.grad(lambda x: jnp.sum(jnp.tanh(conv(x, f)) ** 2))
    second = jax.grad(lambda x: jnp.vdot(first(x), v))
    third = jax.grad(lambda x: jnp.sum(second(x) ** 2))
    result = {}
    for order, derivative in enumerate((first, second, third), start=1):
        jax.clear_caches()  # each from scratch, not from the traces of the order before
        jitted = jax.jit(derivative)
        result[f"order {order} trace s"], traced = _timed(lambda jitted=jitted: jitted.trace(x))
        result[f"order {order} lower s"], _ = _timed(traced.lower)
    return result


def probe_eager_depthwise(impl: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    conv = _depthwise_fn(impl)
    x = jax.random.normal(jax.random.key(0), (1, 512, 512, 8), jnp.float32)
    f = jax.random.normal(jax.random.key(1), (7, 7, 8, 1), jnp.float32)
    first_s, _ = _timed(lambda: jax.block_until_ready(conv(x, f)))
    eager = _median_ms(lambda: conv(x, f))
    jitted = _median_ms(lambda: jax.jit(conv)(x, f))
    return {"first call s": first_s, "eager ms": eager, "jit ms": jitted}


PROBES = {
    "lower_long": (probe_lower_long, "jax.image.resize"),
    "upsample_1000x": (probe_upsample_1000x, "jax.image.resize"),
    "grad_64_1000x": (probe_grad_64_1000x, "jax.image.resize"),
    "many_axes": (probe_many_axes, "jax.image.resize"),
    "depthwise_3x3": (functools.partial(_probe_depthwise_grad, k=3), "lax"),
    "depthwise_5x5": (functools.partial(_probe_depthwise_grad, k=5), "lax"),
    "depthwise_7x7": (functools.partial(_probe_depthwise_grad, k=7), "lax"),
    "depthwise_11x11": (functools.partial(_probe_depthwise_grad, k=11), "lax"),
    "depthwise_derivatives": (probe_depthwise_derivatives, "lax"),
    "eager_depthwise": (probe_eager_depthwise, "lax"),
}


# --------------------------------------------------------------------------------------
# Driver: every (probe, implementation) in its own process
# --------------------------------------------------------------------------------------


def _run_in_process(name: str, impl: str, timeout: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, impl]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"error": f"exit {done.returncode}: {last[:120]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _format(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if key.endswith("bytes"):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:.1f} {unit}"
        return f"{value} B"
    if key.endswith(" s") or key == "seconds":
        return f"{value:.2f} s"
    return f"{value:.2f} ms" if key.endswith(" ms") else str(value)


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--probes", nargs="+", choices=sorted(PROBES), default=list(PROBES))
    args.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    args.add_argument("--json", help="also write the figures to this file")
    args.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = args.parse_args()
    if opts.child:
        name, impl = opts.child
        print(json.dumps(PROBES[name][0](impl)))
        return
    import jax

    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs; each probe in a fresh process\n")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    print("| probe | figure | jaxgrad | peer |")
    print("| --- | --- | ---: | ---: |")
    for name in opts.probes:
        peer = PROBES[name][1]
        ours, theirs = (_run_in_process(name, impl, opts.timeout) for impl in ("jaxgrad", peer))
        results[name] = {"jaxgrad": ours, peer: theirs}
        for key in dict.fromkeys([*ours, *theirs]):
            mine = _format(key, ours.get(key, ""))
            print(f"| {name} | {key} | {mine} | {_format(key, theirs.get(key, ''))} ({peer}) |")
        sys.stdout.flush()
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
