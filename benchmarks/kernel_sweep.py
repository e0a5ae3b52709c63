"""Whether the Pallas kernels compile for an H100 in random configurations, without a GPU.

    pip install triton          # optional, as PyTorch is: never a dependency
    python benchmarks/kernel_sweep.py [--family depthwise resample] [--count 40]
                                      [--start 0] [--seed 0] [--arch sm_90a]
                                      [--slow 10] [--registers 200]
                                      [--json sweep.json]

The test suite lowers the kernels for CUDA over its reference configurations:
JAX's half of compiling them. This draws configurations at the sizes a GPU
meets (shapes, dtypes, layouts, strides, dilations, paddings, depth
multipliers; resample's ranks, modes, scales and pixel offsets) with each
launch option a GPU run may time, and takes every kernel of a gradient step
through the whole way a GPU's compile goes: JAX's Triton lowering, Triton to
PTX, and ``ptxas`` (the one Triton ships) to machine code. It prints each
configuration a stage refuses, each kernel that spills registers, and each that
took Triton longer than ``--slow`` seconds to compile (a GPU's compile of a
program that holds it takes as long; the run compiles with a Triton cache of
its own, so every compile is a first one), and each that takes more than
``--registers`` registers a thread without spilling (ptxas has 255 at most:
near them a kernel leaves a multiprocessor room for the fewest programs, and
a little more code spills), with the call that builds it; then how many
compiled. It exits with 1 when a stage refused one.

Configuration ``i`` is drawn from ``--seed`` and ``i`` alone, so a run names
what it found reproducibly: ``--start 17 --count 1`` compiles the 17th again.
Cases the ops refuse (a VALID window larger than its input, say) are not drawn.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any
from unittest import mock

import gpu
import jax
import jax.numpy as jnp
import kernel_report

import jaxgrad
from jaxgrad._depthwise import _pallas as depthwise_kernels
from jaxgrad._resample import _pallas as resample_kernels

FAMILIES = ("depthwise", "resample")
# Registers a thread past which a run names a kernel that does not spill: ptxas
# allots 255 at most, and a kernel near them spills at a little more code (a
# program of 4 warps leaves an H100's multiprocessor room for two at most).
REGISTERS = 200
DTYPES = ("float16", "bfloat16", "float32")

# Launch fields a GPU run may time (benchmarks/tune.py's groups), set over the
# library's own launch. Half the draws take the library's launch as it is.
DEPTHWISE_LAUNCHES = (
    {},
    {"reuse_rows": True},
    {"read_ahead": True},
    {"taps": 32, "reuse_rows": True},
    {"walk_columns": True},
    {"walk_columns": True, "walk_warps": 1},
    {"walk_columns": True, "walk_warps": 1, "walk_grid_warps": 8192},
    {"aligned_reads": True},
    {
        "reuse_rows": False,
        "wide_strided_reads": False,
        "wide_strided_writes": False,
        "walk_columns": False,
    },
)
RESAMPLE_LAUNCHES = (
    {},
    {"paired": False, "rows_together": False},
    {"paired": True, "rows_together": False},
    {"paired": False, "rows_together": True},
    {"paired": True, "rows_together": True},
    {"row_pattern": True},
    {"warps": 1},
    {"paired": True, "row_pattern": True, "warps": 1},
)


@dataclasses.dataclass(frozen=True)
class Config:
    """One drawn configuration: a gradient step through one family's kernels."""

    number: int
    family: str
    call: str  # the op's call, as a reader would write it to build the kernels again
    launch: dict[str, Any]  # the ``_Launch`` fields set over the library's choice
    step: Callable[..., Any]
    args: tuple[jax.ShapeDtypeStruct, ...]


