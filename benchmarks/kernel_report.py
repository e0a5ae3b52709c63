"""What the Pallas kernels compile to for an H100, measured without a GPU.

    pip install triton          # optional, as PyTorch is: never a dependency
    python benchmarks/kernel_report.py [--arch sm_90a] [--sms 132] [--train-step]
                                       [--reuse-rows] [--taps N] [--read-ahead]
                                       [--walk-columns] [--walk-grid-warps N]
                                       [--aligned-reads]
                                       [--tables] [--rows-together] [--row-pattern]
                                       [--dump DIR]
                                       [--loops]

Lowers every kernel of the benchmark cases for CUDA (the Triton IR JAX would hand
to XLA), compiles that IR with the `triton` package to PTX through the passes
XLA runs (Triton's own, from its first stage on), and assembles the PTX with the
`ptxas` Triton ships. Prints, per kernel: registers per thread, bytes
spilled, shared memory, and its global loads and stores by width (``16B x 9``:
nine loads of 16 bytes a thread; wider accesses move a tile in fewer
instructions); then its
programs (the grid), how many of them one multiprocessor holds at once (by CUDA's
occupancy rules for an H100, from the registers, warps and shared memory), and
the waves they take on ``--sms`` multiprocessors; and the seconds Triton took
to compile it on this machine's CPU (a GPU compiles each kernel when a program
holding it first runs). It checks what a GPU run would otherwise find out
late: that every kernel compiles, spills nothing, reads memory in wide,
coalesced loads, compiles quickly, and has programs enough to keep the GPU busy
(a last wave far from full leaves multiprocessors idle). Times still need a GPU
(benchmarks/gpu.py).

The loads are counted in the program's text: a load in a loop counts once,
however often the loop runs. ``--reuse-rows`` compiles every depthwise kernel with
the launch option that keeps the input rows consecutive rows share in registers
(``reuse_rows``; the filter gradient and the NCHW forward keep them without it):
their loop then reads fewer windows a row, and the windows the
first row shares are read once before the loop, so the count barely moves while
the loads a row make fall (a 3x3 filter at stride 1: from nine windows to three).
``--taps N`` lets every depthwise kernel hold up to ``N`` filter taps in registers
(``_Launch.taps``): what unrolling a larger filter costs in registers.
``--read-ahead`` makes every depthwise kernel read its next row before it computes
the current one (``_Launch.read_ahead``): what holding a row's tiles a step longer
costs in registers. ``--walk-columns`` makes the NHWC kernels walk their rows'
columns in order (``_Launch.walk_columns``; the input gradient at strides of 1
without a multiplier): a tile of rows by channels a step, each column read once
per filter row. ``--walk-grid-warps N`` gives a walk's grid ``N`` warps at least
(``_Launch.walk_grid_warps``): its rows cut into more, shorter segments, which
the programs and waves columns show. ``--aligned-reads`` makes every NCHW
depthwise kernel read a run of columns that starts off a vector's alignment
from the aligned vectors under it (``_Launch.aligned_reads``), as the kernels
did before a GPU timed it slower.
``--tables`` makes the resample kernel gather every output's column taps
through the column table, where its launch reads a last axis that repeats every
two output columns, or every output two input columns, in pairs
(``_Launch.paired``: NCHW's 2x and 0.5x and their gradients; each tap a
contiguous run of inputs, loaded in vectors where it starts on one), and hold no
program's rows as one tile, where its launch holds short rows so
(``_Launch.rows_together``). ``--rows-together`` gives every resample program of
one channel its rows as one ``[rows, columns]`` tile, long rows too.
``--row-pattern`` gives each resample program whose last row axis repeats a
block of whole periods of it whose input rows are each read once, for each tap
of the row axes before (``_Launch.row_pattern``); the kernel keeps the row loop
for the blocks at the axis's ends, so the report counts both.

``--dump DIR`` writes each kernel's PTX to ``DIR``, and its SASS, the machine
code the GPU runs (disassembled with the ``nvdisasm`` Triton ships): where a
loop issues its loads against its products, say, which the PTX does not fix.
``--loops`` adds a column with each loop of a kernel's SASS that multiplies and
adds: its instructions and its float32 multiply-adds (``384 / 216``), one pass
of the loop's body with every branch inside it taken (a pass that skips one, as
a resample row with a tap missing does, issues fewer). Their ratio is what a
kernel issues for each multiply-add where the loop is most of its work; bounded
by issue rather than memory, the kernel's time follows it.

``--train-step`` reports instead the kernels of the example U-Net's training step
(batch 64 of 128x128, jaxgrad's default implementation, as benchmarks/gpu.py
times it), and a host-side cost of the GPU path: how long the step takes to
lower for CUDA, and Triton to compile its kernels, on this machine's CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any
from unittest import mock

import gpu
import jax
import jax.numpy as jnp

import jaxgrad
from jaxgrad import _implementation
from jaxgrad._depthwise import _pallas as depthwise_kernels
from jaxgrad._resample import _pallas as resample_kernels

ROOT = pathlib.Path(__file__).resolve().parent.parent

DEPTHWISE_CASES = {
    # name: (input shape, filter shape, stride, data_format, dtype)
    "[32,112,112,96] 3x3 s1 NHWC bf16": ((32, 112, 112, 96), (3, 3, 96, 1), 1, "NHWC", "bfloat16"),
    "[32,112,112,96] 3x3 s1 NCHW f32": ((32, 96, 112, 112), (3, 3, 96, 1), 1, "NCHW", "float32"),
    "[32,112,112,96] 3x3 s2 NHWC f32": ((32, 112, 112, 96), (3, 3, 96, 1), 2, "NHWC", "float32"),
    "[32,112,112,96] 3x3 s2 NHWC bf16": ((32, 112, 112, 96), (3, 3, 96, 1), 2, "NHWC", "bfloat16"),
    "[32,112,112,96] 3x3 s2 NCHW bf16": ((32, 96, 112, 112), (3, 3, 96, 1), 2, "NCHW", "bfloat16"),
    "[32,56,56,192] 5x5 s1 NHWC f32": ((32, 56, 56, 192), (5, 5, 192, 1), 1, "NHWC", "float32"),
    "[32,56,56,192] 5x5 s1 NHWC bf16": ((32, 56, 56, 192), (5, 5, 192, 1), 1, "NHWC", "bfloat16"),
    "[32,112,112,32] 3x3 M2 NHWC bf16": ((32, 112, 112, 32), (3, 3, 32, 2), 1, "NHWC", "bfloat16"),
    "[8,64,64,32] 7x7 s1 NHWC f32": ((8, 64, 64, 32), (7, 7, 32, 1), 1, "NHWC", "float32"),
    # The example U-Net's narrowest layers (batch 64 of 128x128): few channels.
    "[64,128,128,1] 3x3 s1 NHWC f32": ((64, 128, 128, 1), (3, 3, 1, 1), 1, "NHWC", "float32"),
    "[64,64,64,16] 3x3 s1 NHWC f32": ((64, 64, 64, 16), (3, 3, 16, 1), 1, "NHWC", "float32"),
}
RESAMPLE_CASES = {
    # name: (input shape, scales, mode, dtype)
    "[32,64,256,256] NCHW linear 2x bf16": ((32, 64, 256, 256), (1, 1, 2, 2), "linear", "bfloat16"),
    "[32,256,256,64] NHWC linear 2x bf16": ((32, 256, 256, 64), (1, 2, 2, 1), "linear", "bfloat16"),
    "[32,256,256,64] NHWC linear 0.5x f32": (
        (32, 256, 256, 64),
        (1, 0.5, 0.5, 1),
        "linear",
        "float32",
    ),
    "[32,64,256,256] NCHW linear 1.7x bf16": (
        (32, 64, 256, 256),
        (1, 1, 1.7, 1.7),
        "linear",
        "bfloat16",
    ),
    "[32,64,256,256] NCHW linear 1.7x f32": (
        (32, 64, 256, 256),
        (1, 1, 1.7, 1.7),
        "linear",
        "float32",
    ),
    "[4,32,64,64,64] NCDHW linear 2x f32": (
        (4, 32, 64, 64, 64),
        (1, 1, 2, 2, 2),
        "linear",
        "float32",
    ),
}
# A global load or store in PTX, its vector length and its element's bits:
# ld.global.v4.b32, st.global.b16.
GLOBAL_ACCESS = r"{}\.global(?:\.[\w:]+?)*?(?:\.v(\d))?\.[bfsu](\d+)\b"
GLOBAL_LOAD = re.compile(GLOBAL_ACCESS.format("ld"))
GLOBAL_STORE = re.compile(GLOBAL_ACCESS.format("st"))
# nvdisasm's SASS: a label line, and an instruction line with its address.
SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
SASS_BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA\s+`\((\.L_x_\d+)\)")

# What one streaming multiprocessor of an H100 holds at once (CUDA's occupancy
# rules for compute capability 9.0), and how many an H100 SXM has.
SM_REGISTERS = 65536
SM_WARPS = 64
SM_PROGRAMS = 32
SM_SHARED = 228 * 1024
SHARED_RESERVED = 1024  # per program, by the CUDA runtime
REGISTER_UNIT = 256  # registers are given to a warp in blocks of this many
H100_SMS = 132


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    ir: str  # the Triton IR JAX hands to XLA
    options: dict  # the warps and pipeline stages the kernel asked for
    programs: int  # the size of its grid


def resident(registers: int, warps: int, shared: int) -> int:
    """How many programs of a kernel one SM runs at once."""
    per_warp = math.ceil(registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
    by_registers = SM_REGISTERS // per_warp // warps
    by_shared = SM_SHARED // (shared + SHARED_RESERVED)
    return min(by_registers, SM_WARPS // warps, SM_PROGRAMS, by_shared)


def triton_modules(fn, *args, capability: int) -> list[Kernel]:
    """Every kernel in ``jax.jit(fn)(*args)``, lowered for a CUDA GPU of compute
    capability ``capability`` (90: sm_90a), with the launch options XLA compiles
    it with."""
    from jax._src.pallas.triton import pallas_call_registration as registration
    from jax.experimental.pallas import triton as plgpu

    lower = registration.lowering.lower_jaxpr_to_triton_module
    modules = []

    def recording(*args, **kwargs):
        result = lower(*args, **kwargs)
        text = result.module.operation.get_asm(enable_debug_info=False)
        # The lowering rule has resolved the kernel's CompilerParams (and JAX's
        # defaults for what it left unset) into these locals; nothing public says them.
        rule = sys._getframe(1).f_locals
        options = {"num_warps": rule["num_warps"], "num_stages": rule["num_stages"]}
        name = re.search(r"module @(\w+)", text)[1]
        modules.append(Kernel(name, text, options, math.prod(result.grid)))
        return result

    with contextlib.ExitStack() as patches:
        patches.enter_context(
            mock.patch.object(registration.lowering, "lower_jaxpr_to_triton_module", recording)
        )
        # The default implementation takes the kernels only in a process with a
        # CUDA GPU that compiles them; the GPU aimed at stands in for it.
        aimed_capability = divmod(capability, 10)
        patches.enter_context(
            mock.patch.object(_implementation, "_cuda_capability", lambda: aimed_capability)
        )
        # From JAX 0.11 the lowering asks the local GPU for its compute capability;
        # here there is none, so the GPU aimed at answers. JAX 0.10 does not ask.
        if hasattr(registration, "gpu_info_lib"):
            arch_name = f"{capability // 10}.{capability % 10}"
            aimed_at = plgpu.GpuInfo(
                gpu_version=None, arch_name=arch_name, compute_capability=capability
            )
            patches.enter_context(
                mock.patch.object(registration.gpu_info_lib, "get_gpu_info", lambda: aimed_at)
            )
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    return modules


def depthwise_step(x_shape, f_shape, stride, data_format, dtype):
    """A gradient step through the depthwise kernels: all three of them."""

    def loss(x, f):
        y = jaxgrad.depthwise_conv2d(
            x, f, (stride, stride), "SAME", data_format=data_format, implementation="pallas"
        )
        return jnp.sum(y.astype(jnp.float32) ** 2)

    x = jax.ShapeDtypeStruct(x_shape, jnp.dtype(dtype))
    f = jax.ShapeDtypeStruct(f_shape, jnp.dtype(dtype))
    return jax.grad(loss, (0, 1)), x, f


def resample_step(shape, scales, mode, dtype):
    """A gradient step through the resample kernel: forward and gradient."""

    def loss(x):
        y = jaxgrad.resample(x, scales, mode=mode, implementation="pallas")
        return jnp.sum(y.astype(jnp.float32) ** 2)

    return jax.grad(loss), jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def train_step(batch: int = 64, size: int = 128):
    """The example U-Net's training step with jaxgrad's default implementation."""
    sys.path.insert(0, str(ROOT / "examples"))
    import unet

    def init():
        params = unet.init_params(jax.random.key(0))
        return params, unet.adam_init(params), *unet.make_batch(jax.random.key(1), batch, size)

    def step(params, opt, noisy, clean):
        return unet.train_step(params, opt, noisy, clean, unet.JAXGRAD)

    return step, *jax.eval_shape(init)


def capability_of(arch: str) -> int:
    """The compute capability a ptxas target names: sm_90a -> 90."""
    return int(re.sub(r"\D", "", arch))


def ptxas_for(capability: int) -> str:
    """The ptxas that Triton assembles for this GPU with: Triton 3.9 ships one for
    Hopper and newer beside one for older GPUs, and its API has changed with that."""
    from triton.backends.nvidia import compiler

    try:
        tool = compiler.get_ptxas(capability)
    except TypeError:  # one ptxas for every GPU
        tool = compiler.get_ptxas()
    return str(tool.path if hasattr(tool, "path") else tool[0])


def triton_ir_stage(ir: str, options: dict, target: Any, folder: pathlib.Path) -> str:
    """``ir`` after Triton's first stage of passes (``make_ttir``: inlining,
    canonicalization, combining, CSE), which XLA runs on a kernel's Triton IR
    before its GPU stages, as Triton does on a kernel written in Python.

    ``triton.compile`` of an IR file starts at the stage after the file's own,
    so a ``.ttir`` file skips these: its GPU stages then get the IR as JAX lowered
    it, several times larger (a walk of the filter gradient: 2662 operations
    against 408). The machine code comes out the same (their PTX has the same
    instructions), but Triton's coalescing pass, which walks the operations
    connected to each load and store, took the largest kernels 5-47x as long to
    compile: a compile time no GPU would see."""
    from triton._C.libtriton import ir as triton_ir
    from triton.backends.compiler import Language
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    context = triton_ir.context()
    triton_ir.load_dialects(context)
    backend.load_dialects(context)
    source = folder / "lowered.ttir"
    source.write_text(ir)
    module = triton_ir.parse_mlir_module(str(source), context)
    module.context = context
    stages: dict[str, Any] = {}
    backend.add_stages(stages, backend.parse_options(options), Language.TRITON)
    return str(stages["ttir"](module, {}))


def compile_report(ir: str, options: dict, arch: str, folder: pathlib.Path) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", capability_of(arch), 32)
    # Triton 3.9 warns that 3.10 stops fusing multiplies and adds by default; the
    # report keeps them fused, as every release it has run under did, so that its
    # figures stay comparable from one release to the next.
    options = {**options, "enable_fp_fusion": True}
    start = time.perf_counter()
    source = folder / "kernel.ttir"
    source.write_text(triton_ir_stage(ir, options, target, folder))
    kernel = triton.compile(str(source), target=target, options=options)
    seconds = time.perf_counter() - start
    ptx = kernel.asm["ptx"]
    (folder / "kernel.ptx").write_text(ptx)
    ptxas = ptxas_for(capability_of(arch))
    info = subprocess.run(
        [
            ptxas,
            f"-arch={arch}",
            "-v",
            str(folder / "kernel.ptx"),
            "-o",
            str(folder / "kernel.cubin"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    return {
        "registers": int(re.search(r"Used (\d+) registers", info)[1]),
        "spilled": int(re.search(r"(\d+) bytes spill stores", info)[1]),
        "shared": kernel.metadata.shared,
        "loads": access_widths(ptx),
        "stores": access_widths(ptx, GLOBAL_STORE),
        "seconds": seconds,
    }


def sass(compiled: pathlib.Path, arch: str) -> str | None:
    """The SASS of the kernel ``compile_report`` just compiled in ``compiled`` for
    ``arch``, where Triton ships ``nvdisasm`` beside ``ptxas``."""
    nvdisasm = pathlib.Path(ptxas_for(capability_of(arch))).with_name("nvdisasm")
    if not nvdisasm.exists():
        return None
    return subprocess.run(
        [str(nvdisasm), "-c", str(compiled / "kernel.cubin")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def dump(compiled: pathlib.Path, folder: pathlib.Path, name: str, arch: str) -> None:
    """Copies the kernel ``compile_report`` just compiled in ``compiled`` for
    ``arch`` to ``folder`` as ``name``.ptx, and its SASS as ``name``.sass."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^\w.-]+", "_", name).strip("_")
    (folder / f"{stem}.ptx").write_text((compiled / "kernel.ptx").read_text())
    text = sass(compiled, arch)
    if text is not None:
        (folder / f"{stem}.sass").write_text(text)


