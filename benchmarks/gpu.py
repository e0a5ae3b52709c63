"""jaxgrad on a CUDA GPU: correctness, reproducibility across processes, speed.

    python benchmarks/gpu.py [--json docs/data/gpu.json] [--skip-determinism]
                             [--sections determinism depthwise resample train]
                             [--cases SUBSTRING ...] [--dtypes ...] [--layouts ...]
                             [--skip-xla-timing] [--threads N]

One command. Most of its time is compiling: every program it times is compiled
once, checked and timed, and jaxgrad's programs compile side by side
(``--threads``; the programs XLA tunes on the device as it compiles them, the
peers', one at a time).
``--sections``, ``--cases``, ``--dtypes``, ``--layouts`` and ``--skip-xla-timing``
cut a run into parts that fit a time limit; each section's seconds, and each
timed row's (its compiles included), are printed and kept in the JSON, so that a
run shows where its minutes go, with a row's seconds divided into phases
(jaxgrad's programs, the float64 references, the checks, PyTorch's operands, the
peers and the timed rounds) and summed by phase under the tables. It prints (and
writes as JSON):

1. The machine: device, driver, and the versions of JAX, jaxlib, PyTorch, Triton.
2. Reproducibility: tests/determinism_check.py --size large in three fresh
   processes, compared digest by digest (every op of every family). The
   processes start first and run beside the float16 checks.
3. Correctness, as the relative error ||got - want|| / ||want|| against a float64
   reference (the portable implementation in float64 on the same rounded
   operands, which the test suite checks against a loop that follows the
   definition): in the timed dtypes, of every timed program of jaxgrad's on the
   timed arrays (resample's on their batch's first and last entries); in
   float16, checked but not timed, of both implementations on small arrays of
   every case.
4. Speed of each depthwise op, and of the forward op's backward (both gradients
   at once): jaxgrad (default, "xla", "pallas"), lax and its VJPs (cuDNN), PyTorch
   CUDA (the faster of NCHW and channels_last), against the copy roofline: the
   bytes the op must read and write over a measured device copy.
5. Speed of resample and its gradient: jaxgrad (default, "xla", "pallas"),
   ``jax.image.resize`` and its VJP, PyTorch CUDA's ``interpolate`` and its
   backward (in the layout's memory format), against the copy roofline.
6. The example U-Net's training step at batch 64 of 128x128, jaxgrad against stock
   ops; and jaxgrad with its resampling in "xla", which says whether the
   default's choice pays in a step, and with none of its depthwise kernels
   walking their columns (the NHWC filter gradient walks a 3x3 filter's), which
   says whether the walks pay in a step.

Times are medians over rounds of 10 back-to-back calls followed by one sync, so
launch gaps overlap as they do in a training loop; the implementations of one case
are timed in interleaved rounds, and their ratios are what to read. Calls that
lower to the same program are compiled, checked and timed once and show the same
time: on a GPU, the default and the implementation it picks (their programs are
compared canonicalized, without the constants of the branch the default leaves
out there, which XLA discards).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.mlir import ir, passmanager

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import jaxgrad  # noqa: E402
from jaxgrad._depthwise import _pallas as depthwise_kernels  # noqa: E402


def x64(enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """A context with float64 on or off: ``jax.enable_x64`` from JAX 0.8, its
    experimental predecessor before."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(enabled)  # type: ignore[no-any-return]
    from jax import experimental

    return experimental.enable_x64() if enabled else experimental.disable_x64()


CASES = [
    # name, (N, H, W, C), (fh, fw, M), stride
    ("[32,112,112,96] 3x3 s1", (32, 112, 112, 96), (3, 3, 1), 1),
    ("[32,112,112,96] 3x3 s2", (32, 112, 112, 96), (3, 3, 1), 2),
    ("[32,56,56,192] 5x5 s1", (32, 56, 56, 192), (5, 5, 1), 1),
    ("[32,112,112,32] 3x3 s1 M2", (32, 112, 112, 32), (3, 3, 2), 1),
]
LAYOUTS = ["NHWC", "NCHW"]
DTYPES = ["bfloat16", "float32"]  # timed
CHECKED_DTYPES = [*DTYPES, "float16"]  # checked against float64
# The three ops, and the forward op's backward: both gradients, as jax.grad computes them.
OPS = ("forward", "backprop_input", "backprop_filter", "backward")
IMPLEMENTATIONS = {"default": None, "xla": "xla", "pallas": "pallas"}
RESAMPLE_LAYOUTS = {
    # layout: (shape, resampled axes)
    "NCHW": ((32, 64, 256, 256), (2, 3)),
    "NHWC": ((32, 256, 256, 64), (1, 2)),
}
RESAMPLE_SCALES = (2.0, 0.5, 1.7)
RESAMPLE_VOLUME = ("NCDHW", (4, 32, 64, 64, 64), (2, 3, 4))  # linear 2x only
SECTIONS = ("determinism", "depthwise", "resample", "train")
# Where the PyTorch peers run: the GPU; the CPU in a smoke run, which checks their code.
TORCH_DEVICE = "cuda"
# How many of jaxgrad's programs compile at once (``--threads``).
THREADS = os.cpu_count() or 1


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def _sync(out: Any) -> None:
    for leaf in jax.tree.leaves(out):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()


def failure(error: Exception) -> str:
    """An error in one line, for a run that notes it and goes on."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line[:160]}"


def first_result(call: Callable[[], Any]) -> Any:
    """A call's result, synced, or the exception it raised."""
    try:
        out = call()
        _sync(out)
        return out
    except Exception as error:  # noted by the caller, which goes on
        return error


def side_by_side(calls: dict[Hashable, Callable[[], Any]]) -> dict[Hashable, Any]:
    """Each zero-argument call's ``first_result``, the calls made from ``THREADS``
    threads: their first calls compile side by side (XLA and Triton compile
    without holding Python's lock). For programs whose compile times nothing on
    the device (``tuned_by_timing``), or whose times are not taken."""
    with ThreadPoolExecutor(max(1, min(THREADS, len(calls)))) as pool:
        return dict(zip(calls, pool.map(first_result, calls.values()), strict=True))


# The custom call a Pallas Triton kernel lowers to.
KERNEL_CALL = "__gpu$xla.gpu.triton"
# What XLA:GPU compiles by timing candidates on the device: a convolution (cuDNN's
# algorithm), a matrix product (its kernel) and a reduction (its tiles).
TUNED_OPS = re.compile(r"stablehlo\.(convolution|dot_general|dot|reduce|reduce_window)\b")
CUSTOM_CALL = re.compile(r"stablehlo\.custom_call @([^\s(]+)")


