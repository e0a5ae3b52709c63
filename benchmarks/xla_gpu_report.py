"""What XLA:GPU compiles jaxgrad's programs into for an H100, on a machine without one.

    pip install "jax-cuda13-plugin[with-cuda]==<the installed jaxlib's version>"
    python benchmarks/xla_gpu_report.py [--sections depthwise resample scales train]
                                        [--json report.json]

JAX compiles for compile-only devices that an XLA GPU target configuration
describes (``jax.experimental.topologies``; below, the H100 80GB HBM3 of XLA's own
specs), with the CUDA plugin's compiler: no GPU, driver or CUDA runtime is used.
For each program of benchmarks/gpu.py's cases, in jaxgrad's default (the Pallas
kernels where a CUDA GPU takes them) and "xla" implementations and for the
peers (lax's grouped convolution and its VJPs, ``jax.image.resize`` and its
VJP), it prints the kernels the optimized program launches (XLA's fusions,
Triton kernels, library calls such as cuDNN's) and the bytes they move by a
simple count: each kernel reads its operands and writes its results once, from
and to memory. That count over the bytes the op itself must read and write is
how far a program is from the copy roofline before any kernel runs slowly; 1.00
is a program that touches each byte once. ``--sections scales`` lists float32
resample at more scales, linear and nearest, forward and gradient, with "xla"
applying the axes one at a time as on the CPU: where XLA:GPU compiles that into
one pass decides where the default takes the kernel and where "xla" on GPUs
reads every axis's taps in one expression instead. ``--sections
train`` compares the example U-Net's training step (batch 64 of 128x128) with
jaxgrad's ops and with stock ones, and jaxgrad's as compiled for a GPU older than
Ampere (every op "xla"), with the seconds each took to compile here.

What it cannot show: run times, and the autotuner's choices (a compile-only device
is not autotuned: XLA:GPU takes its default tilings and cuDNN algorithm). A
kernel inside a loop counts once.
"""

from __future__ import annotations

import os

# A compile-only device needs no GPU; the CUDA plugin's checks of the local CUDA
# installation would fail without one.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import argparse
import collections
import contextlib
import dataclasses
import functools
import itertools
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import gpu
import jax
import numpy as np

from jaxgrad import _implementation
from jaxgrad._resample import _xla

# The parts of XLA's description of an H100 80GB HBM3
# (xla/backends/gpu/target_config/specs/h100_sxm.txtpb) that compiling reads.
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84942979072
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 feature_extension: ACCELERATED_FEATURES }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""