def multiply_add_loops(text: str) -> list[tuple[int, int]]:
    """The loops of a kernel's SASS ``text`` that multiply and add, in order, as
    (instructions, float32 multiply-adds) of one pass of each: a loop runs from
    the label a branch jumps back to, through that branch (a loop that leaves by a
    conditional exit jumps back unconditionally), and counts every instruction
    between, whichever branches inside it a pass takes."""
    labels: dict[str, int] = {}
    instructions: list[tuple[int, str]] = []
    pending = None
    for line in text.splitlines():
        label = SASS_LABEL.match(line)
        if label:
            pending = label.group(1)
            continue
        found = SASS_INSTRUCTION.search(line)
        if found:
            address = int(found.group(1), 16)
            instructions.append((address, found.group(2)))
            if pending is not None:
                labels[pending], pending = address, None
    loops = []
    for address, instruction in instructions:
        branch = SASS_BRANCH.match(instruction)
        if branch and labels.get(branch.group(1), address) < address:
            start = labels[branch.group(1)]
            body = [op for at, op in instructions if start <= at <= address]
            fmas = sum(re.search(r"\bFFMA\b", op) is not None for op in body)
            if fmas:
                loops.append((len(body), fmas))
    return loops


def access_widths(ptx: str, access: re.Pattern[str] = GLOBAL_LOAD) -> str:
    """The global loads (or the ``access`` given) of ``ptx`` by the bytes one
    thread moves, widest first: ``16B x 9, 4B x 3``."""
    widths = [int(vector or 1) * int(bits) // 8 for vector, bits in access.findall(ptx)]
    return ", ".join(f"{w}B x {widths.count(w)}" for w in sorted(set(widths), reverse=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a", help="the ptxas target (H100: sm_90a)")
    parser.add_argument("--sms", type=int, default=H100_SMS, help="the GPU's multiprocessors")
    parser.add_argument(
        "--train-step",
        action="store_true",
        help="the example U-Net training step's kernels, and their lowering and compile times",
    )
    parser.add_argument(
        "--reuse-rows",
        action="store_true",
        help="the depthwise kernels keep the input rows consecutive rows share in registers",
    )
    parser.add_argument(
        "--taps",
        type=int,
        help="the filter taps every depthwise kernel holds in registers at most",
    )
    parser.add_argument(
        "--read-ahead",
        action="store_true",
        help="the depthwise kernels read their next row before they compute the current one",
    )
    parser.add_argument(
        "--walk-columns",
        action="store_true",
        help="the NHWC kernels walk their rows' columns in order",
    )
    parser.add_argument(
        "--walk-grid-warps",
        type=int,
        metavar="N",
        help="a walk's grid makes N warps at least (its rows cut into segments)",
    )
    parser.add_argument(
        "--aligned-reads",
        action="store_true",
        help="the NCHW depthwise kernels read unaligned runs of columns from aligned vectors",
    )
    parser.add_argument(
        "--tables",
        action="store_true",
        help="the resample kernel reads its columns through the tables: no pairs, no rows "
        "held together",
    )
    parser.add_argument(
        "--rows-together",
        action="store_true",
        help="every resample program of one channel holds its rows as one tile, long rows too",
    )
    parser.add_argument(
        "--row-pattern",
        action="store_true",
        help="the resample kernel reads the rows of a repeating row axis in blocks of periods",
    )
    parser.add_argument(
        "--dump",
        metavar="DIR",
        help="write each kernel's PTX and SASS to this folder",
    )
    parser.add_argument(
        "--loops",
        action="store_true",
        help="each multiply-add loop's instructions and multiply-adds, from the SASS",
    )
    args = parser.parse_args()
    try:
        import triton
    except ImportError:
        raise SystemExit("kernel_report.py needs the triton package: pip install triton") from None
    loops_column = " loop instructions / multiply-adds |" if args.loops else ""
    print(
        "| case | kernel | registers | spilled bytes | shared bytes | global loads "
        f"| global stores | programs | per SM | waves | Triton s |{loops_column}"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.loops else ""))
    if args.train_step:
        steps = [("U-Net step, batch 64 of 128x128", train_step())]
    else:
        steps = [(case, depthwise_step(*c)) for case, c in DEPTHWISE_CASES.items()]
        steps += [(case, resample_step(*c)) for case, c in RESAMPLE_CASES.items()]
    lowering = compiling = 0.0
    kernels = 0
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as patches:
        imposed = {"reuse_rows": True} if args.reuse_rows else {}
        if args.taps is not None:
            imposed["taps"] = args.taps
        if args.read_ahead:
            imposed["read_ahead"] = True
        if args.walk_columns:
            imposed["walk_columns"] = True
        if args.walk_grid_warps is not None:
            imposed["walk_grid_warps"] = args.walk_grid_warps
        if args.aligned_reads:
            imposed["aligned_reads"] = True
        resample_options = {"paired": False, "rows_together": False} if args.tables else {}
        if args.rows_together:
            resample_options["rows_together"] = True
        if args.row_pattern:
            resample_options["row_pattern"] = True
        for module, fields in ((depthwise_kernels, imposed), (resample_kernels, resample_options)):
            if fields:
                patches.enter_context(gpu.launches_with(module, fields))
        for case, (fn, *fn_args) in steps:
            start = time.perf_counter()
            modules = triton_modules(fn, *fn_args, capability=capability_of(args.arch))
            lowering += time.perf_counter() - start
            kernels += len(modules)
            for number, kernel in enumerate(modules):
                r = compile_report(kernel.ir, kernel.options, args.arch, pathlib.Path(tmp))
                if args.dump:
                    name = f"{case} {number} {kernel.name}"  # a case's kernels in order
                    dump(pathlib.Path(tmp), pathlib.Path(args.dump), name, args.arch)
                compiling += r["seconds"]
                per_sm = resident(r["registers"], kernel.options["num_warps"], r["shared"])
                waves = kernel.programs / (per_sm * args.sms)
                loops = ""
                if args.loops:
                    text = sass(pathlib.Path(tmp), args.arch)
                    found = multiply_add_loops(text) if text is not None else []
                    loops = " " + ", ".join(f"{n} / {f}" for n, f in found) + " |"
                print(
                    f"| {case} | {kernel.name} | {r['registers']} | {r['spilled']} "
                    f"| {r['shared']} | {r['loads']} | {r['stores']} "
                    f"| {kernel.programs} | {per_sm} | {waves:.2f} | {r['seconds']:.1f} |{loops}",
                    flush=True,
                )
    print(
        f"\n{kernels} kernels: lowered for CUDA in {lowering:.1f} s, compiled by Triton "
        f"{triton.__version__} in {compiling:.1f} s (this machine's CPU; Triton's cache "
        "makes a second run faster)."
    )


if __name__ == "__main__":
    sys.exit(main())