def tuned_by_timing(call: Callable[[], Any]) -> bool:
    """Whether XLA may pick parts of the call's program by running them on the GPU
    as it compiles it, so that another compile beside it would skew what it picks:
    on a GPU, a program with a convolution, a matrix product, a reduction or a
    custom call other than a Pallas kernel (a library's, tuned its own way), and
    any call that is no JAX program (PyTorch's). jaxgrad's programs, kernels and
    the portable implementation alike, hold none of them on a GPU: their sums
    are elementwise adds in a fixed order or run inside the kernels."""
    if jax.default_backend() != "gpu":
        return False
    text = _stablehlo(call)
    if text is None or TUNED_OPS.search(text):
        return True
    return any(target != KERNEL_CALL for target in CUSTOM_CALL.findall(text))


def first_results(calls: dict[Hashable, Callable[[], Any]]) -> dict[Hashable, Any]:
    """Each call's ``first_result``. A call of the same program as an earlier call
    (``same_programs``) is not made: it gets that call's result. The programs XLA
    compiles as written compile side by side, then those it tunes by timing, one
    at a time."""
    twins = same_programs(calls)
    made = {key: call for key, call in calls.items() if key not in twins}
    alone = {key: call for key, call in made.items() if tuned_by_timing(call)}
    results = side_by_side({key: call for key, call in made.items() if key not in alone})
    results |= {key: first_result(call) for key, call in alone.items()}
    return {key: results[twins.get(key, key)] for key in calls}


# Two programs that differ only in what XLA discards unread (on a GPU, the default
# carries the constants of the portable branch that the platform's choice leaves
# out) are one program once MLIR canonicalizes them and drops unused functions.
CANONICAL = "builtin.module(canonicalize,symbol-dce)"


# Each call's canonical StableHLO, for as long as the call lives: ``first_results``
# and ``rounds_ms`` both ask for it, and canonicalizing a large portable program
# takes a tenth of a second or more.
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stablehlo(call: Callable[[], Any]) -> str | None:
    """The canonical StableHLO (``canonical``) of a jitted function bound to its
    arguments by ``partial``, None for any other call (PyTorch's, a compiled
    program) and for one that fails to lower (``rounds_ms`` reports it where it
    calls it). Its trace and lowering are cached, and its first call reuses them."""
    fn = getattr(call, "func", None)
    if not isinstance(call, partial) or not hasattr(fn, "lower"):
        return None
    if call not in _PROGRAMS:
        try:
            module = fn.lower(*call.args, **call.keywords).compiler_ir("stablehlo")
            _PROGRAMS[call] = canonical(module)
        except Exception:
            _PROGRAMS[call] = None
    return _PROGRAMS[call]


def canonical(module: ir.Module) -> str:
    """A lowered program's StableHLO, canonicalized (``CANONICAL``), as text."""
    with module.context:  # a copy: the lowered module is the one its call compiles
        copy = ir.Module.parse(str(module))
        passmanager.PassManager.parse(CANONICAL).run(copy.operation)
    return str(copy)


def same_programs(calls: dict[Hashable, Callable[[], Any]]) -> dict[Hashable, Hashable]:
    """Each call whose program is the same as an earlier call's (``_stablehlo``),
    with the earlier call's key: a variant that changes nothing on this platform,
    say (on the CPU, the default and "xla"; on a GPU, the default and the kernels
    where it picks them)."""
    first: dict[str, Hashable] = {}
    twins = {}
    for key, call in calls.items():
        text = _stablehlo(call)
        if text is not None and first.setdefault(text, key) != key:
            twins[key] = first[text]
    return twins