SECTIONS = ("depthwise", "resample", "scales", "train")
# The scales of the "scales" section: of NCHW [32,64,256,256]'s two spatial axes,
# then of the NCDHW volume's three. Where XLA compiles a float32 linear map into
# one pass decides the default implementation; nearest neighbour is listed to
# show that XLA moves it in one pass at every scale.
SECTION_SCALES = [
    *[(s, s) for s in (2.0, 3.0, 4.0, 0.5, 1 / 3, 0.25, 1.25, 1.5, 1.7, 0.7)],
    *[(2.0, 0.5), (1 / 3, 2.0), (3.0, 2.0), (2.0, 1.7), (1.7, 1.0)],
    (2.0, 2.0, 2.0),
    (0.5, 0.5, 0.5),
    (1.7, 1.7, 1.7),
]
ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
ITEM_BYTES |= {"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
ARRAY = re.compile(r"\b(pred|bf16|[fsu]\d+)\[([\d,]*)\]")
INSTRUCTION = re.compile(r"^(?:ROOT )?%(\S+) = (.+?) ([\w-]+)\((.*)$")
TRITON = "__gpu$xla.gpu.triton"
# Instructions that launch work on the GPU, by what the report calls them.
LAUNCHES = {"fusion": "fusion", "custom-call": "library", "copy": "copy", "while": "loop"}
LAUNCHES |= {c + "-start": "collective" for c in ("all-reduce", "all-gather", "collective-permute")}
LAUNCHES |= {"all-to-all": "collective", "reduce-scatter": "collective"}


# --------------------------------------------------------------------------------------
# Reading a compiled program
# --------------------------------------------------------------------------------------


def array_bytes(text: str) -> int:
    """The bytes of every array type in ``text`` (a shape, or a tuple of shapes)."""
    total = 0
    for dtype, dims in ARRAY.findall(text):
        total += int(np.prod([int(d) for d in dims.split(",") if d])) * ITEM_BYTES[dtype]
    return total


@dataclasses.dataclass(frozen=True)
class Launch:
    kind: str  # fusion, triton, library, copy, collective or loop
    name: str
    read: int  # bytes of its operands
    written: int  # bytes of its results


def launches(hlo: str) -> list[Launch]:
    """What the entry computation of an optimized HLO module launches, in order."""
    entry = hlo[hlo.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    sizes: dict[str, int] = {}
    found = []
    for line in entry.splitlines()[1:]:
        match = INSTRUCTION.match(line.split(", metadata=")[0].strip())
        if not match:
            continue
        name, result, opcode, rest = match.groups()
        sizes[name] = array_bytes(result)
        if opcode not in LAUNCHES:
            continue
        operands = re.findall(r"%([\w.-]+)", rest.split(")", 1)[0])
        kind = "triton" if opcode == "custom-call" and TRITON in line else LAUNCHES[opcode]
        found.append(Launch(kind, name, sum(sizes.get(o, 0) for o in operands), sizes[name]))
    return found


def summary(found: list[Launch]) -> dict[str, Any]:
    """Launches by kind, and the bytes all of them move."""
    kinds = collections.Counter(launch.kind for launch in found)
    moved = sum(launch.read + launch.written for launch in found)
    return {"kernels": dict(sorted(kinds.items())), "bytes": moved}


# --------------------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------------------


def h100s(count: int = 1) -> list[Any]:
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="cuda", topology=f"1x1x{count}", target_config=H100
    )
    return list(topology.devices)


def compiled(fn: Callable, *specs: Any, capability: tuple[int, int] = (9, 0)) -> str:
    """The optimized HLO of ``jax.jit(fn)`` for ``specs``. In a process without a
    GPU the default implementation would take "xla"; the H100 stands in for one.
    ``capability`` is the compute capability the default sees (below 8.0, as on a
    V100 or a T4, it takes "xla")."""
    with contextlib.ExitStack() as patches:
        patches.enter_context(
            mock.patch.object(_implementation, "_cuda_capability", lambda: capability)
        )
        patches.enter_context(h100_answers())
        jax.clear_caches()
        return jax.jit(fn).trace(*specs).lower().compile().as_text()  # type: ignore[no-any-return]


def h100_answers() -> contextlib.AbstractContextManager:
    """From JAX 0.11 the Triton lowering asks the local GPU for its compute
    capability, which a compile-only device does not answer: the H100 does.
    JAX 0.10 does not ask."""
    from jax._src.pallas.triton import pallas_call_registration as registration
    from jax.experimental.pallas import triton as plgpu

    if not hasattr(registration, "gpu_info_lib"):
        return contextlib.nullcontext()
    h100 = plgpu.get_gpu_info_from_version(plgpu.GpuVersion.H100)
    return mock.patch.object(registration.gpu_info_lib, "get_gpu_info", lambda: h100)


def depthwise_rows(device: Any) -> Iterator[dict]:
    """Each depthwise op of each case: jaxgrad's default and "xla", and lax."""
    on = jax.sharding.SingleDeviceSharding(device)
    for name, (n, h, w, c), (fh, fw, m), stride in gpu.CASES:
        for fmt in gpu.LAYOUTS:
            for dtype in gpu.DTYPES:
                x_shape = (n, h, w, c) if fmt == "NHWC" else (n, c, h, w)
                f_shape = (fh, fw, c, m)
                x = jax.ShapeDtypeStruct(x_shape, dtype, sharding=on)
                f = jax.ShapeDtypeStruct(f_shape, dtype, sharding=on)
                default = gpu.jaxgrad_ops(fmt, x_shape, f_shape, stride, None)
                xla = gpu.jaxgrad_ops(fmt, x_shape, f_shape, stride, "xla")
                peer = gpu.lax_ops(fmt, c, m, stride)
                y = jax.eval_shape(xla["forward"], x, f)
                dy = jax.ShapeDtypeStruct(y.shape, dtype, sharding=on)
                args = {op: a for op, _, a in gpu._named(xla, x, f, dy)}
                peer_args = {op: (x, f, dy) for op in gpu.OPS}
                peer_args["forward"] = (x, f)
                for op in gpu.OPS:
                    result = jax.tree.leaves(jax.eval_shape(xla[op], *args[op]))
                    yield {
                        "case": f"{name} {fmt} {dtype}",
                        "op": op,
                        "least": gpu.nbytes(*args[op], *result),
                        "default": summary(launches(compiled(default[op], *args[op]))),
                        "xla": summary(launches(compiled(xla[op], *args[op]))),
                        "peer": summary(launches(compiled(peer[op], *peer_args[op]))),
                    }


def resample_rows(device: Any) -> Iterator[dict]:
    """Each resample case, forward and backward: jaxgrad's default and "xla", and
    ``jax.image.resize`` with its VJP."""
    on = jax.sharding.SingleDeviceSharding(device)
    for layout, shape, axes, mode, scale in gpu.resample_cases(smoke=False):
        for dtype in gpu.DTYPES:
            scales, out = gpu.resample_shapes(shape, axes, scale)
            x = jax.ShapeDtypeStruct(shape, dtype, sharding=on)
            dy = jax.ShapeDtypeStruct(out, dtype, sharding=on)
            default = gpu.jaxgrad_resample(shape, scales, mode, None)
            xla = gpu.jaxgrad_resample(shape, scales, mode, "xla")
            peer = gpu.image_resize(shape, out, mode)
            for op, args, peer_args in (("forward", (x,), (x,)), ("backward", (dy,), (x, dy))):
                yield {
                    "case": f"{layout} {mode} {scale}x {dtype}",
                    "op": op,
                    "least": gpu.nbytes(x, dy),
                    "default": summary(launches(compiled(default[op], *args))),
                    "xla": summary(launches(compiled(xla[op], *args))),
                    "peer": summary(launches(compiled(peer[op], *peer_args))),
                }


def scale_rows(device: Any) -> Iterator[dict]:
    """At each of ``SECTION_SCALES``, in float32: linear and nearest, forward and
    gradient; jaxgrad's default, "xla", and "xla" applying the axes one at a time
    as it does on the CPU (its "peer" column), which is where the rules come from."""
    on = jax.sharding.SingleDeviceSharding(device)
    for spatial in SECTION_SCALES:
        volume = len(spatial) == 3
        layout, shape = gpu.RESAMPLE_VOLUME[:2] if volume else ("NCHW", (32, 64, 256, 256))
        scales = (1.0, 1.0, *spatial)
        out = tuple(int(np.floor(n * s)) for n, s in zip(shape, scales, strict=True))
        x = jax.ShapeDtypeStruct(shape, "float32", sharding=on)
        dy = jax.ShapeDtypeStruct(out, "float32", sharding=on)
        by = " by ".join(f"{s:.3g}x" for s in spatial)
        for mode, (op, arg) in itertools.product(
            ("linear", "nearest"), (("forward", x), ("backward", dy))
        ):
            row: dict[str, Any] = {"case": f"{layout} {mode} {by}", "op": op}
            row["least"] = gpu.nbytes(x, dy)
            for name, impl in (("default", None), ("xla", "xla")):
                fn = gpu.jaxgrad_resample(shape, scales, mode, impl)[op]
                row[name] = summary(launches(compiled(fn, arg)))
            with mock.patch.object(_xla, "_joint_fits", lambda plans: False):
                fn = gpu.jaxgrad_resample(shape, scales, mode, "xla")[op]
                row["peer"] = summary(launches(compiled(fn, arg)))
            yield row


def timed(program: Callable[[], str]) -> dict[str, Any]:
    """The summary of the program ``program()`` compiles, with the seconds it took
    (lowering and XLA's compilation: a host-side cost, on this machine's CPU)."""
    start = time.perf_counter()
    hlo = program()
    return summary(launches(hlo)) | {"compile_s": time.perf_counter() - start}


def train_rows(device: Any, batch: int = 64, size: int = 128) -> Iterator[dict]:
    """The example U-Net's training step, with jaxgrad's ops and with stock ones;
    then with jaxgrad's resampling in "xla", which XLA can fuse with the ops
    around it (its "default" column); then jaxgrad's ops as a GPU older than
    Ampere compiles them, every op in "xla" (its "xla" column). Each with the
    seconds it took to compile."""
    sys.path.insert(0, str(gpu.ROOT / "examples"))
    import unet

    on = jax.sharding.SingleDeviceSharding(device)

    def placed(tree: Any) -> Any:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on), tree)

    params = jax.eval_shape(lambda: unet.init_params(jax.random.key(0)))
    batch_arrays = jax.eval_shape(lambda: unet.make_batch(jax.random.key(1), batch, size))
    specs = placed((params, jax.eval_shape(unet.adam_init, params), *batch_arrays))
    # The step's activations, not its arguments, are what it moves: no least here.
    row: dict[str, Any] = {"case": f"U-Net step, batch {batch} of {size}x{size}", "op": "step"}
    row["least"] = None
    step = functools.partial(unet.train_step, ops=unet.JAXGRAD)
    row["default"] = timed(lambda: compiled(step, *specs))
    row["xla"] = timed(lambda: compiled(step, *specs, capability=(7, 5)))
    stock = functools.partial(unet.train_step, ops=unet.STOCK)
    row["peer"] = timed(lambda: compiled(stock, *specs))
    yield row
    step = functools.partial(unet.train_step, ops=gpu.resampling_in_xla(unet))
    yield {
        "case": f'U-Net step, batch {batch} of {size}x{size}, resample implementation="xla"',
        "op": "step",
        "least": None,
        "default": timed(lambda: compiled(step, *specs)),
    }


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def cell(entry: dict | None, least: int | None) -> str:
    """A program's launches by kind, and the megabytes they move (over the least the
    op moves, where that is known)."""
    if entry is None:
        return ""
    kinds = ", ".join(f"{n} {kind}" for kind, n in entry["kernels"].items())
    moved = f"{entry['bytes'] / 1e6:.0f} MB"
    text = f"{kinds}; {moved}" + (f" ({entry['bytes'] / least:.2f}x)" if least else "")
    return text + (f"; compiled in {entry['compile_s']:.1f} s" if "compile_s" in entry else "")