def _launch_drawn(rng: random.Random, launches: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return rng.choice([launches[0]] * (len(launches) - 1) + list(launches))


def depthwise_config(number: int, rng: random.Random) -> Config:
    """A depthwise convolution's forward and both gradients, drawn."""
    data_format = rng.choice(["NHWC", "NCHW"])
    dtype = rng.choice(DTYPES)
    fh, fw = rng.choice([(1, 1), (2, 2), (3, 3), (3, 3), (5, 5), (7, 7), (3, 1), (1, 5), (4, 3)])
    dilation = rng.choice([(1, 1), (1, 1), (1, 1), (2, 2), (1, 3)])
    # TensorFlow takes a dilation only at stride 1.
    stride = (1, 1) if dilation != (1, 1) else rng.choice([(1, 1), (1, 1), (2, 2), (1, 2), (3, 3)])
    padding = rng.choice(["SAME", "VALID", "EXPLICIT"])
    window = ((fh - 1) * dilation[0] + 1, (fw - 1) * dilation[1] + 1)
    h, w = rng.randint(window[0], 140), rng.randint(window[1], 140)
    batch, channels = rng.choice([1, 2, 4]), rng.choice([1, 3, 8, 17, 32, 96])
    multiplier = rng.choice([1, 1, 1, 2, 3])

    def laid_out(n: Any, c: Any, spatial: tuple[Any, ...]) -> tuple[Any, ...]:
        return (n, c, *spatial) if data_format == "NCHW" else (n, *spatial, c)

    strides = laid_out(1, 1, stride)
    kwargs: dict[str, Any] = {"data_format": data_format, "dilations": laid_out(1, 1, dilation)}
    if padding == "EXPLICIT":
        top, bottom, left, right = (rng.randint(0, 3) for _ in range(4))
        pairs = laid_out((0, 0), (0, 0), ((top, bottom), (left, right)))
        kwargs["explicit_paddings"] = [side for pair in pairs for side in pair]
    x = jax.ShapeDtypeStruct(laid_out(batch, channels, (h, w)), jnp.dtype(dtype))
    f = jax.ShapeDtypeStruct((fh, fw, channels, multiplier), jnp.dtype(dtype))

    def step(x: jax.Array, f: jax.Array) -> Any:
        def loss(x: jax.Array, f: jax.Array) -> jax.Array:
            y = jaxgrad.depthwise_conv2d(x, f, strides, padding, implementation="pallas", **kwargs)
            return jnp.sum(y.astype(jnp.float32) ** 2)

        return jax.grad(loss, (0, 1))(x, f)

    options = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    call = (
        f"depthwise_conv2d(x {list(x.shape)} {dtype}, f {list(f.shape)}, {strides}, "
        f"{padding!r}, {options})"
    )
    return Config(number, "depthwise", call, _launch_drawn(rng, DEPTHWISE_LAUNCHES), step, (x, f))


def resample_config(number: int, rng: random.Random) -> Config:
    """A resample's forward and gradient, drawn: the spatial axes before the
    channels (NHWC, NDHWC) or after them (NCHW, NCDHW)."""
    spatial = rng.choice([1, 2, 2, 2, 3])
    channels_last = rng.choice([True, False])
    mode = rng.choice(["nearest", "linear"])
    dtype = rng.choice(DTYPES)
    factors = [rng.choice([2.0, 0.5, 1.7, 3.0, 0.3, 1.0, 1.25, 4.0]) for _ in range(spatial)]
    # At least one output element along each axis: the ops refuse an empty default shape.
    sizes = [rng.randint(math.ceil(1 / factor), 80) for factor in factors]
    batch, channels = rng.choice([1, 2]), rng.choice([1, 3, 16, 64])
    offsets = rng.choice([(0.5, -0.5), (0.0, 0.0), (0.5, 0.0), (0.25, -0.75)])
    if channels_last:
        shape, scales = (batch, *sizes, channels), (1, *factors, 1)
    else:
        shape, scales = (batch, channels, *sizes), (1, 1, *factors)
    x = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))

    def step(x: jax.Array) -> Any:
        def loss(x: jax.Array) -> jax.Array:
            y = jaxgrad.resample(
                x,
                scales,
                mode=mode,
                input_pixel_offsets=offsets[0],
                output_pixel_offsets=offsets[1],
                implementation="pallas",
            )
            return jnp.sum(y.astype(jnp.float32) ** 2)

        return jax.grad(loss)(x)

    call = (
        f"resample(x {list(shape)} {dtype}, {scales}, mode={mode!r}, "
        f"input_pixel_offsets={offsets[0]}, output_pixel_offsets={offsets[1]})"
    )
    return Config(number, "resample", call, _launch_drawn(rng, RESAMPLE_LAUNCHES), step, (x,))


def drawn(family: str, number: int, seed: int) -> Config:
    """Configuration ``number`` of ``family``: the same for the same seed."""
    rng = random.Random(f"{seed} {family} {number}")
    return (depthwise_config if family == "depthwise" else resample_config)(number, rng)


def described(error: Exception) -> str:
    """An exception's type and message, and where it was raised."""
    where = traceback.extract_tb(error.__traceback__)[-1]
    return f"{type(error).__name__}: {error}\n  at {where.filename}:{where.lineno}, in {where.name}"