class Stopwatch:
    """Wall seconds between laps: what each timed row of a run cost, compiles
    included, so that a run shows where its minutes go; and, within a lap, the
    seconds of each named phase (``phase``)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Counts the block's seconds to the phase ``name`` of the current lap."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - start

    def lap(self) -> tuple[float, dict[str, float]]:
        """The seconds since the last lap (or the start), and those of each phase
        among them."""
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        phases, self._phases = self._phases, {}
        return seconds, phases


def rounds_ms(calls: dict[str, Callable[[], Any]], rounds: int, per_round: int = 10) -> dict:
    """Median milliseconds per call of each zero-argument call: ``per_round`` calls
    back to back, one sync, in interleaved rounds (first call compiles, untimed;
    each batch follows an untimed call and sync of its own).
    A call that fails in its untimed calls is left out of the rounds and given
    NaN, its error printed: one failing peer must not end a GPU run. Calls of
    the same program (``same_programs``) are compiled and timed once and share
    its time: two timings of one program would differ by noise alone."""
    order, twins = list(calls), same_programs(calls)
    for name, original in twins.items():
        print(f"    {name}: the program of {original}, timed once", flush=True)
    calls = {name: call for name, call in calls.items() if name not in twins}
    syncs = {name: _torch_sync if name.startswith("torch") else _sync for name in calls}
    failed = []
    for name, call in calls.items():
        try:
            for _ in range(2):
                syncs[name](call())
        except Exception as error:  # whatever the failure, the others are still timed
            print(f"    {name} failed: {failure(error)}", flush=True)
            failed.append(name)
    names = [name for name in calls if name not in failed]
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds if names else 0):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            # Each batch follows an untimed call of its own: the first call after
            # another program can run slower, and the rotation would charge that
            # to whichever call follows the slowest (a PyTorch peer, often).
            syncs[name](calls[name]())
            start = time.perf_counter()
            for _ in range(per_round):
                out = calls[name]()
            syncs[name](out)
            times[name].append((time.perf_counter() - start) / per_round)
    ms = {
        name: math.nan if name in failed else 1e3 * statistics.median(times[name]) for name in calls
    }
    return {name: ms[twins.get(name, name)] for name in order}


def _torch_sync(out: Any) -> None:
    import torch

    if TORCH_DEVICE == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(size: int = 2**28) -> float:
    """Bytes per second a device copy of ``size`` float32 words moves (read + write)."""
    a = jnp.ones((size,), jnp.float32)
    copy = jax.jit(lambda a: a + 0)
    ms = rounds_ms({"copy": partial(copy, a)}, rounds=10)["copy"]
    return 2 * a.nbytes / (ms / 1e3)


# --------------------------------------------------------------------------------------
# The ops and their peers
# --------------------------------------------------------------------------------------


def jaxgrad_ops(fmt: str, x_shape: tuple, f_shape: tuple, stride: int, impl: str | None) -> dict:
    kw = dict(data_format=fmt, implementation=impl)
    s = (stride, stride)
    return {
        "forward": jax.jit(lambda x, f: jaxgrad.depthwise_conv2d(x, f, s, "SAME", **kw)),
        "backprop_input": jax.jit(
            lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(x_shape, f, dy, s, "SAME", **kw)
        ),
        "backprop_filter": jax.jit(
            lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(x, f_shape, dy, s, "SAME", **kw)
        ),
        "backward": jax.jit(
            lambda x, f, dy: jax.vjp(
                lambda x, f: jaxgrad.depthwise_conv2d(x, f, s, "SAME", **kw), x, f
            )[1](dy)
        ),
    }


def lax_ops(fmt: str, c: int, m: int, stride: int) -> dict:
    def conv(x, f):
        w = f.reshape(*f.shape[:2], 1, c * m)
        dn = (fmt, "HWIO", fmt)
        return lax.conv_general_dilated(
            x, w, (stride, stride), "SAME", dimension_numbers=dn, feature_group_count=c
        )

    return {
        "forward": jax.jit(conv),
        "backprop_input": jax.jit(lambda x, f, dy: jax.vjp(lambda x: conv(x, f), x)[1](dy)[0]),
        "backprop_filter": jax.jit(lambda x, f, dy: jax.vjp(lambda f: conv(x, f), f)[1](dy)[0]),
        "backward": jax.jit(lambda x, f, dy: jax.vjp(conv, x, f)[1](dy)),
    }


def torch_ops(torch: Any, x: np.ndarray, f: np.ndarray, dy: np.ndarray, stride: int, dtype: str):
    """Each op as a zero-argument call per memory format (NCHW, channels_last)."""
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    fh, fw, c, m = f.shape
    w = torch.tensor(
        np.ascontiguousarray(np.transpose(f.reshape(fh, fw, c * m), (2, 0, 1))[:, None])
    )
    w = w.to(TORCH_DEVICE, tdtype)
    pad = [(fh - 1) // 2, (fw - 1) // 2]
    aten, conv2d = torch.ops.aten, torch.nn.functional.conv2d
    out = {}
    for memory in ("NCHW", "channels_last"):
        fmt = torch.channels_last if memory == "channels_last" else torch.contiguous_format
        tx, tdy = (
            torch.tensor(np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2))))
            .to(TORCH_DEVICE, tdtype)
            .contiguous(memory_format=fmt)
            for a in (x, dy)
        )
        tw = w.contiguous(memory_format=fmt)
        args = (tdy, tx, tw, None, [stride] * 2, pad, [1, 1], False, [0, 0], c)
        out[memory] = {
            "forward": partial(conv2d, tx, tw, None, stride, pad, 1, c),
            "backprop_input": partial(aten.convolution_backward, *args, [True, False, False]),
            "backprop_filter": partial(aten.convolution_backward, *args, [False, True, False]),
            "backward": partial(aten.convolution_backward, *args, [True, True, False]),
        }
    return out


def in_layout(a: np.ndarray, fmt: str) -> np.ndarray:
    """An NHWC array ``a`` in the layout ``fmt`` (NHWC or NCHW)."""
    return np.transpose(a, (0, 3, 1, 2)) if fmt == "NCHW" else a


def nbytes(*arrays: Any) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays)


# --------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------


def relative_error(got: Any, want: np.ndarray) -> float:
    """``||got - want|| / ||want||`` in float64 on the host, or NaN where ``got``
    is the exception its call raised (printed): the run goes on to the next."""
    if failed(got):
        print(f"    failed: {failure(got)}", flush=True)
        return math.nan
    got = np.asarray(got, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@jax.jit
def _relative_error_on_device(got: jax.Array, want: jax.Array) -> jax.Array:
    return jnp.linalg.norm(got.astype(want.dtype) - want) / jnp.linalg.norm(want)


def relative_error_on_device(got: Any, want: Any) -> float:
    """``relative_error`` of a timed program's result against its float64
    reference, on the device where the result is; NaN where either is the
    exception its call raised (printed)."""
    for result in (got, want):
        if failed(result):
            print(f"    failed: {failure(result)}", flush=True)
            return math.nan
    with x64(True):
        return float(_relative_error_on_device(got, want))


def float64_result(reference: Callable[..., Any], *operands: Any) -> Any:
    """The float64 reference of a timed result: ``reference`` (the portable
    implementation, which the test suite checks against a loop that follows the
    definition) on ``operands`` (the timed arrays, rounded to their dtype) in
    float64 on the CPU, moved to the default device to meet the timed result
    there; or the exception it raised."""
    with x64(True):
        wide = [np.asarray(a, np.float64) for a in operands]
        with jax.default_device(jax.devices("cpu")[0]):
            result = first_result(partial(reference, *wide))
        return result if failed(result) else jax.device_put(result, jax.devices()[0])


def environment() -> dict:
    import jaxlib

    env = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": sys.version.split()[0],
    }
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        env["driver"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    except OSError:
        env["driver"] = "unknown"
    for name in ("torch", "triton"):
        try:
            env[name] = __import__(name).__version__
        except ImportError:
            env[name] = None
    return env


def untimed_dtypes() -> list[str]:
    """The dtypes checked but not timed (float16): checked on small arrays."""
    return [dtype for dtype in CHECKED_DTYPES if dtype not in DTYPES]


def correctness(rng: np.random.Generator) -> list[dict]:
    """Relative errors of both implementations in the dtypes checked but not timed
    (``untimed_dtypes``), against float64 on the CPU, on 4 images of each case.
    The reference is the portable implementation in float64, which the test suite
    checks against a loop that follows the definition. (The timed dtypes are
    checked on the timed programs themselves: ``speed``.)"""
    cpu = jax.devices("cpu")[0]
    rows = []
    for name, (_, h, w, c), (fh, fw, m), stride in CASES:
        x = rng.normal(size=(4, h, w, c)).astype(np.float32)
        f = rng.normal(size=(fh, fw, c, m)).astype(np.float32)
        oh, ow = -(-h // stride), -(-w // stride)
        dy = rng.normal(size=(4, oh, ow, c * m)).astype(np.float32)
        # One set of reference programs for every dtype: compiled once.
        reference = jaxgrad_ops("NHWC", x.shape, f.shape, stride, "xla")
        for dtype in untimed_dtypes():
            # The reference sees the rounded operands: only the computation's error remains.
            xr, fr, dyr = (np.asarray(jnp.asarray(a, dtype), np.float64) for a in (x, f, dy))
            with jax.default_device(cpu), x64(True):
                ref = {
                    k: np.asarray(v(*a))
                    for k, v, a in _named(reference, xr, fr, dyr)
                    if k != "backward"  # checked against the two gradient ops
                }
            calls = {}
            for fmt in LAYOUTS:
                xj, fj, dyj = (
                    jnp.asarray(in_layout(x, fmt), dtype),
                    jnp.asarray(f, dtype),
                    jnp.asarray(in_layout(dy, fmt), dtype),
                )
                for label in ("xla", "pallas"):  # the default is one of them
                    ops = jaxgrad_ops(fmt, xj.shape, fj.shape, stride, label)
                    for op, fn, args in _named(ops, xj, fj, dyj):
                        calls[fmt, label, op] = partial(fn, *args)
            # Nothing here is timed: every program compiles side by side.
            for (fmt, label, op), out in side_by_side(calls).items():
                for part, got, ref_op in _parts(op, out):
                    if fmt == "NCHW" and ref_op != "backprop_filter" and not failed(got):
                        got = np.transpose(np.asarray(got), (0, 2, 3, 1))
                    err = relative_error(got, ref[ref_op])
                    rows.append(
                        dict(case=name, layout=fmt, dtype=dtype, impl=label, op=part, error=err)
                    )
                    print(
                        f"  {name:<28} {fmt} {dtype:<9} {label:<8} {part:<16} {err:.2e}",
                        flush=True,
                    )
    return rows


def failed(result: Any) -> bool:
    """Whether a result of ``side_by_side`` is the exception its call raised."""
    return isinstance(result, Exception)


def _named(ops: dict, x: Any, f: Any, dy: Any):
    args = {
        "forward": (x, f),
        "backprop_input": (f, dy),
        "backprop_filter": (x, dy),
        "backward": (x, f, dy),
    }
    return [(op, ops[op], args[op]) for op in OPS]


def _parts(op: str, out: Any) -> list[tuple[str, Any, str]]:
    """(name, result, reference op) of each result ``op`` gave: the backward's two
    gradients are checked one by one (a failure, for both)."""
    if op != "backward":
        return [(op, out, op)]
    input_grad, filter_grad = (out, out) if failed(out) else out
    return [
        ("backward: input", input_grad, "backprop_input"),
        ("backward: filter", filter_grad, "backprop_filter"),
    ]


def checked(
    results: dict[tuple[str, str], Any],
    want: dict[str, jax.Array],
    parts: Callable[[str, Any], list[tuple[str, Any, str]]] = lambda op, out: [(op, out, op)],
    **where: str,
) -> Iterator[dict]:
    """The correctness rows of a case's timed programs: the relative error of each
    result (keyed by op and implementation, split into ``parts``) against its
    float64 reference ``want``; printed as it is computed."""
    for (op, label), out in results.items():
        for name, got, reference_op in parts(op, out):
            err = relative_error_on_device(got, want[reference_op])
            print(f"  {' '.join(where.values())} {label:<8} {name:<16} {err:.2e}", flush=True)
            yield dict(**where, impl=label, op=name, error=err)


def start_determinism(processes: int = 3) -> list[subprocess.Popen]:
    """Starts tests/determinism_check.py --size large in ``processes`` fresh
    processes, under the default XLA flags (``finish_determinism`` compares them).

    The processes run side by side, sharing the GPU as a machine's processes do:
    each still compiles (and autotunes) every program anew, its programs side by
    side on the machine's cores, and the check takes the time of one process, not
    of all of them. The float16 checks run meanwhile:
    they time nothing, and the work beside them, if anything, gives the
    autotuner's timings more to vary.
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    command = [sys.executable, str(ROOT / "tests" / "determinism_check.py"), "--size", "large"]
    return [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(processes)
    ]