def render(rows: list[dict], peer: str) -> str:
    lines = [
        f"| case | op | least MB | jaxgrad default | jaxgrad xla | {peer} |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        least = f"{r['least'] / 1e6:.0f}" if r["least"] else ""
        cells = (cell(r.get(impl), r["least"]) for impl in ("default", "xla", "peer"))
        lines.append(f"| {r['case']} | {r['op']} | {least} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PEERS = {
    "depthwise": "lax (cuDNN)",
    "resample": "jax.image.resize",
    "scales": "xla, one axis at a time",
    "train": "stock ops",
}
ROWS = {
    "depthwise": depthwise_rows,
    "resample": resample_rows,
    "scales": scale_rows,
    "train": train_rows,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--json", help="also write the rows as JSON to this path")
    args = parser.parse_args()
    try:
        device = h100s()[0]
    except (NotImplementedError, RuntimeError) as error:  # no CUDA plugin, or a broken one
        raise SystemExit(
            "xla_gpu_report.py needs JAX's CUDA plugin (compile-only: no GPU needed): "
            'pip install "jax-cuda13-plugin[with-cuda]==<jaxlib version>"'
            f" ({type(error).__name__}: {error})"
        ) from None
    print(f"JAX {jax.__version__}, compiled for {device.device_kind} (compile-only)")
    results: dict[str, list[dict]] = {}
    for section in args.sections:
        results[section] = []
        for row in ROWS[section](device):
            results[section].append(row)
            if args.json:
                gpu.write_json(args.json, results)
        print(f"\n## {section}: kernels, and bytes moved over the least the op moves\n")
        print(render(results[section], PEERS[section]))


if __name__ == "__main__":
    main()