def compiled(config: Config, arch: str) -> dict[str, Any]:
    """``config``'s kernels through JAX's lowering, Triton and ptxas: each
    kernel's registers, spilled bytes and seconds in Triton, or the stage that
    refused and why."""
    record: dict[str, Any] = {
        "family": config.family,
        "number": config.number,
        "call": config.call,
        "launch": config.launch,
    }
    module = depthwise_kernels if config.family == "depthwise" else resample_kernels
    try:
        with gpu.launches_with(module, config.launch):
            kernels = kernel_report.triton_modules(
                config.step, *config.args, capability=kernel_report.capability_of(arch)
            )
    except Exception as error:  # what refused, and why, is the finding
        return {**record, "stage": "JAX lowering", "error": described(error)}
    finally:
        jax.clear_caches()  # no trace outlives the launch it was made under
    record["kernels"] = []
    for kernel in kernels:
        with tempfile.TemporaryDirectory() as folder:
            try:
                report = kernel_report.compile_report(
                    kernel.ir, kernel.options, arch, pathlib.Path(folder)
                )
            except subprocess.CalledProcessError as error:
                return {**record, "stage": f"ptxas ({kernel.name})", "error": error.stderr}
            except Exception as error:
                return {**record, "stage": f"Triton ({kernel.name})", "error": described(error)}
        record["kernels"].append(
            {
                "name": kernel.name,
                "registers": report["registers"],
                "spilled": report["spilled"],
                "seconds": round(report["seconds"], 1),
            }
        )
    return record


def summary(
    records: list[dict[str, Any]], slow: float, registers: int = REGISTERS
) -> tuple[list[str], bool]:
    """The lines a run prints for ``records``, and whether any stage refused: the
    refusals, then the kernels that spill, take more than ``registers`` registers
    without spilling, or took Triton over ``slow`` seconds."""
    refused = [r for r in records if "stage" in r]
    lines = []
    for r in refused:
        lines.append(f"{name(r)} refused by {r['stage']}: {r['call']}, launch {r['launch']}")
        lines += ["    " + line for line in r["error"].strip().splitlines()[-6:]]
    for r in records:
        for k in r.get("kernels", []):
            if k["spilled"]:
                lines.append(
                    f"{name(r)} {k['name']} spills {k['spilled']} bytes at "
                    f"{k['registers']} registers: {r['call']}, launch {r['launch']}"
                )
            elif k["registers"] > registers:
                lines.append(
                    f"{name(r)} {k['name']} takes {k['registers']} registers: "
                    f"{r['call']}, launch {r['launch']}"
                )
            if k["seconds"] > slow:
                lines.append(
                    f"{name(r)} {k['name']} took Triton {k['seconds']} s to compile: "
                    f"{r['call']}, launch {r['launch']}"
                )
    kernels = sum(len(r.get("kernels", [])) for r in records)
    lines.append(
        f"{len(records)} configurations, {len(records) - len(refused)} compiled "
        f"({kernels} kernels), {len(refused)} refused"
    )
    return lines, bool(refused)


def name(record: dict[str, Any]) -> str:
    return f"{record['family']} #{record['number']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--count", type=int, default=40, help="configurations of each family")
    parser.add_argument("--start", type=int, default=0, help="the number of the first one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", default="sm_90a", help="the ptxas target (H100: sm_90a)")
    parser.add_argument(
        "--slow", type=float, default=10.0, help="name kernels Triton compiles slower (seconds)"
    )
    parser.add_argument(
        "--registers",
        type=int,
        default=REGISTERS,
        help="name kernels that take more registers a thread",
    )
    parser.add_argument("--json", type=pathlib.Path, help="write every configuration's record")
    args = parser.parse_args()
    try:
        import triton
    except ImportError:
        raise SystemExit("kernel_sweep.py needs the triton package: pip install triton") from None
    records = []
    # A cache of the run's own: each kernel's seconds are a first compile, as a
    # GPU's first run of a program has, not a hit in the cache of an earlier run.
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ):
        os.environ["TRITON_CACHE_DIR"] = cache
        for family in args.family:
            for number in range(args.start, args.start + args.count):
                records.append(compiled(drawn(family, number, args.seed), args.arch))
                stage = records[-1].get("stage", "compiled")
                print(f"{name(records[-1])}: {stage}", file=sys.stderr)
    lines, refused = summary(records, args.slow, args.registers)
    print("\n".join(lines))
    print(f"(Triton {triton.__version__}, {args.arch}, seed {args.seed})")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