def finish_determinism(started: list[subprocess.Popen]) -> dict:
    """The bit patterns of every case in the processes ``start_determinism``
    started; a process that fails is reported with its error's last lines."""
    finished = [(process, *process.communicate()) for process in started]
    runs = []
    for process, stdout, stderr in finished:
        if process.returncode != 0:
            tail = stderr.strip().splitlines()[-5:]
            print("  a process failed:", *tail, sep="\n    ", flush=True)
            return {"processes": len(started), "failed": "\n".join(tail)}
        runs.append(dict(line.rsplit(" ", 1) for line in stdout.splitlines()))
    cases = {name: len({run[name] for run in runs}) for name in runs[0]}
    for name, patterns in cases.items():
        print(f"  {name:<40} {'identical' if patterns == 1 else f'{patterns} bit patterns'}")
    return {"processes": len(started), "bit_patterns": cases}


def speed(rng: np.random.Generator, bandwidth: float, rounds: int, torch: Any) -> Iterator[tuple]:
    """Each depthwise case's rows, as they are measured: ``("correctness", row)``,
    the relative error of each timed program's result against float64
    (``float64_result``), and ``("speed", row)``, the times of one op.

    jaxgrad's programs of a case, layout and dtype compile first (side by side:
    ``first_results``), then each op's peers one at a time, as they are timed. A
    speed row's ``seconds`` are the wall time since the row before it: the first
    op's of a case, layout and dtype hold jaxgrad's compiles and checks too, and
    its ``phases`` say how they divide: jaxgrad's programs (compiled and run
    once), the float64 references, the checks, PyTorch's operands, and the peers'
    compiles with the timed rounds."""
    since = Stopwatch()
    for name, (n, h, w, c), (fh, fw, m), stride in CASES:
        x = rng.normal(size=(n, h, w, c)).astype(np.float32)
        f = rng.normal(size=(fh, fw, c, m)).astype(np.float32)
        oh, ow = -(-h // stride), -(-w // stride)
        dy = rng.normal(size=(n, oh, ow, c * m)).astype(np.float32)
        # The float64 references' programs, one per layout, compiled once for every dtype.
        references = {
            fmt: jaxgrad_ops(fmt, in_layout(x, fmt).shape, f.shape, stride, "xla")
            for fmt in LAYOUTS
        }
        for dtype in DTYPES:
            with since.phase("PyTorch's operands"):
                theirs = torch_ops(torch, x, f, dy, stride, dtype) if torch else {}
            for fmt in LAYOUTS:
                xj, fj, dyj = (
                    jnp.asarray(in_layout(x, fmt), dtype),
                    jnp.asarray(f, dtype),
                    jnp.asarray(in_layout(dy, fmt), dtype),
                )
                ours = {}
                for label, impl in IMPLEMENTATIONS.items():
                    for op, fn, args in _named(
                        jaxgrad_ops(fmt, xj.shape, fj.shape, stride, impl), xj, fj, dyj
                    ):
                        ours[op, label] = partial(fn, *args)
                with since.phase("jaxgrad's programs"):
                    results = first_results(ours)
                # The reference sees the rounded operands: only the computation's error remains.
                with since.phase("float64 references"):
                    want = {
                        op: float64_result(fn, *args)
                        for op, fn, args in _named(references[fmt], xj, fj, dyj)
                        if op != "backward"  # checked against the two gradient ops
                    }
                with since.phase("checks"):
                    where = dict(case=name, layout=fmt, dtype=dtype)
                    rows = list(checked(results, want, _parts, **where))
                for row in rows:
                    yield "correctness", row
                del results, want  # the device memory the timings may need
                peer = lax_ops(fmt, c, m, stride)
                moved = {
                    "forward": nbytes(xj, fj, dyj),
                    "backprop_input": nbytes(fj, dyj, xj),
                    "backprop_filter": nbytes(xj, dyj, fj),
                    "backward": nbytes(xj, fj, dyj, xj, fj),
                }
                for op in OPS:
                    calls = {f"jaxgrad {label}": ours[op, label] for label in IMPLEMENTATIONS}
                    lax_args = (xj, fj) if op == "forward" else (xj, fj, dyj)
                    calls["lax"] = partial(peer[op], *lax_args)
                    for memory, ops in theirs.items():
                        calls[f"torch {memory}"] = ops[op]
                    with since.phase("peers and rounds"):
                        ms = rounds_ms(calls, rounds)
                    torch_ms = min(
                        (v for k, v in ms.items() if k.startswith("torch") and not math.isnan(v)),
                        default=None,
                    )
                    roof = 1e3 * moved[op] / bandwidth
                    row = dict(
                        case=name,
                        layout=fmt,
                        dtype=dtype,
                        op=op,
                        roofline=roof,
                        torch=torch_ms,
                        **ms,
                    )
                    peers = [
                        v for v in (ms["lax"], torch_ms) if v is not None and not math.isnan(v)
                    ]
                    best_peer = min(peers, default=math.nan)
                    row["default_over_best_peer"] = ms["jaxgrad default"] / best_peer
                    row["seconds"], row["phases"] = since.lap()
                    print(
                        f"  {name:<28} {fmt} {dtype:<8} {op:<16} roof {roof:.3f}  "
                        + "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
                        + f"  default/best peer {row['default_over_best_peer']:.2f}"
                        + f"  ({row['seconds']:.0f} s)",
                        flush=True,
                    )
                    yield "speed", row


def resampling_in_xla(unet: Any) -> Any:
    """The example U-Net's jaxgrad ops with its resampling in "xla", which XLA can
    fuse with the ops around it, where the default may take the kernel."""
    return dataclasses.replace(
        unet.JAXGRAD,
        down=lambda x: jaxgrad.resample(x, (1, 0.5, 0.5, 1), mode="linear", implementation="xla"),
        up=lambda x: jaxgrad.resample(x, (1, 2, 2, 1), mode="linear", implementation="xla"),
    )


def launches_with(module: Any, fields: dict[str, Any]) -> Any:
    """A patch that gives every kernel of ``module`` (a family's ``_pallas``) the
    launch it picks, with ``fields`` replaced."""
    chosen = module._launch

    def launch(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(chosen(*args, **kwargs), **fields)

    return mock.patch.object(module, "_launch", launch)


def compiled_with_columns_tiled(fn: Callable, *args: Any) -> Callable[[], Any]:
    """``fn(*args)`` compiled with no depthwise kernel walking its rows' columns
    (``_Launch.walk_columns``), where the library's launches walk some. JAX's
    caches are cleared on both sides, so that no trace outlives the launch it
    was made under."""
    jax.clear_caches()
    try:
        with launches_with(depthwise_kernels, {"walk_columns": False}):
            compiled = jax.jit(fn).lower(*args).compile()
    finally:
        jax.clear_caches()
    return partial(compiled, *args)


def train_step(rounds: int, batch: int = 64, size: int = 128) -> dict:
    """The U-Net step with jaxgrad's ops and with stock ones; with jaxgrad's
    resampling in "xla", which says whether the default's choice pays; and with
    no depthwise kernel walking its columns, which says whether the walks pay."""
    import unet

    params = unet.init_params(jax.random.key(0))
    noisy, clean = unet.make_batch(jax.random.key(1), batch, size)
    opt = unet.adam_init(params)
    tiled = compiled_with_columns_tiled(unet.train_step, params, opt, noisy, clean)
    calls = {}
    variants = {
        "jaxgrad": unet.JAXGRAD,
        "stock": unet.STOCK,
        "jaxgrad, resample xla": resampling_in_xla(unet),
    }
    for name, ops in variants.items():
        step = jax.jit(lambda p, o, x, y, ops=ops: unet.train_step(p, o, x, y, ops))
        calls[name] = partial(step, params, opt, noisy, clean)
    calls["jaxgrad, columns tiled"] = tiled
    ms = rounds_ms(calls, rounds)
    print(
        f"  batch {batch} of {size}x{size}: jaxgrad {ms['jaxgrad']:.2f} ms, "
        f"stock {ms['stock']:.2f} ms, speed-up {ms['stock'] / ms['jaxgrad']:.2f}x; "
        f"resampling in xla {ms['jaxgrad, resample xla']:.2f} ms; "
        f"columns tiled {ms['jaxgrad, columns tiled']:.2f} ms"
    )
    return dict(batch=batch, size=size, **ms)


# --------------------------------------------------------------------------------------
# Resample
# --------------------------------------------------------------------------------------


def chosen(name: str, only: Sequence[str]) -> bool:
    """Whether the case ``name`` is asked for: every case if ``only`` is empty, else
    those whose name contains one of ``only`` (``--cases``)."""
    return not only or any(part in name for part in only)


def resample_cases(smoke: bool, only: Sequence[str] = ()):
    """(layout, shape, resampled axes, mode, scale) of every timed case, or of those
    whose name (``[32, 256, 256, 64] NHWC linear 2.0x``) contains one of ``only``."""
    cases = [
        (layout, shape, axes, mode, scale)
        for layout, (shape, axes) in RESAMPLE_LAYOUTS.items()
        for mode in ("nearest", "linear")
        for scale in RESAMPLE_SCALES
    ]
    cases.append((*RESAMPLE_VOLUME, "linear", 2.0))
    if smoke:  # linear 2x in NHWC and in 3-D, on tiny arrays
        small = {4: (2, 8, 8, 4), 5: (1, 2, 4, 4, 4)}
        cases = [(lay, small[len(sh)], ax, m, s) for lay, sh, ax, m, s in cases]
        cases = [c for c in cases if c[0] != "NCHW" and c[3:] == ("linear", 2.0)]
    return [c for c in cases if chosen(resample_case_name(*c[:2], *c[3:]), only)]


def resample_case_name(layout: str, shape: tuple, mode: str, scale: float) -> str:
    return f"{list(shape)} {layout} {mode} {scale}x"


def resample_shapes(shape: tuple, axes: tuple, scale: float) -> tuple[tuple, tuple]:
    """The scales per axis and the output shape."""
    scales = tuple(scale if d in axes else 1.0 for d in range(len(shape)))
    out = tuple(int(np.floor(n * s)) for n, s in zip(shape, scales, strict=True))
    return scales, out


def resample_operands(key: jax.Array, shape: tuple, out: tuple, dtype: Any) -> tuple:
    """A resample case's input and output gradient in ``dtype``, drawn on the
    device: half a billion normal samples for a 2x gradient take seconds to draw
    and copy on the host."""
    x_key, dy_key = jax.random.split(key)
    return jax.random.normal(x_key, shape, dtype), jax.random.normal(dy_key, out, dtype)


def jaxgrad_resample(shape: tuple, scales: tuple, mode: str, impl: str | None) -> dict:
    kw = dict(mode=mode, implementation=impl)
    return {
        "forward": jax.jit(lambda x: jaxgrad.resample(x, scales, **kw)),
        "backward": jax.jit(lambda dy: jaxgrad.resample_grad(dy, shape, scales, **kw)),
    }


def image_resize(shape: tuple, out: tuple, mode: str) -> dict:
    """jax.image.resize and its VJP (which antialiases when shrinking: its cost)."""
    method = "linear" if mode == "linear" else "nearest"

    def resize(x):
        return jax.image.resize(x, out, method)

    del shape
    return {
        "forward": jax.jit(resize),
        "backward": jax.jit(lambda x, dy: jax.vjp(resize, x)[1](dy)[0]),
    }


def torch_resample(torch: Any, x: Any, dy: Any, axes: tuple, out: tuple, scale: float, mode: str):
    """interpolate and its backward as zero-argument calls, in the memory format of
    the layout (channels_last for NHWC). Its linear mode is jaxgrad's (half-pixel);
    its "nearest" floors asymmetric coordinates, other samples for the same work."""
    aten = torch.ops.aten
    channels_last = axes == (1, 2)
    to_torch = (lambda a: a.permute(0, 3, 1, 2)) if channels_last else (lambda a: a)
    tx, tdy = to_torch(x), to_torch(dy)
    spatial = [out[d] for d in axes]
    in_size = list(tx.shape)
    scales = [scale] * len(axes)
    torch_mode = {2: "bilinear", 3: "trilinear"}[len(axes)] if mode == "linear" else "nearest"
    kw = {"align_corners": False} if mode == "linear" else {}

    def forward():
        return torch.nn.functional.interpolate(tx, scale_factor=scale, mode=torch_mode, **kw)

    if mode == "linear":
        grad = {2: aten.upsample_bilinear2d_backward, 3: aten.upsample_trilinear3d_backward}
        backward = partial(grad[len(axes)], tdy, spatial, in_size, False, *scales)
    else:
        backward = partial(aten.upsample_nearest2d_backward, tdy, spatial, in_size, *scales)
    return {"forward": forward, "backward": backward}


def resample_correctness(
    rng: np.random.Generator, smoke: bool, only: Sequence[str] = ()
) -> list[dict]:
    """Relative errors of both implementations in the dtypes checked but not timed
    (``untimed_dtypes``), against float64 on the CPU, on small arrays of every case
    (or of those ``only`` asks for); the timed dtypes are checked on the timed
    programs (``resample_speed``)."""
    cpu = jax.devices("cpu")[0]
    small = {"NCHW": (2, 8, 64, 64), "NHWC": (2, 64, 64, 8), "NCDHW": (1, 4, 16, 16, 16)}
    rows = []
    for layout, shape, axes, mode, scale in resample_cases(smoke, only):
        shape = shape if smoke else small[layout]
        scales, out = resample_shapes(shape, axes, scale)
        x = rng.normal(size=shape).astype(np.float32)
        dy = rng.normal(size=out).astype(np.float32)
        # One set of reference programs for every dtype: compiled once.
        reference = jaxgrad_resample(shape, scales, mode, "xla")
        for dtype in untimed_dtypes():
            # The reference sees the rounded operands: only the computation's error remains.
            xr, dyr = (np.asarray(jnp.asarray(a, dtype), np.float64) for a in (x, dy))
            with jax.default_device(cpu), x64(True):
                ref = {"forward": np.asarray(reference["forward"](xr))}
                ref["backward"] = np.asarray(reference["backward"](dyr))
            args = {"forward": jnp.asarray(x, dtype), "backward": jnp.asarray(dy, dtype)}
            calls = {
                (label, op): partial(jaxgrad_resample(shape, scales, mode, label)[op], args[op])
                for label in ("xla", "pallas")  # the default is one of them
                for op in ("forward", "backward")
            }
            # Nothing here is timed: every program compiles side by side.
            for (label, op), got in side_by_side(calls).items():
                err = relative_error(got, ref[op])
                case = f"{layout} {mode} {scale}x"
                rows.append(dict(case=case, dtype=dtype, impl=label, op=op, error=err))
                print(f"  {case:<20} {dtype:<9} {label:<7} {op:<9} {err:.2e}", flush=True)
    return rows


def batch_ends(a: jax.Array) -> jax.Array:
    """The first and the last entry of ``a``'s leading axis (the batch, which
    resample leaves alone in every timed case): where a timed resample result is
    checked. The float64 reference of a whole 2x output (half a billion elements)
    is about as slow to compute on the CPU as everything else in its row."""
    return a[:: max(a.shape[0] - 1, 1)]


def resample_speed(
    key: jax.Array,
    bandwidth: float,
    rounds: int,
    torch: Any,
    smoke: bool,
    only: Sequence[str] = (),
) -> Iterator[tuple]:
    """Each resample case's rows, as they are measured: ``("resample_correctness",
    row)``, the relative error of each timed program against float64
    (``float64_result``) on the batch's first and last entries (``batch_ends``),
    and ``("resample_speed", row)``, the times of one op. The operands are drawn
    on the device (``resample_operands``, from ``key``) and PyTorch's share their
    memory.
    jaxgrad's programs of a case and dtype compile first (``first_results``),
    then the peers one at a time. A speed row's ``seconds`` are the wall time
    since the row before it, and its ``phases`` how they divide, as in the
    depthwise section."""
    since = Stopwatch()
    for i, (layout, shape, axes, mode, scale) in enumerate(resample_cases(smoke, only)):
        scales, out = resample_shapes(shape, axes, scale)
        # The float64 references' programs, for the batch's ends, compiled once for every dtype.
        reference = jaxgrad_resample((min(shape[0], 2), *shape[1:]), scales, mode, "xla")
        name = resample_case_name(layout, shape, mode, scale)
        for dtype in DTYPES:
            x, dy = resample_operands(jax.random.fold_in(key, i), shape, out, dtype)
            args = {"forward": x, "backward": dy}
            ours = {
                (op, label): partial(jaxgrad_resample(shape, scales, mode, impl)[op], args[op])
                for label, impl in IMPLEMENTATIONS.items()
                for op in ("forward", "backward")
            }
            with since.phase("jaxgrad's programs"):
                results = first_results(ours)
            with since.phase("float64 references"):
                want = {op: float64_result(reference[op], batch_ends(a)) for op, a in args.items()}
            with since.phase("checks"):
                ends_of = {k: r if failed(r) else batch_ends(r) for k, r in results.items()}
                where = dict(case=f"{layout} {mode} {scale}x", dtype=dtype)
                rows = list(checked(ends_of, want, **where))
            for row in rows:
                yield "resample_correctness", row
            del results, ends_of, want  # the device memory the timings may need
            theirs = {}
            if torch is not None:
                with since.phase("PyTorch's operands"):
                    tx, tdy = (torch.from_dlpack(a) for a in (x, dy))
                    theirs = torch_resample(torch, tx, tdy, axes, out, scale, mode)
            peer = image_resize(shape, out, mode)
            for op in ("forward", "backward"):
                calls = {f"jaxgrad {label}": ours[op, label] for label in IMPLEMENTATIONS}
                calls["jax.image"] = (
                    partial(peer["forward"], x) if op == "forward" else partial(peer[op], x, dy)
                )
                if theirs:
                    calls["torch"] = theirs[op]
                with since.phase("peers and rounds"):
                    ms = rounds_ms(calls, rounds)
                roof = 1e3 * nbytes(x, dy) / bandwidth
                row = dict(
                    case=name,
                    dtype=dtype,
                    op=op,
                    roofline=roof,
                    torch=ms.pop("torch", None),
                    **ms,
                )
                row["default_over_roofline"] = ms["jaxgrad default"] / roof
                row["seconds"], row["phases"] = since.lap()
                print(
                    f"  {row['case']:<36} {dtype:<8} {op:<8} roof {roof:.3f}  "
                    + "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
                    + (f"  torch {row['torch']:.3f}" if row["torch"] is not None else "")
                    + f"  default/roofline {row['default_over_roofline']:.2f}"
                    + f"  ({row['seconds']:.0f} s)",
                    flush=True,
                )
                yield "resample_speed", row


def _worst(rows: list[dict]) -> list[str]:
    """The largest relative error of each implementation and op (a row) in each
    dtype (a column); a failure (NaN) is the largest of all."""
    worst: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        errors = worst.setdefault((r["impl"], r["op"]), {})
        error = math.inf if math.isnan(r["error"]) else r["error"]
        errors[r["dtype"]] = max(errors.get(r["dtype"], 0.0), error)
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))

    def cell(error: float | None) -> str:
        return "" if error is None else "failed" if error == math.inf else f"{error:.2e}"

    lines = [
        "| implementation | op | " + " | ".join(dtypes) + " |",
        "|---|---|" + "---|" * len(dtypes),
    ]
    return lines + [
        f"| {impl} | {op} | " + " | ".join(cell(errors.get(d)) for d in dtypes) + " |"
        for (impl, op), errors in sorted(worst.items())
    ]


def _ms(row: dict, name: str) -> str:
    """A time of ``row`` as a table cell: empty where the run left it out."""
    return f"{row[name]:.3f}" if name in row else ""


def render(results: dict) -> str:
    """The results as markdown tables, for the docs' GPU section."""
    m = results["machine"]
    lines = [
        f"{m['device']}, driver {m['driver']}, jax {m['jax']}, jaxlib {m['jaxlib']}, "
        f"torch {m['torch']}, triton {m['triton']}; copy roofline "
        f"{results['copy_bandwidth_GBps']:.0f} GB/s.",
    ]
    if results.get("speed"):  # empty where --cases chose no depthwise case
        lines += [
            "",
            "| case | layout | dtype | op | roofline | default | xla | pallas | lax | torch "
            "| default / best peer | default / roofline |",
            "|" + "---|" * 12,
        ]
        for r in results["speed"]:
            torch_ms = f"{r['torch']:.3f}" if r["torch"] is not None else ""
            pallas = _ms(r, "jaxgrad pallas")
            # Earlier runs, while one kernel computed both gradients, timed two too.
            if "jaxgrad pallas, two kernels" in r:
                pallas += f" (two kernels {r['jaxgrad pallas, two kernels']:.3f})"
            lines.append(
                f"| {r['case']} | {r['layout']} | {r['dtype']} | {r['op']} | {r['roofline']:.3f} "
                f"| {r['jaxgrad default']:.3f} | {_ms(r, 'jaxgrad xla')} "
                f"| {pallas} | {r['lax']:.3f} | {torch_ms} "
                f"| {r['default_over_best_peer']:.2f} "
                f"| {r['jaxgrad default'] / r['roofline']:.2f} |"
            )
    if results.get("correctness"):
        lines += ["", *_worst(results["correctness"])]
    if results.get("resample_speed"):
        lines += [
            "",
            "| case | dtype | op | roofline | default | xla | pallas | jax.image | torch "
            "| default / roofline |",
            "|" + "---|" * 10,
        ]
        for r in results["resample_speed"]:
            torch_ms = f"{r['torch']:.3f}" if r["torch"] is not None else ""
            lines.append(
                f"| {r['case']} | {r['dtype']} | {r['op']} | {r['roofline']:.3f} "
                f"| {r['jaxgrad default']:.3f} | {_ms(r, 'jaxgrad xla')} "
                f"| {_ms(r, 'jaxgrad pallas')} | {r['jax.image']:.3f} | {torch_ms} "
                f"| {r['default_over_roofline']:.2f} |"
            )
    if results.get("resample_correctness"):
        lines += ["", *_worst(results["resample_correctness"])]
    if "failed" in results.get("determinism", {}):
        lines += ["", f"Fresh processes: failed ({results['determinism']['failed']})."]
    elif "determinism" in results:
        patterns = results["determinism"]["bit_patterns"]
        differ = [name for name, n in patterns.items() if n > 1]
        lines += [
            "",
            f"Fresh processes: {results['determinism']['processes']}; cases with more than one "
            f"bit pattern: {len(differ)} of {len(patterns)}"
            + (f" ({', '.join(differ)})" if differ else ""),
        ]
    if "train_step" in results:
        t = results["train_step"]
        lines += [
            "",
            f"U-Net step, batch {t['batch']} of {t['size']}x{t['size']}: "
            f"jaxgrad {t['jaxgrad']:.2f} ms, stock {t['stock']:.2f} ms "
            f'({t["stock"] / t["jaxgrad"]:.2f}x); with the resampling in "xla" '
            f"{t['jaxgrad, resample xla']:.2f} ms"
            + (  # runs before the filter gradient walked by default
                f", with the depthwise columns walked {t['jaxgrad, columns walked']:.2f} ms"
                if "jaxgrad, columns walked" in t
                else ""
            )
            + (  # runs since
                f", with no depthwise columns walked {t['jaxgrad, columns tiled']:.2f} ms"
                if "jaxgrad, columns tiled" in t
                else ""
            )
            + (  # earlier runs, with one kernel for both gradients
                f", with one kernel per depthwise gradient {t['jaxgrad, two kernels']:.2f} ms."
                if "jaxgrad, two kernels" in t
                else "."
            ),
        ]
    if "seconds" in results:
        took = ", ".join(f"{key} {value:.0f} s" for key, value in results["seconds"].items())
        lines += ["", f"Sections' wall time: {took}."]
    for section in ("speed", "resample_speed"):
        phases: dict[str, float] = {}
        for row in results.get(section, []):
            for name, seconds in row.get("phases", {}).items():
                phases[name] = phases.get(name, 0.0) + seconds
        if phases:
            split = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
            lines += ["", f"Where {section}'s seconds went: {split}."]
    return "\n".join(lines)


def write_json(path: str, results: dict) -> None:
    """``results`` as indented JSON at ``path``, replacing what was there."""
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")


def narrow(args: argparse.Namespace) -> None:
    """Keeps the cases, dtypes and layouts that ``--cases``, ``--dtypes`` and
    ``--layouts`` ask for, and leaves "xla" out of the timings for
    ``--skip-xla-timing``, so that a run can be cut into parts that each fit a
    time limit; stops the run where no case is left."""
    if args.dtypes:
        DTYPES[:] = [d for d in DTYPES if d in args.dtypes]
        CHECKED_DTYPES[:] = [d for d in CHECKED_DTYPES if d in args.dtypes]
    if args.layouts:
        LAYOUTS[:] = [layout for layout in LAYOUTS if layout in args.layouts]
    if args.skip_xla_timing:
        IMPLEMENTATIONS.pop("xla")
    CASES[:] = [case for case in CASES if chosen(case[0], args.cases)]
    if not CASES and not resample_cases(args.smoke, args.cases):
        raise SystemExit(f"benchmarks/gpu.py: no case name contains any of {args.cases}")


def arguments() -> argparse.ArgumentParser:
    """The command line this script reads (benchmarks/lease.py checks its steps' with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per row (median)")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--skip-determinism",
        action="store_true",
        help="leave the check across fresh processes out (as --sections without determinism)",
    )
    parser.add_argument(
        "--skip-xla-timing",
        action="store_true",
        help='time and check the default and "pallas" alone ("xla" in float16 still): the '
        '"xla" programs are the slowest to compile',
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="which timed sections to run (default: all)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=[],
        metavar="SUBSTRING",
        help="only the cases whose name contains one of these: depthwise names such as "
        "'[32,112,112,96] 3x3 s1' or 'M2', resample names such as '[32, 256, 256, 64] NHWC "
        "linear 2.0x' (default: all)",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=CHECKED_DTYPES,
        default=None,
        help="only these dtypes, checked and timed (default: bfloat16 and float32 timed, "
        "float16 checked too)",
    )
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=LAYOUTS,
        default=None,
        help="only these depthwise layouts (default: both; resample layouts are in its case names)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=THREADS,
        help="how many of jaxgrad's programs compile at once (default: one per CPU core; "
        "1 compiles one at a time)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few tiny cases on any backend (PyTorch, if installed, on the CPU): "
        "checks that the script runs",
    )
    return parser


def main() -> None:
    global TORCH_DEVICE, THREADS
    args = arguments().parse_args()
    THREADS = args.threads
    torch = None
    if args.smoke:
        TORCH_DEVICE = "cpu"
        with contextlib.suppress(ImportError):
            import torch
        CASES[:] = [(name, (2, 9, 10, 4 * m), k, s) for name, _, k, s in CASES[-1:] for m in [k[2]]]
        DTYPES[:] = ["float32"]
        CHECKED_DTYPES[:] = ["float32", "float16"]
        LAYOUTS[:] = ["NHWC"]
        args.rounds = 1
    elif jax.default_backend() != "gpu":
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU as JAX's default backend")
    else:
        with contextlib.suppress(ImportError):
            import torch
    narrow(args)
    results: dict[str, Any] = {"command": " ".join(["python", *sys.argv])}

    def record(key: str, value: Any) -> None:
        """Keeps a measurement, and writes everything measured so far: a run cut
        short (by a time limit, or a failure further on) keeps what it finished."""
        results[key] = value
        if args.json:
            write_json(args.json, results)

    def record_rows(rows: Iterator[tuple[str, dict]]) -> None:
        """Appends each ``(key, row)`` to the rows kept under its key."""
        for key, row in rows:
            record(key, [*results.get(key, []), row])

    @contextlib.contextmanager
    def section(title: str, key: str, began: float | None = None) -> Iterator[None]:
        """Prints a section's title, then the seconds it took (since ``began``, if
        it began earlier), which are recorded too: they say how to cut a run to
        fit a time limit."""
        print(title, flush=True)
        start = time.perf_counter() if began is None else began
        yield
        seconds = {**results.get("seconds", {}), key: round(time.perf_counter() - start, 1)}
        record("seconds", seconds)
        print(f"  ({seconds[key]:.0f} s)", flush=True)

    record("machine", environment())
    print("machine:", json.dumps(results["machine"]))
    checks = [family for family in ("depthwise", "resample") if family in args.sections]
    processes, began = [], time.perf_counter()
    if "determinism" in args.sections and not (args.skip_determinism or args.smoke):
        print("reproducibility in 3 fresh processes: started; reported below", flush=True)
        processes = start_determinism()
    try:
        if checks and untimed_dtypes():
            title = (
                f"{', '.join(untimed_dtypes())} on small arrays (relative error against float64):"
            )
            with section(title, "untimed_dtypes"):
                if "depthwise" in checks:
                    record("correctness", correctness(np.random.default_rng(0)))
                if "resample" in checks:
                    rows = resample_correctness(np.random.default_rng(0), args.smoke, args.cases)
                    record("resample_correctness", rows)
    except BaseException:  # a run that ends here leaves no process behind on the GPU
        for process in processes:
            process.kill()
        raise
    if processes:
        with section("reproducibility in 3 fresh processes:", "determinism", began):
            record("determinism", finish_determinism(processes))
    bandwidth = copy_bandwidth(2**20 if args.smoke else 2**28)
    record("copy_bandwidth_GBps", bandwidth / 1e9)
    roofline = f"ms; copy roofline at {bandwidth / 1e9:.0f} GB/s"
    timed = "relative error of the timed programs against float64, then"
    if "depthwise" in args.sections and DTYPES:
        with section(f"depthwise ({timed} speed in {roofline}):", "speed"):
            record_rows(speed(np.random.default_rng(0), bandwidth, args.rounds, torch))
    if "resample" in args.sections and DTYPES:
        with section(f"resample ({timed} speed in {roofline}):", "resample_speed"):
            key = jax.random.key(0)
            record_rows(resample_speed(key, bandwidth, args.rounds, torch, args.smoke, args.cases))
    if "train" in args.sections:
        with section("U-Net training step:", "train_step"):
            record("train_step", train_step(args.rounds, *((2, 16) if args.smoke else ())))
    print()
    print(render(results))


if __name__ == "__main__":
    main()
