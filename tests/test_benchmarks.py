"""The GPU benchmark runs: ``benchmarks/gpu.py --smoke`` takes a few tiny cases
through every section on the CPU (kernels interpreted; the PyTorch peers on the
CPU where PyTorch is installed), so the script a GPU machine runs is not first
tried there."""

import dataclasses
import functools
import importlib.util
import json
import math
import pathlib
import re
import shlex
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    H100_CAPABILITY,
    SUITE_XLA_FLAGS,
    TRITON_CALL,
    as_jax_defaults,
    gpu_stand_in,
    needs_kernels,
    run_script,
)

import jaxgrad
from jaxgrad import _implementation

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"


@needs_kernels
def test_gpu_benchmark_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    result = run_script("benchmarks/gpu.py", "--smoke", "--skip-determinism", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads(out.read_text())
    for section, timed in (("correctness", "speed"), ("resample_correctness", "resample_speed")):
        rows = results[section]
        # Every timed program's result is checked; float16, checked but not timed,
        # in both implementations on small arrays.
        checked = {(row["impl"], row["op"]) for row in rows if row["dtype"] == "float32"}
        for row in results[timed]:
            split = section == "correctness" and row["op"] == "backward"  # its two gradients
            ops = ["backward: input", "backward: filter"] if split else [row["op"]]
            for label in ("default", "xla", "pallas"):
                assert all((label, op) in checked for op in ops), (section, label, row["op"])
        assert {row["impl"] for row in rows if row["dtype"] == "float16"} == {"xla", "pallas"}
        # Against float64, both implementations are accurate to rounding.
        for dtype, bound in (("float32", 1e-6), ("float16", 1e-3)):
            assert max(row["error"] for row in rows if row["dtype"] == dtype) < bound, section
    has_torch = importlib.util.find_spec("torch") is not None
    for section in ("speed", "resample_speed"):
        row = results[section][0]
        assert all(row[f"jaxgrad {label}"] > 0 for label in ("default", "xla", "pallas"))
        # PyTorch is an optional peer: timed where it is installed, left out elsewhere.
        assert (row["torch"] is not None) == has_torch, section
    assert {row["op"] for row in results["resample_speed"]} == {"forward", "backward"}
    assert "| default / roofline |" in result.stdout
    # Each timed row keeps what it cost, compiles included: the rows of a section
    # add up to at most the section's wall time (kept to a tenth of a second), and
    # the phases of a row to at most the row's; the first row of a case holds
    # jaxgrad's programs, every row its peers and rounds.
    for section in ("speed", "resample_speed"):
        seconds = [row["seconds"] for row in results[section]]
        assert all(s > 0 for s in seconds) and sum(seconds) <= results["seconds"][section] + 0.05
        assert results[section][0]["phases"]["jaxgrad's programs"] > 0
        for row in results[section]:
            assert row["phases"]["peers and rounds"] > 0
            assert sum(row["phases"].values()) <= row["seconds"]
    assert "Where speed's seconds went: " in result.stdout


# The launch fields of a walk's shape, and the group of tune.py's search that tries them.
WALK_SHAPE = {"walk_channels": "walk tile", "walk_grid_warps": "walk grid"}


@needs_kernels
def test_tune_smoke(tmp_path, monkeypatch):
    """``benchmarks/tune.py --smoke`` searches launches of both kernel families on a
    tiny case (a gradient of each, the ops ``--ops`` names): each op starts from the
    launch jaxgrad picks, and every candidate it compiled under a patched launch was
    really given that launch (its result is checked, and it is timed)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    has_torch = importlib.util.find_spec("torch") is not None
    out = tmp_path / "tune.json"
    ops = ["backprop_filter", "backward"]
    result = run_script("benchmarks/tune.py", "--smoke", "--ops", *ops, "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {(row["family"], row["op"]) for row in rows} == {
        ("depthwise", "backprop_filter"),
        ("depthwise", "backward"),  # the forward op's, both gradients
        ("resample", "backward"),
    }
    for row in rows:
        launches = [c["launch"] for c in row["candidates"]]
        assert launches[0] == row["current"] and row["best"] in launches
        # One other launch per group of parameters the family's kernels have, each
        # different: the patch took effect. A walk's tile and grid are searched where
        # the launch walks, or where walking was the faster in the group before them.
        groups = [g for g in tune.GROUPS if len(tune.neighbours(row["current"], g)) > 1]
        walking = bool(row["current"].get("walk_columns"))  # then two groups more
        assert len(groups) == {"depthwise": 9 + 2 * walking, "resample": 5}[row["family"]]
        walked = [launch for launch in launches if launch.get("walk_columns")]
        # Whether the best launch walked when each group's turn came.
        searched = sum(len({w[name] for w in walked}) > 1 for name in WALK_SHAPE)
        distinct = {tuple(sorted(launch.items())) for launch in launches}
        assert len(distinct) == 1 + len(set(groups) - set(WALK_SHAPE.values())) + searched
        # The kernels give the same results under every launch, to rounding.
        assert all(c["agrees"] and c["ms"] > 0 for c in row["candidates"])
        # The peers were timed beside the launches; PyTorch only where it is installed.
        jax_peer = {"depthwise": "lax", "resample": "jax.image"}[row["family"]]
        assert row["peers_ms"][jax_peer] > 0
        assert any(name.startswith("torch") for name in row["peers_ms"]) == has_torch
    # Each row names its fastest peer (PyTorch's or JAX's, whichever ran faster).
    assert "| current launch |" in result.stdout
    assert all(f"| {tune.fastest_peer(row)[0]} |" in result.stdout for row in rows)


def test_tune_and_compare_reach_the_named_cases_through_cases_alone(monkeypatch):
    """The cases outside benchmarks/gpu.py's tables (a 7x7 and a wide 5x5 filter,
    8x and 4x upsamplings) are built only where ``--cases`` asks for cases: a run
    without it times gpu.py's cases, as it always did."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    names = {
        "depthwise": ["[32,56,56,96] 7x7 s1", "[32,112,112,32] 5x5 s1"],
        "resample": ["linear 8.0x", "linear 4.0x"],
    }
    for family, family_names in names.items():
        plain = [case for case, _, _ in tune.CASES[family](False)]
        named = [case for case, _, _ in tune.CASES[family](False, named=True)]
        for name in family_names:
            assert not any(name in case for case in plain)
            assert any(name in case for case in named)
        assert [case for case in named if not any(n in case for n in family_names)] == plain
        assert [case for case, _, _ in tune.CASES[family](True, named=True)] == [
            case for case, _, _ in tune.CASES[family](True)
        ]  # a smoke run keeps its tiny case


def test_tune_knows_every_launch_field(monkeypatch):
    """``benchmarks/tune.py`` imposes a launch by its fields: a field a kernel
    family's launch gains must be one tune.py reads, or every candidate would run
    that field as chosen today, and the search would time one launch under
    several names."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import dataclasses
    import types

    import tune

    for family, module in tune.FAMILIES.items():
        fields = {f.name for f in dataclasses.fields(module._Launch)} - {"interpret"}
        launch = types.SimpleNamespace(**dict.fromkeys(fields, 1))
        assert set(tune.fields_of(launch)) == fields, family


def test_tune_searches_a_walks_tile_where_the_kernels_walk(monkeypatch):
    """The "walk tile" group tries a walk's channels only where the best launch
    so far walks: elsewhere the field changes no program."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    tiled = dict(cols=16, channels=32, rows=8, warps=4, walk_columns=False, walk_warps=2)
    tiled["walk_channels"] = 32
    assert tune.neighbours(tiled, "walk tile") == [tiled]
    walked = {**tiled, "walk_columns": True}
    assert [n["walk_channels"] for n in tune.neighbours(walked, "walk tile")] == [16, 32, 64]
    assert "walked on 2 warps by 64 channels" in tune.label({**walked, "walk_channels": 64})


def test_tune_searches_a_walks_grid_where_the_kernels_walk(monkeypatch):
    """The "walk grid" group tries the warps a walk's grid makes at least only
    where the best launch so far walks, from the default up."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    tiled = dict(cols=16, channels=32, rows=8, warps=4, walk_columns=False, walk_warps=1)
    tiled["walk_grid_warps"] = 1024
    assert tune.neighbours(tiled, "walk grid") == [tiled]
    walked = {**tiled, "walk_columns": True, "walk_channels": 32}
    grids = [n["walk_grid_warps"] for n in tune.neighbours(walked, "walk grid")]
    assert grids == [1024, 2048, 4096, 8192]
    assert "in 4096 warps or more" in tune.label({**walked, "walk_grid_warps": 4096})


@needs_kernels
def test_tune_searches_only_the_groups_asked_for(monkeypatch):
    """``--groups`` narrows a search to some groups of parameters: with "read ahead"
    alone, the current launch and the one that differs from it in that option
    alone are timed, and the final row times the faster against the current."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    [(_, _, build)] = [c for c in tune.CASES["depthwise"](True) if c[1] == "backprop_filter"]
    row = tune.search(
        tune.FAMILIES["depthwise"], build()["backprop_filter"], 1, True, ("read ahead",)
    )
    launches = [c["launch"] for c in row["candidates"]]
    assert len(launches) == 2 and row["best"] in launches
    current, other = launches
    assert current == row["current"] and not current["read_ahead"]
    assert other == {**current, "read_ahead": True}
    assert all(c["agrees"] and c["ms"] > 0 for c in row["candidates"])


@needs_kernels
def test_compare_times_the_given_kernels_against_the_librarys(tmp_path, monkeypatch):
    """``benchmarks/compare.py`` runs the ops over the file's kernels: a copy of the
    library's kernels gives the same program (compiled and timed once), a file whose
    forward kernel doubles each term gives other bits; and the library's ops are
    left as they were."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare
    import tune

    from jaxgrad._depthwise import _pallas

    source = pathlib.Path(_pallas.__file__).read_text()
    term = "total = total + item(t) * taps(t, 0)[None, :]"
    assert source.count(term) == 1  # the forward's sum over its taps
    doubled = source.replace(term, term + " * 2")
    [(case, op, build)] = [c for c in tune.CASES["depthwise"](True) if c[1] == "forward"]
    fn, args, _ = build()[op]
    library = compare.compiled(fn, args)[2]
    rows = []
    for name, text in (("same", source), ("doubled", doubled)):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        row = compare.compare("depthwise", compare.load(str(path), "depthwise"), build()[op], 1)
        rows.append({"family": "depthwise", "case": case, "op": name, **row})
    same, changed = rows
    assert same["same_bits"] and same["same_program"]
    assert same["file_ms"] == same["library_ms"]  # timed once
    assert not changed["same_bits"] and not changed["same_program"]
    # The library's ops run the library's kernels again after the swaps.
    assert compare.compiled(fn, args)[2] == library
    table = compare.render(rows)
    assert "| library / file |" in table and "| lax |" in table and "| no |" in table


@needs_kernels
def test_compare_sees_the_same_gpu_program_where_only_lines_moved(tmp_path, monkeypatch):
    """A program lowered for a GPU holds its kernels' Triton code with their source
    locations: ``benchmarks/compare.py`` leaves them out, so a file that differs
    from the library's only in where its lines sit (lines added at its top, another
    path) gives the same program, and the case is timed once, not twice."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare
    import gpu
    import tune

    from jaxgrad._depthwise import _pallas

    path = tmp_path / "moved.py"
    path.write_text("# two lines\n# added\n" + pathlib.Path(_pallas.__file__).read_text())
    [(_, _, build)] = [c for c in tune.CASES["depthwise"](True) if c[1] == "forward"]
    fn, args, _ = build()["forward"]

    def program() -> str:
        with gpu_stand_in():  # JAX 0.11 and later ask the GPU for its capability
            return gpu.canonical(compare.lowered(fn, args, ("cuda",)).compiler_ir("stablehlo"))

    library = program()
    with compare.kernels_from("depthwise", compare.load(str(path), "depthwise")):
        moved = program()
    assert "xla.gpu.triton" in library  # the kernels' code is in the program
    assert moved == library


def test_tables_name_the_cpu_and_the_vector_extensions_its_kernels_use(monkeypatch):
    """A table records the CPU's model and the extensions PyTorch picks its CPU
    kernels by (without AVX-512 its bfloat16 convolutions bypass oneDNN, far
    slower), read from the first CPU in /proc/cpuinfo."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _harness

    def cpu(model, flags):
        return f"processor\t: 0\nmodel name\t: {model}\nflags\t\t: {flags}\n"

    xeon = cpu("Intel Xeon", "fpu sse avx avx2 avx512f avx512_bf16 amx_bf16")
    epyc = cpu("AMD EPYC", "fpu sse avx fma avx2")
    assert _harness.describe_cpu(xeon + "\n" + epyc) == (
        "Intel Xeon (avx2, avx512f, avx512_bf16, amx_bf16)"
    )
    assert _harness.describe_cpu(epyc) == "AMD EPYC (avx2)"
    assert _harness.describe_cpu(cpu("Old", "fpu sse")) == "Old"


@needs_kernels
def test_tune_rules_out_a_launch_that_fails(monkeypatch):
    """A candidate launch that fails to compile or run is recorded with its error
    and never chosen, and the search goes on (a GPU run must not end there)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    [(_, op, build)] = [c for c in tune.CASES["depthwise"](True) if c[1] == "backprop_filter"]
    fn, args, _ = build()[op]
    module = tune.FAMILIES["depthwise"]
    _, want, current = tune.compiled(module, fn, args)
    tiled = {**current, "walk_columns": False}  # a walk takes its tile's columns from the row
    failed = tune.candidate(module, fn, args, {**tiled, "cols": 0}, want, args[0].dtype)
    assert not failed["agrees"] and failed["error"].startswith("ZeroDivisionError")
    assert tune.candidate(module, fn, args, current, want, args[0].dtype)["agrees"]
    row = {"family": "depthwise", "case": "tiny", "op": op, "current": current, "best": current}
    row.update(current_ms=1.0, best_ms=1.0, candidates=[failed])
    assert "ZeroDivisionError" in tune.render([row])


def test_kernel_report_counts_the_multiply_add_loops_of_sass(monkeypatch):
    """``kernel_report.py --loops`` reads each loop of a kernel's SASS from the
    label a branch jumps back to through that branch: its instructions and
    float32 multiply-adds (predicated ones too), whichever branches inside it a
    pass takes. A loop without multiply-adds, a branch forward, and the trap
    that jumps to itself after the exit are no such loop."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_report

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E.64 R4, desc[UR4][R2.64] ;
        /*0020*/                   FFMA R6, R4, R5, R6 ;
        /*0030*/               @P1 FFMA R7, R4, R5, R7 ;
        /*0040*/                   IADD3 R2, R2, 0x8, RZ ;
        /*0050*/               @P0 BRA `(.L_x_0) ;
        /*0060*/               @P2 BRA `(.L_x_2) ;
.L_x_1:
        /*0070*/                   IADD3 R8, R8, 0x1, RZ ;
        /*0080*/              @!P3 BRA `(.L_x_1) ;
.L_x_2:
        /*0090*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*00a0*/              @!P4 BRA `(.L_x_3) ;
        /*00b0*/                   FFMA R6, R4, R5, R6 ;
.L_x_3:
        /*00c0*/                   IADD3 R2, R2, 0x4, RZ ;
        /*00d0*/              @!P5 EXIT ;
        /*00e0*/                   BRA `(.L_x_2) ;
.L_x_4:
        /*00f0*/                   BRA `(.L_x_4);
"""
    assert kernel_report.multiply_add_loops(sass) == [(5, 2), (6, 1)]


def test_kernel_report_reads_access_widths_and_occupancy(monkeypatch):
    """What ``benchmarks/kernel_report.py`` reads from a compiled kernel, checked
    on known inputs (compiling needs the optional ``triton`` package; this does not)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_report

    ptx = """
        ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
        @%p1 ld.global.L1::evict_last.v2.b32 { %r5, %r6 }, [ %rd2 + 0 ];
        @%p2 ld.global.b32 { %r7 }, [ %rd3 + 0 ];
        ld.global.b16 { %rs1 }, [ %rd4 + 0 ];
        ld.global.v4.b32 { %r8, %r9, %r10, %r11 }, [ %rd5 + 0 ];
        st.global.v4.b32 [ %rd6 + 0 ], { %r1, %r2, %r3, %r4 };
        ld.shared.b32 %r12, [ %r13 ];
    """
    assert kernel_report.access_widths(ptx) == "16B x 2, 8B x 1, 4B x 1, 2B x 1"
    assert kernel_report.access_widths(ptx, kernel_report.GLOBAL_STORE) == "16B x 1"
    # CUDA's occupancy on an H100: registers go to warps in blocks of 256.
    assert kernel_report.resident(registers=64, warps=4, shared=0) == 8
    assert kernel_report.resident(registers=72, warps=4, shared=0) == 7
    assert kernel_report.resident(registers=32, warps=4, shared=0) == 16  # 64 warps at most
    assert kernel_report.resident(registers=16, warps=1, shared=0) == 32  # 32 programs at most
    assert kernel_report.resident(registers=32, warps=4, shared=100 * 1024) == 2  # shared memory
    assert kernel_report.capability_of("sm_90a") == 90


def test_kernel_report_dumps_each_kernels_ptx_and_sass(monkeypatch, tmp_path):
    """``--dump`` copies a compiled kernel's PTX under a name made of its case and
    kernel, and disassembles its cubin with the ``nvdisasm`` beside ``ptxas``; a
    Triton without one gets the PTX alone."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_report

    compiled, tools, out = tmp_path / "compiled", tmp_path / "bin", tmp_path / "out"
    compiled.mkdir()
    tools.mkdir()
    (compiled / "kernel.ptx").write_text(".version 8.7\n")
    (compiled / "kernel.cubin").write_bytes(b"\x7fELF")
    monkeypatch.setattr(kernel_report, "ptxas_for", lambda capability: str(tools / "ptxas"))
    kernel_report.dump(compiled, out, "[32,112,112,96] 3x3 s1 NCHW f32 0 _forward_kernel", "sm_90a")
    stem = "32_112_112_96_3x3_s1_NCHW_f32_0__forward_kernel"
    assert sorted(p.name for p in out.iterdir()) == [f"{stem}.ptx"]
    assert (out / f"{stem}.ptx").read_text() == ".version 8.7\n"
    nvdisasm = tools / "nvdisasm"
    nvdisasm.write_text('#!/bin/sh\necho "disassembled $2"\n')
    nvdisasm.chmod(0o755)
    kernel_report.dump(compiled, out, "[32,112,112,96] 3x3 s1 NCHW f32 0 _forward_kernel", "sm_90a")
    assert (out / f"{stem}.sass").read_text() == f"disassembled {compiled / 'kernel.cubin'}\n"


def kernel_sweep_with(monkeypatch, compile_report):
    """benchmarks/kernel_sweep.py, with ``compile_report`` standing in for Triton
    and ptxas (CI has no ``triton``): JAX's lowering for CUDA still runs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_report
    import kernel_sweep

    monkeypatch.setattr(kernel_report, "compile_report", compile_report)
    return kernel_sweep


def test_kernel_sweep_says_what_it_needs():
    # Without the triton package (CI has none) it stops at once and says how to get it.
    result = run_script("benchmarks/kernel_sweep.py", "--count", "1", "--family", "resample")
    if result.returncode == 0:  # a machine with triton compiled the configuration
        assert "1 configurations, 1 compiled" in result.stdout
        return
    assert "kernel_sweep.py needs the triton package: pip install triton" in result.stderr


def test_kernel_sweep_draws_each_configuration_from_its_number_and_the_seed(monkeypatch):
    """So that a run can name what it found, and ``--start N --count 1`` builds it again."""
    sweep = kernel_sweep_with(monkeypatch, None)
    for family in sweep.FAMILIES:
        calls = [sweep.drawn(family, number, seed=0).call for number in range(8)]
        assert [sweep.drawn(family, number, seed=0).call for number in range(8)] == calls
        assert len(set(calls)) == 8
        assert sweep.drawn(family, 3, seed=1).call != calls[3]


def test_kernel_sweep_draws_every_launch_the_lowering_properties_draw(monkeypatch):
    """The sweep takes to Triton and ptxas at least the launch options the suite's
    lowering properties take through JAX's lowering: an option added to those is
    swept too."""
    from test_depthwise_implementations import LOWERED_LAUNCHES
    from test_resample_implementations import LOWERED_OPTIONS

    sweep = kernel_sweep_with(monkeypatch, None)
    assert all(fields in sweep.DEPTHWISE_LAUNCHES for fields in LOWERED_LAUNCHES)
    assert all(fields in sweep.RESAMPLE_LAUNCHES for fields in LOWERED_OPTIONS)


@needs_kernels
def test_kernel_sweep_compiles_every_kernel_of_a_step_with_its_launch(monkeypatch):
    """A drawn step reaches every kernel of its family, each compiled under the
    launch fields the configuration sets."""
    compiled = []

    def compile_report(ir, options, arch, folder):
        compiled.append((re.search(r"module @(\w+)", ir)[1], options["num_warps"], arch))
        return {"registers": 40, "spilled": 0, "seconds": 0.5}

    sweep = kernel_sweep_with(monkeypatch, compile_report)
    config = sweep.drawn("depthwise", 0, seed=0)
    tiled = {"warps": 1, "walk_columns": False}
    record = sweep.compiled(dataclasses.replace(config, launch=tiled), "sm_90a")
    kernels = ["_forward_kernel", "_input_kernel", "_partials_kernel", "_sum_kernel"]
    assert [k["name"] for k in record["kernels"]] == kernels
    assert [(name, arch) for name, _, arch in compiled] == [(k, "sm_90a") for k in kernels]
    # The sum of partials has its own launch; every other kernel takes the fields.
    assert [warps for _, warps, _ in compiled][:3] == [1, 1, 1]
    assert "stage" not in record


@needs_kernels
def test_kernel_sweep_names_the_stage_that_refused_and_the_spills(monkeypatch):
    def compile_report(ir, options, arch, folder):
        if "module @_sum_kernel" in ir:
            raise subprocess.CalledProcessError(255, "ptxas", stderr="ptxas fatal: out of range")
        slow = "module @_partials_kernel" in ir
        spills = "module @_input_kernel" in ir
        crowded = "module @_forward_kernel" in ir
        return {
            "registers": 240 if crowded else 80,
            "spilled": 56 if spills else 0,
            "seconds": 25.0 if slow else 0.5,
        }

    sweep = kernel_sweep_with(monkeypatch, compile_report)
    tiled = dataclasses.replace(sweep.drawn("depthwise", 0, seed=0), launch={"walk_columns": False})
    refused = sweep.compiled(tiled, "sm_90a")
    assert refused["stage"] == "ptxas (_sum_kernel)"
    assert "out of range" in refused["error"]
    spilled = sweep.compiled(sweep.drawn("resample", 0, seed=0), "sm_90a")
    assert "stage" not in spilled
    spilled["kernels"][0] |= {"spilled": 56, "seconds": 12.5}

    def lowering_refuses(*args, **kwargs):
        raise AssertionError("('i32', 'i1')")

    monkeypatch.setattr(sweep.kernel_report, "triton_modules", lowering_refuses)
    unlowered = sweep.compiled(sweep.drawn("resample", 1, seed=0), "sm_90a")
    assert unlowered["stage"] == "JAX lowering"
    assert "('i32', 'i1')" in unlowered["error"]
    lines, any_refused = sweep.summary([refused, spilled, unlowered], slow=20)
    assert any_refused
    assert (
        lines[0]
        == f"depthwise #0 refused by ptxas (_sum_kernel): {refused['call']}, "
        + "launch {'walk_columns': False}"
    )
    assert lines[1] == "    ptxas fatal: out of range"
    assert lines[2].startswith("resample #1 refused by JAX lowering")
    found = "\n".join(lines)
    for line in (
        f"depthwise #0 _input_kernel spills 56 bytes at 80 registers: {refused['call']}",
        f"depthwise #0 _partials_kernel took Triton 25.0 s to compile: {refused['call']}",
        f"resample #0 _kernel spills 56 bytes at 80 registers: {spilled['call']}",
        f"depthwise #0 _forward_kernel takes 240 registers: {refused['call']}",
    ):
        assert line in found
    assert "resample #0 _kernel took" not in found  # 12.5 s: under 20
    assert "takes 80 registers" not in found  # under the 200 a run names by default
    roomy = sweep.summary([refused], slow=20, registers=240)[0]
    assert not any("takes" in line for line in roomy)  # 240: not over 240
    assert lines[-1].startswith("3 configurations, 1 compiled")
    assert not sweep.summary([spilled], slow=20)[1]  # a spill is reported, not a refusal


def test_xla_gpu_report_reads_a_compiled_program(monkeypatch):
    """What ``benchmarks/xla_gpu_report.py`` reads from an optimized HLO module: the
    launches of its entry computation, by kind, with the bytes of their operands
    and results (compiling for a GPU needs JAX's CUDA plugin; this does not)."""
    # Set as the script sets them, so that importing it changes no other test's.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import xla_gpu_report as report

    hlo = """HloModule jit_step

%fused_add (param_0: f32[8,4]) -> f32[8,4] {
  ROOT %add = f32[8,4]{1,0} add(%param_0, %param_0)
}

ENTRY %main.9 (x.1: bf16[8,4], f.1: f32[3,4]) -> (f32[8,4], f32[4]) {
  %x.1 = bf16[8,4]{1,0} parameter(0), metadata={op_name="x"}
  %f.1 = f32[3,4]{1,0} parameter(1)
  %loop_add_fusion = f32[8,4]{1,0} fusion(%x.1, %f.1), kind=kLoop, calls=%fused_add
  %triton = f32[4]{0} custom-call(%loop_add_fusion), custom_call_target="__gpu$xla.gpu.triton"
  %conv = (f32[8,4]{1,0}, u8[0]{0}) custom-call(%x.1), custom_call_target="__cudnn$convForward"
  %gte = f32[8,4]{1,0} get-tuple-element(%conv), index=0
  %all-reduce-start = f32[4]{0} all-reduce-start(%triton), replica_groups={}, to_apply=%add
  %all-reduce-done = f32[4]{0} all-reduce-done(%all-reduce-start)
  ROOT %tuple = (f32[8,4]{1,0}, f32[4]{0}) tuple(%gte, %all-reduce-done)
}
"""
    found = report.launches(hlo)
    # bf16[8,4]: 64 bytes; f32[3,4]: 48; f32[8,4]: 128; f32[4]: 16.
    assert [(launch.kind, launch.read, launch.written) for launch in found] == [
        ("fusion", 64 + 48, 128),
        ("triton", 128, 16),
        ("library", 64, 128),
        ("collective", 16, 16),
    ]
    moved = report.summary(found)
    assert moved == {
        "kernels": {"collective": 1, "fusion": 1, "library": 1, "triton": 1},
        "bytes": 112 + 128 + 144 + 192 + 32,
    }
    assert (
        report.cell(moved, least=304) == "1 collective, 1 fusion, 1 library, 1 triton; 0 MB (2.00x)"
    )
    # A program timed as it compiled (the training steps) says how long it took.
    timed = report.timed(lambda: hlo)
    assert timed["bytes"] == moved["bytes"] and timed["compile_s"] >= 0
    assert report.cell(timed | {"compile_s": 20.24}, least=None).endswith("; compiled in 20.2 s")


def test_xla_gpu_report_says_what_it_needs():
    # Without JAX's CUDA plugin (CI has none) it stops at once and says how to get it.
    result = run_script("benchmarks/xla_gpu_report.py", "--sections", "train")
    if result.returncode == 0:  # a machine with the plugin compiled the step
        assert "U-Net step" in result.stdout
        return
    assert "needs JAX's CUDA plugin" in result.stderr
    assert "jax-cuda13-plugin" in result.stderr


def json_of_a_run_cut_short(script, args, tmp_path, monkeypatch):
    """What ``script.main()`` (a smoke run with ``args``) wrote to ``--json`` before
    the failure a test planted in it."""
    out = tmp_path / "out.json"
    monkeypatch.setattr("sys.argv", ["script", "--smoke", *args, "--json", str(out)])
    with pytest.raises(RuntimeError, match="went away"):
        script.main()
    return json.loads(out.read_text())


def gpu_to_narrow(monkeypatch):
    """benchmarks/gpu.py, with copies of the module lists and settings that a run
    narrows in place (``--smoke``, ``--cases``, ``--dtypes``, ...), so that a test's
    run leaves the module as it found it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu

    for name in ("CASES", "DTYPES", "CHECKED_DTYPES", "LAYOUTS"):
        monkeypatch.setattr(gpu, name, list(getattr(gpu, name)))
    monkeypatch.setattr(gpu, "IMPLEMENTATIONS", dict(gpu.IMPLEMENTATIONS))
    monkeypatch.setattr(gpu, "TORCH_DEVICE", gpu.TORCH_DEVICE)
    monkeypatch.setattr(gpu, "THREADS", gpu.THREADS)
    return gpu


def test_gpu_benchmark_compiles_side_by_side_and_keeps_failures(monkeypatch):
    """``side_by_side`` gives each call's result under its key, in the calls'
    order, and a call that fails gives its exception: the others still run."""
    gpu = gpu_to_narrow(monkeypatch)
    monkeypatch.setattr(gpu, "THREADS", 3)

    def fails():
        raise ValueError("no kernel for this case")

    x = jnp.arange(4.0)
    calls = {("a", 1): functools.partial(jax.jit(jnp.sin), x), "fails": fails}
    calls["b"] = functools.partial(jax.jit(lambda x: x * 2), x)
    results = gpu.side_by_side(calls)
    assert list(results) == [("a", 1), "fails", "b"]
    np.testing.assert_array_equal(results["b"], x * 2)
    np.testing.assert_allclose(results[("a", 1)], np.sin(np.arange(4.0)), rtol=1e-6)
    assert gpu.failed(results["fails"]) and "no kernel" in gpu.failure(results["fails"])
    assert not gpu.failed(results["b"])


def test_gpu_benchmark_keeps_what_it_measured_when_cut_short(tmp_path, monkeypatch):
    """``benchmarks/gpu.py --json`` writes every measurement as it is taken: a run
    that fails (or meets a time limit) part way keeps the rows it finished."""
    gpu = gpu_to_narrow(monkeypatch)
    monkeypatch.setattr(gpu, "correctness", lambda rng: [{"impl": "xla", "error": 0.0}])

    def speed_then_failure(*args):
        yield "speed", {"case": "first row"}
        raise RuntimeError("the GPU went away")

    monkeypatch.setattr(gpu, "speed", speed_then_failure)
    results = json_of_a_run_cut_short(gpu, ["--sections", "depthwise"], tmp_path, monkeypatch)
    assert results["correctness"] == [{"impl": "xla", "error": 0.0}]
    assert results["speed"] == [{"case": "first row"}]
    assert results["copy_bandwidth_GBps"] > 0 and "machine" in results


def test_gpu_benchmark_runs_the_cases_asked_for(monkeypatch):
    """``--cases`` keeps the cases whose names contain one of its strings, so that a
    run can be cut into parts that each fit a time limit; a string no case name
    contains stops the run at once."""
    gpu = gpu_to_narrow(monkeypatch)

    assert gpu.chosen("[32,112,112,32] 3x3 s1 M2", []) and gpu.chosen(
        "[32,56,56,192] 5x5 s1", ["5x5", "M2"]
    )
    assert not gpu.chosen("[32,112,112,96] 3x3 s2", ["3x3 s1"])
    [volume] = gpu.resample_cases(smoke=False, only=["NCDHW"])
    assert volume[0] == "NCDHW"
    picked = gpu.resample_cases(smoke=False, only=["NHWC linear 2.0x", "NCHW nearest 0.5x"])
    assert [(c[0], c[3], c[4]) for c in picked] == [
        ("NCHW", "nearest", 0.5),
        ("NHWC", "linear", 2.0),
    ]
    assert len(gpu.resample_cases(smoke=False)) == 13
    monkeypatch.setattr("sys.argv", ["gpu.py", "--smoke", "--cases", "7x7"])
    with pytest.raises(SystemExit, match="no case name contains any of"):
        gpu.main()


def test_gpu_benchmark_checks_resample_where_a_batch_ends(monkeypatch):
    """The timed resample programs are checked on their batch's first and last
    entries: a program that gets the last one wrong shows a large error, and the
    right ones float32's rounding alone."""
    gpu = gpu_to_narrow(monkeypatch)
    monkeypatch.setattr(gpu, "DTYPES", ["float32"])
    assert [int(i) for i in gpu.batch_ends(jnp.arange(32))] == [0, 31]
    assert [int(i) for i in gpu.batch_ends(jnp.arange(1))] == [0]
    timed = gpu.jaxgrad_resample

    def last_entry_wrong(shape, scales, mode, impl):
        ops = timed(shape, scales, mode, impl)
        if impl == "pallas":
            forward = ops["forward"]
            ops["forward"] = lambda x: forward(x).at[-1, 0, 0, 0].add(1.0)
        return ops

    monkeypatch.setattr(gpu, "jaxgrad_resample", last_entry_wrong)
    rows = gpu.resample_speed(jax.random.key(0), 1e9, 1, None, smoke=True, only=["NHWC"])
    errors = {(r["impl"], r["op"]): r["error"] for key, r in rows if key == "resample_correctness"}
    assert errors.pop(("pallas", "forward")) > 1e-2
    assert errors and max(errors.values()) < 1e-6


def test_gpu_benchmark_runs_the_dtypes_and_layouts_asked_for(monkeypatch):
    """``--dtypes`` and ``--layouts`` narrow what is checked and timed, as
    ``--cases`` narrows the cases, and ``--skip-xla-timing`` what is timed: a run
    cut into parts that fit a time limit."""
    import argparse

    gpu = gpu_to_narrow(monkeypatch)
    args = argparse.Namespace(
        dtypes=["float16", "bfloat16"],
        layouts=["NCHW"],
        cases=["3x3 s1"],
        smoke=False,
        skip_xla_timing=True,
    )
    gpu.narrow(args)
    assert gpu.DTYPES == ["bfloat16"]  # float16 is checked, never timed
    assert gpu.CHECKED_DTYPES == ["bfloat16", "float16"]
    assert gpu.LAYOUTS == ["NCHW"]
    assert [case[0] for case in gpu.CASES] == [
        "[32,112,112,96] 3x3 s1",
        "[32,112,112,32] 3x3 s1 M2",
    ]
    assert list(gpu.IMPLEMENTATIONS) == ["default", "pallas"]
    # A row timed without "xla" keeps its column in the table, empty.
    row = {"case": "c", "layout": "NHWC", "dtype": "bfloat16", "op": "forward"}
    row |= {"roofline": 1.0, "torch": None, "lax": 1.0, "default_over_best_peer": 2.0}
    row |= {"jaxgrad default": 2.0, "jaxgrad pallas": 2.0}
    machine = dict.fromkeys(("device", "driver", "jax", "jaxlib", "torch", "triton"), "?")
    table = gpu.render({"machine": machine, "copy_bandwidth_GBps": 1.0, "speed": [row]})
    assert (
        "| c | NHWC | bfloat16 | forward | 1.000 | 2.000 |  | 2.000 | 1.000 |  | 2.00 | 2.00 |"
        in table
    )


@needs_kernels
def test_gpu_benchmark_compiles_a_step_with_the_columns_tiled(monkeypatch):
    """The U-Net step's variant with no depthwise kernel walking its columns is
    compiled under that launch, and only it: the library's launches are back once
    it is compiled, and its result is the walking kernels' to rounding."""
    from unittest import mock

    from jaxgrad._depthwise import _pallas

    gpu = gpu_to_narrow(monkeypatch)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 6, 20, 8)), jnp.float32)
    dy = jnp.asarray(rng.normal(size=(2, 6, 20, 8)), jnp.float32)

    def filter_gradient(x, dy):
        return jaxgrad.depthwise_conv2d_backprop_filter(
            x, (3, 3, 8, 1), dy, (1, 1), "SAME", implementation="pallas"
        )

    chosen = _pallas._launch
    walk = mock.patch.object(_pallas, "_walk_partials_kernel", wraps=_pallas._walk_partials_kernel)
    with walk as walked:
        call = gpu.compiled_with_columns_tiled(filter_gradient, x, dy)
    assert walked.call_count == 0
    assert _pallas._launch is chosen
    with walk as walked:
        want = filter_gradient(x, dy)
    assert walked.call_count > 0  # the library's launch walks a 3x3 filter's columns
    np.testing.assert_allclose(np.asarray(call()), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_gpu_benchmark_runs_the_cross_process_check_alone(tmp_path, monkeypatch):
    """``--sections determinism`` runs the check across fresh processes and no
    other section: a lease of a GPU can give it a call of its own."""
    gpu = gpu_to_narrow(monkeypatch)

    def not_run(*args):
        raise AssertionError("a section that was not asked for ran")

    for name in ("correctness", "speed", "resample_correctness", "resample_speed", "train_step"):
        monkeypatch.setattr(gpu, name, not_run)
    monkeypatch.setattr(gpu, "start_determinism", lambda: ["a process"])
    monkeypatch.setattr(
        gpu, "finish_determinism", lambda started: {"processes": 3, "bit_patterns": {"relu": 1}}
    )
    monkeypatch.setattr(gpu, "copy_bandwidth", lambda size: 1e12)
    monkeypatch.setattr(gpu.jax, "default_backend", lambda: "gpu")  # as on a GPU machine
    out = tmp_path / "out.json"
    monkeypatch.setattr("sys.argv", ["gpu.py", "--sections", "determinism", "--json", str(out)])
    gpu.main()
    results = json.loads(out.read_text())
    assert results["determinism"] == {"processes": 3, "bit_patterns": {"relu": 1}}
    assert list(results["seconds"]) == ["determinism"]


def test_gpu_benchmark_compiles_one_at_a_time_what_xla_tunes_by_timing(monkeypatch):
    """On a GPU, programs that XLA compiles as written (jaxgrad's, kernels or not)
    compile side by side; a program XLA may tune by timing it on the device (one
    with a convolution, a matrix product, a reduction or a library's custom
    call) compiles alone, as does a call that is no JAX program. On the CPU
    nothing is tuned by timing."""
    gpu = gpu_to_narrow(monkeypatch)
    texts = {
        "kernels": f"stablehlo.custom_call @{gpu.KERNEL_CALL}(%0)",
        "elementwise": "stablehlo.add %0, %1 stablehlo.reduce_precision %2",
        "reduction": "stablehlo.reduce(%0 init: %1)",
        "windowed reduction": "stablehlo.reduce_window",
        "convolution": "stablehlo.convolution(%0, %1)",
        "matrix product": "stablehlo.dot_general %0, %1",
        "library": f"stablehlo.custom_call @{gpu.KERNEL_CALL}(%0) stablehlo.custom_call @cublas",
        "torch": None,
    }
    calls = {name: functools.partial(str, name) for name in texts}
    assert not any(gpu.tuned_by_timing(call) for call in calls.values())
    monkeypatch.setattr(gpu.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(gpu, "_stablehlo", lambda call: texts[call()])
    together = []
    side_by_side = gpu.side_by_side
    monkeypatch.setattr(gpu, "side_by_side", lambda c: together.extend(c) or side_by_side(c))
    assert gpu.first_results(calls) == {name: name for name in texts}
    assert together == ["kernels", "elementwise"]


def test_gpu_benchmark_compiles_the_portable_programs_side_by_side_on_a_gpu(monkeypatch):
    """The portable implementation's programs, lowered for a CUDA GPU as gpu.py
    builds them, hold nothing XLA tunes by timing (their sums are elementwise adds
    there), in every depthwise op, layout, stride and multiplier and every
    resample mode and scale; the peers' programs with convolutions (lax's, on
    cuDNN) or matrix products (jax.image's linear VJP) do. (The kernel programs
    are the patched text above: lowering them all for CUDA is slow here.)"""
    gpu = gpu_to_narrow(monkeypatch)
    monkeypatch.setattr(gpu.jax, "default_backend", lambda: "gpu")

    def for_cuda(call):  # as gpu.py reads a program on a GPU: canonicalized
        lowered = call.func.trace(*call.args).lower(lowering_platforms=("cuda",))
        return gpu.canonical(lowered.compiler_ir("stablehlo"))

    monkeypatch.setattr(gpu, "_stablehlo", for_cuda)
    x = jnp.ones((2, 12, 10, 4), jnp.bfloat16)
    ours, peers = [], []
    for fmt, (fh, fw, m), stride in (("NHWC", (3, 3, 1), 1), ("NCHW", (5, 5, 2), 2)):
        xj, f = jnp.asarray(gpu.in_layout(x, fmt)), jnp.ones((fh, fw, 4, m), x.dtype)
        ops = gpu.jaxgrad_ops(fmt, xj.shape, f.shape, stride, "xla")
        dy = jnp.ones(jax.eval_shape(ops["forward"], xj, f).shape, x.dtype)
        ours += [functools.partial(fn, *args) for _, fn, args in gpu._named(ops, xj, f, dy)]
        peer = gpu.lax_ops(fmt, 4, m, stride)
        peers.append(functools.partial(peer["forward"], xj, f))
        peers += [functools.partial(peer[op], xj, f, dy) for op in gpu.OPS if op != "forward"]
    for mode in ("nearest", "linear"):
        for scale in gpu.RESAMPLE_SCALES:
            scales, out = gpu.resample_shapes(x.shape, (1, 2), scale)
            dy = jnp.ones(out, x.dtype)
            ops = gpu.jaxgrad_resample(x.shape, scales, mode, "xla")
            ours += [functools.partial(ops["forward"], x), functools.partial(ops["backward"], dy)]
            if mode == "linear":  # matrix products (nearest: a scatter, compiled as written)
                peers.append(
                    functools.partial(gpu.image_resize(x.shape, out, mode)["backward"], x, dy)
                )
    assert not [call.func for call in ours if gpu.tuned_by_timing(call)]
    assert all(gpu.tuned_by_timing(call) for call in peers)


def test_gpu_benchmark_checks_float16_while_the_processes_run(tmp_path, monkeypatch):
    """The fresh processes start first, the float16 checks (which time nothing) run
    while they do, and the timed sections wait for them: nothing else runs on
    the GPU while a time is taken. The check's seconds count from its start."""
    gpu = gpu_to_narrow(monkeypatch)
    events = []

    def checks(*args):
        events.append("float16 checks")
        time.sleep(0.2)
        return []

    def timed(*args):
        events.append("timed")
        yield from ()

    monkeypatch.setattr(gpu, "start_determinism", lambda: events.append("start") or ["a process"])
    monkeypatch.setattr(
        gpu,
        "finish_determinism",
        lambda started: events.append("finish") or {"processes": 3, "bit_patterns": {}},
    )
    monkeypatch.setattr(gpu, "correctness", checks)
    monkeypatch.setattr(gpu, "resample_correctness", checks)
    monkeypatch.setattr(gpu, "speed", timed)
    monkeypatch.setattr(gpu, "resample_speed", timed)
    monkeypatch.setattr(gpu, "copy_bandwidth", lambda size: events.append("copy") or 1e12)
    monkeypatch.setattr(gpu.jax, "default_backend", lambda: "gpu")  # as on a GPU machine
    out = tmp_path / "out.json"
    sections = ["determinism", "depthwise", "resample"]
    monkeypatch.setattr("sys.argv", ["gpu.py", "--sections", *sections, "--json", str(out)])
    gpu.main()
    assert events == [
        "start",
        "float16 checks",
        "float16 checks",
        "finish",
        "copy",
        "timed",
        "timed",
    ]
    seconds = json.loads(out.read_text())["seconds"]
    assert seconds["determinism"] >= seconds["untimed_dtypes"] > 0


def test_gpu_benchmark_leaves_no_process_behind_when_a_check_fails(tmp_path, monkeypatch):
    """A run that ends in the float16 checks kills the fresh processes it started
    beside them: none is left on the GPU."""
    gpu = gpu_to_narrow(monkeypatch)
    killed = []

    class Process:
        def kill(self):
            killed.append(self)

    def checks(*args):
        raise RuntimeError("the GPU went away")

    monkeypatch.setattr(gpu, "start_determinism", lambda: [Process(), Process()])
    monkeypatch.setattr(gpu, "correctness", checks)
    monkeypatch.setattr(gpu.jax, "default_backend", lambda: "gpu")  # as on a GPU machine
    sections = ["determinism", "depthwise"]
    monkeypatch.setattr("sys.argv", ["gpu.py", "--sections", *sections])
    with pytest.raises(RuntimeError, match="went away"):
        gpu.main()
    assert len(killed) == 2


def test_tune_keeps_the_rows_it_searched_when_cut_short(tmp_path, monkeypatch):
    """``benchmarks/tune.py --json`` writes each op's search as it ends."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tune

    searched = []

    def search_then_failure(*args):
        if searched:
            raise RuntimeError("the GPU went away")
        searched.append(1)
        launch = {"cols": 1, "channels": 1, "rows": 1, "warps": 4}
        return {
            "current": launch,
            "best": launch,
            "current_ms": 1.0,
            "best_ms": 1.0,
            "peers_ms": {},
        }

    monkeypatch.setattr(tune, "search", search_then_failure)
    [row] = json_of_a_run_cut_short(tune, ["--family", "depthwise"], tmp_path, monkeypatch)["rows"]
    assert row["family"] == "depthwise" and row["current_ms"] == 1.0


def test_gpu_benchmark_times_the_others_when_one_call_fails(monkeypatch, capsys):
    """A call that fails (a peer without a kernel for a case, say) is timed as NaN
    with its error printed, and the other calls of its row are still timed."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu

    def failing():
        raise NotImplementedError("no kernel for this case\nmore detail")

    ms = gpu.rounds_ms({"ours": lambda: jnp.ones(3) * 2, "peer": failing}, rounds=2, per_round=1)
    assert list(ms) == ["ours", "peer"]
    assert ms["ours"] > 0 and math.isnan(ms["peer"])
    assert "peer failed: NotImplementedError: no kernel for this case" in capsys.readouterr().out
    assert math.isnan(gpu.rounds_ms({"peer": failing}, rounds=2)["peer"])  # every call failing


def test_gpu_benchmark_charges_no_call_for_the_one_before_it(monkeypatch):
    """A call that runs slowly right after another one (as a GPU program may after
    a PyTorch peer) is timed from a call of its own: in interleaved rounds the
    slow first call would otherwise land in its batch every round."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu

    last = []

    def call(name, seconds_after_another):
        def run():
            if last and last[-1] != name:
                time.sleep(seconds_after_another)
            last.append(name)

        return run

    ms = gpu.rounds_ms({"ours": call("ours", 0.05), "peer": call("peer", 0)}, rounds=3, per_round=1)
    assert ms["ours"] < 25, ms  # 50 ms a round, were the slow call timed


def test_gpu_benchmark_times_one_program_once(monkeypatch, capsys):
    """Calls whose programs are the same StableHLO (here two jitted functions; on a
    GPU the default and the implementation it picks) are compiled and timed once
    and share the time, said so; another program and a non-JAX call are timed."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu

    x = jnp.ones(8)
    calls = {
        "double": functools.partial(jax.jit(lambda a: a * 2), x),
        "other": functools.partial(jax.jit(lambda a: a + 1), x),
        "twice": functools.partial(jax.jit(lambda a: a * 2), x),
        "numpy": lambda: np.ones(8) * 2,
    }
    assert gpu.same_programs(calls) == {"twice": "double"}
    ms = gpu.rounds_ms(calls, rounds=2, per_round=1)
    assert list(ms) == list(calls) and ms["twice"] == ms["double"]
    assert all(v > 0 for v in ms.values())
    assert "twice: the program of double, timed once" in capsys.readouterr().out


def test_gpu_benchmark_makes_one_first_call_a_program(monkeypatch):
    """``first_results`` compiles each program once: a call of the same program as
    an earlier call is not made, and gets that call's result."""
    gpu = gpu_to_narrow(monkeypatch)
    x = jnp.ones(8)
    calls = {
        "double": functools.partial(jax.jit(lambda a: a * 2), x),
        "other": functools.partial(jax.jit(lambda a: a + 1), x),
        "twice": functools.partial(jax.jit(lambda a: a * 2), x),
    }
    made = []
    first_result = gpu.first_result
    monkeypatch.setattr(gpu, "first_result", lambda call: made.append(call) or first_result(call))
    results = gpu.first_results(calls)
    assert list(results) == list(calls) and results["twice"] is results["double"]
    assert sorted(made, key=id) == sorted([calls["double"], calls["other"]], key=id)
    np.testing.assert_array_equal(results["other"], x + 1)


def test_gpu_benchmark_canonicalizes_a_program_once(monkeypatch):
    """Each call's program is lowered and canonicalized once, however often
    ``first_results`` and ``rounds_ms`` ask for it."""
    gpu = gpu_to_narrow(monkeypatch)
    canonicalized = []
    canonical = gpu.canonical
    monkeypatch.setattr(gpu, "canonical", lambda m: canonicalized.append(m) or canonical(m))
    call = functools.partial(jax.jit(lambda a: a * 3), jnp.ones(8))
    assert gpu._stablehlo(call) == gpu._stablehlo(call) is not None
    assert len(canonicalized) == 1
    assert gpu._stablehlo(functools.partial(jax.jit(lambda a: a * 3), jnp.ones(8))) is not None
    assert len(canonicalized) == 2  # another call


@needs_kernels
@pytest.mark.skipif(
    jax.__version_info__ < (0, 9, 1),
    reason="before JAX 0.9.1 a kernel's Triton IR holds the Python frames it was lowered "
    'through, which differ between the default\'s choice and an explicit "pallas": the two '
    "programs differ there, and gpu.py compiles both",
)
def test_gpu_benchmark_sees_the_default_as_the_program_it_picks_on_a_gpu(monkeypatch, patch):
    """Lowered for a CUDA GPU, the default's program carries constants of the
    portable branch it leaves out, which XLA discards: canonicalized, it is the
    kernels' program where it picks them (a depthwise op) and the portable one
    where it does not (float64), so gpu.py compiles and times it once."""
    gpu = gpu_to_narrow(monkeypatch)
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)

    def program(impl, dtype=jnp.bfloat16):
        x, f = jnp.ones((2, 12, 10, 8), dtype), jnp.ones((3, 3, 8, 1), dtype)
        forward = gpu.jaxgrad_ops("NHWC", x.shape, f.shape, 1, impl)["forward"]
        with gpu_stand_in():
            lowered = forward.trace(x, f).lower(lowering_platforms=("cuda",))
        return gpu.canonical(lowered.compiler_ir("stablehlo"))

    assert TRITON_CALL in program(None)
    assert program(None) == program("pallas") != program("xla")
    assert program(None, jnp.float64) == program("xla", jnp.float64)


def test_gpu_benchmark_reports_a_check_that_fails_as_failed(monkeypatch, capsys):
    """A correctness check whose op fails is NaN, printed, and shown as failed in
    the table of worst errors, never hidden behind a smaller error."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu

    def failing():
        raise RuntimeError("the kernel did not compile\nmore detail")

    [result] = gpu.side_by_side({"op": failing}).values()
    assert gpu.relative_error(np.full(3, 1.5), np.ones(3)) == 0.5
    error = gpu.relative_error(result, np.ones(3))
    assert math.isnan(error)
    assert "failed: RuntimeError: the kernel did not compile" in capsys.readouterr().out
    # The timed programs' results, checked where they are.
    with gpu.x64(True):
        want = jnp.ones(3, jnp.float64)
    assert gpu.relative_error_on_device(jnp.full(3, 1.5, jnp.bfloat16), want) == pytest.approx(
        0.5, rel=1e-15
    )  # to an ulp: XLA:CPU rounds its norm by the vector extensions it compiles for
    assert math.isnan(gpu.relative_error_on_device(result, want))
    assert "failed: RuntimeError: the kernel did not compile" in capsys.readouterr().out
    # The reference: float64 on the CPU, of the operands as rounded; or its failure.
    third = jnp.full(3, 1 / 3, jnp.bfloat16)
    reference = gpu.float64_result(lambda a: a * 3, third)
    assert reference.dtype == np.float64
    np.testing.assert_array_equal(reference, np.asarray(third, np.float64) * 3)
    broken = gpu.float64_result(lambda a: failing(), third)
    assert "did not compile" in gpu.failure(broken)
    assert math.isnan(gpu.relative_error_on_device(third, broken))
    rows = [
        dict(dtype="float32", impl="pallas", op="forward", error=1e-7),
        dict(dtype="float32", impl="pallas", op="forward", error=error),
        dict(dtype="float32", impl="xla", op="forward", error=2e-7),
    ]
    rows.append(dict(dtype="bfloat16", impl="xla", op="forward", error=3e-3))
    table = gpu._worst(rows)
    assert table[0] == "| implementation | op | float32 | bfloat16 |"
    assert "| pallas | forward | failed |  |" in table
    assert "| xla | forward | 2.00e-07 | 3.00e-03 |" in table


def test_gpu_benchmark_counts_bit_patterns_and_reports_a_failed_process(monkeypatch):
    """The cross-process check counts each case's bit patterns over fresh processes,
    which run side by side (all started before any is waited for); a process that
    fails ends the check with its error, not the run."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu

    outputs = iter(["relu abc\ndepthwise 123\n", "relu abc\ndepthwise 456\n", "relu abc\n"])
    returncodes = iter([0, 0, 1])
    events = []

    class FakeProcess:
        def __init__(self, command, **kwargs):
            assert command[-3:] == [
                str(gpu.ROOT / "tests" / "determinism_check.py"),
                "--size",
                "large",
            ]
            assert kwargs["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
            self.returncode, self.stdout = next(returncodes), next(outputs)
            events.append("start")

        def communicate(self):
            events.append("wait")
            return self.stdout, "Traceback\nValueError: boom"

    monkeypatch.setattr(gpu.subprocess, "Popen", FakeProcess)
    assert gpu.finish_determinism(gpu.start_determinism(processes=2)) == {
        "processes": 2,
        "bit_patterns": {"relu": 1, "depthwise": 2},
    }
    assert events == ["start", "start", "wait", "wait"]
    failed = gpu.finish_determinism(gpu.start_determinism(processes=1))
    assert failed["failed"].endswith("ValueError: boom")
    machine = dict.fromkeys(("device", "driver", "jax", "jaxlib", "torch", "triton"), "?")
    table = gpu.render({"machine": machine, "copy_bandwidth_GBps": 1.0, "determinism": failed})
    assert "Fresh processes: failed" in table


@needs_kernels
def test_kernel_report_finds_the_kernels_of_the_training_step(monkeypatch):
    """``kernel_report.py --train-step`` lowers the example U-Net's step for CUDA
    as a GPU would, with the default implementation: every depthwise layer's
    forward is a kernel; its backward is the input gradient's kernel and the
    filter gradient's two (its partials, and their sum), but in the first layer,
    which reads the data and needs no input gradient. The partials walk their
    columns but in the first layer, of one channel. The 2x upsampling is a
    kernel too (the 0.5x downsampling and the float32 linear gradients stay with
    XLA, which compiles them into one pass).
    Lowering needs no GPU and no ``triton`` package."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_report

    with as_jax_defaults():
        fn, *args = kernel_report.train_step(batch=2, size=16)
        kernels = kernel_report.triton_modules(fn, *args, capability=90)
    names = [kernel.name for kernel in kernels]
    assert {name: names.count(name) for name in set(names)} == {
        "_forward_kernel": 4,
        "_input_kernel": 3,
        "_partials_kernel": 1,
        "_walk_partials_kernel": 3,
        "_sum_kernel": 4,
        "_kernel": 1,
    }


@needs_kernels
def test_kernel_report_compiles_the_ir_xla_compiles(monkeypatch, tmp_path):
    """A kernel's Triton IR goes through Triton's first stage of passes (inlining,
    canonicalization, CSE) before the GPU stages, as XLA runs it: ``triton.compile``
    of an IR file skips the file's own stage, and its GPU stages would then compile
    the IR as JAX lowered it, several times larger, and for several times as long.
    Needs the optional ``triton`` package (CI has none); lowering needs no GPU."""
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_report

    with as_jax_defaults():
        fn, x = kernel_report.resample_step((1, 1, 8, 8), (1, 1, 2, 2), "linear", "float32")
        kernels = kernel_report.triton_modules(fn, x, capability=90)
    assert kernels
    for kernel in kernels:
        staged = kernel_report.triton_ir_stage(
            kernel.ir, kernel.options, GPUTarget("cuda", 90, 32), tmp_path
        )

        def operations(ir):
            return len(re.findall(r"= [a-z_]+\.[a-z_]+", ir))

        assert f"tt.func public @{kernel.name}" in staged
        assert operations(staged) < operations(kernel.ir) / 2, kernel.name


# --------------------------------------------------------------------------------------
# benchmarks/lease.py
# --------------------------------------------------------------------------------------
def lease_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import lease

    return lease


def test_lease_builds_each_kernels_file_it_compares(monkeypatch, tmp_path):
    """Each step that compares kernels gets the library's file with its options set
    otherwise: every substitution matches (a renamed option fails here, not on a
    lent GPU), the file differs from the library's and loads beside it; a
    substitution that matches nothing is an error naming the file."""
    lease = lease_module(monkeypatch)
    import compare

    variants = [step for step in lease.STEPS if step.variant]
    assert {step.variant.family for step in variants} == {"depthwise", "resample"}
    for step in variants:
        text = step.variant.text()
        library = lease.KERNELS[step.variant.family].read_text()
        for old, new in step.variant.substitutions:
            assert old in library and new in text and old not in text, (step.name, old)
        path = tmp_path / f"{step.name}.py"
        path.write_text(text)
        compare.load(str(path), step.variant.family)
    renamed = lease.Variant("depthwise", (("no_such_option=True", "no_such_option=False"),))
    with pytest.raises(ValueError, match=r"_depthwise/_pallas.py has no 'no_such_option=True'"):
        renamed.text()


def test_lease_steps_ask_their_scripts_for_cases_and_ops_they_have(monkeypatch):
    """Every step's command line parses with its script's own parser, and each of
    its ``--cases`` names a case of its family and each of its ``--ops`` an op
    (a script would otherwise run no row, and a lease's minutes would pass). A
    ``--cases`` names either cases of gpu.py's tables or cases outside them
    (which ``--cases`` alone builds, and some compile for up to a minute), never
    both."""
    lease = lease_module(monkeypatch)
    import compare
    import gpu
    import tune

    scripts = {"compare.py": compare, "tune.py": tune, "gpu.py": gpu}
    for step in lease.STEPS:
        given = ["kernels.py"] if step.variant else []
        args = scripts[step.script].arguments().parse_args(given + shlex.split(step.args))
        families = getattr(args, "family", ["depthwise", "resample"])
        families = [families] if isinstance(families, str) else families
        cases = [
            (case, op)
            for family in families
            for case, op, _ in tune.CASES[family](False, named=True)
        ]
        plain = {
            case for family in families for case, _, _ in tune.CASES[family](False, named=False)
        }
        for part in getattr(args, "cases", []):
            reached = {case for case, _ in cases if part in case}
            assert reached, (step.name, part)
            assert reached <= plain or not reached & plain, (step.name, part)
        for op in getattr(args, "ops", []):
            assert any(op == case_op for _, case_op in cases), (step.name, op)
    assert len({step.name for step in lease.STEPS}) == len(lease.STEPS)


def test_lease_gives_each_step_its_limit_and_stops_at_the_budget(monkeypatch, tmp_path, capsys):
    """Steps run in order: one that ends, one that fails, one stopped at its own
    limit (the rows it wrote kept, the process it started stopped with it), one
    stopped where the budget ends, and one the budget leaves out, listed with the
    command that runs it."""
    lease = lease_module(monkeypatch)
    script = tmp_path / "step.py"
    script.write_text(
        "import json, subprocess, sys, time\n"
        "behaviour, out = sys.argv[1], sys.argv[sys.argv.index('--json') + 1]\n"
        # As gpu.py records a section where the step ends, as compare.py rows elsewhere.
        "results = {'command': '', 'step': 1} if behaviour == 'end' else {'rows': [{}, {}]}\n"
        "json.dump(results, open(out, 'w'))\n"
        "print('rows written')\n"
        "if behaviour == 'fail':\n"
        "    sys.exit(3)\n"
        "if behaviour == 'hang':\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "    open(out + '.child', 'w').write(str(child.pid))\n"
        "    time.sleep(60)\n"
    )

    def step(name, behaviour, limit):
        return lease.Step(name, f"a step that does {behaviour}", str(script), behaviour, limit)

    steps = [
        step("ends", "end", 30),
        step("fails", "fail", 30),
        step("hangs", "hang", 3),
        step("hangs-longer", "hang", 60),
        step("left-out", "end", 30),
    ]
    start = time.monotonic()
    ended = lease.run(steps, tmp_path / "out", budget=7.5)
    assert time.monotonic() - start < 7.5 + 2 * lease.GRACE
    assert [e.how for e in ended] == [
        "done",
        "failed (rc 3)",
        "stopped at its limit",
        "stopped at the budget",
        "not run",
    ]
    assert [e.wrote for e in ended] == ["step", "2 rows", "2 rows", "2 rows", "nothing"]
    assert 3 <= ended[2].seconds < 3 + lease.GRACE
    for name in ("hangs", "hangs-longer"):
        child = int((tmp_path / "out" / f"{name}.json.child").read_text())
        deadline = time.monotonic() + 5
        while pathlib.Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # init reaps the orphan
        assert not pathlib.Path(f"/proc/{child}").exists(), name
    printed = capsys.readouterr().out
    assert re.search(r"== ends: a step that does end\n-- done after \d+ s\nrows written", printed)
    assert printed.rstrip().endswith("Not run: python benchmarks/lease.py --steps left-out")
    assert "| hangs | stopped at its limit |" in printed


@needs_kernels
def test_lease_runs_a_real_comparison_over_the_kernels_file_it_built(monkeypatch, tmp_path):
    """The plumbing end to end, on the CPU: a step runs benchmarks/compare.py (its
    smoke case, the kernels interpreted) over the kernels file the step built, in
    a process of its own, and reads back the row that process wrote."""
    lease = lease_module(monkeypatch)
    monkeypatch.setenv("XLA_FLAGS", SUITE_XLA_FLAGS)
    [wide_tile] = [step for step in lease.STEPS if step.name == "wide-tile"]
    step = dataclasses.replace(wide_tile, args="--smoke --ops forward")
    ended = lease.run_step(step, tmp_path, seconds=300)
    assert (ended.how, ended.wrote) == ("done", "1 row"), (tmp_path / "wide-tile.log").read_text()
    [row] = lease.rows_of(tmp_path / "wide-tile.json")
    assert row["same_program"]  # the narrowing leaves the tiny case's kernels alone
    assert "_MOST_SUMS = 1 << 30" in (tmp_path / "wide-tile.py").read_text()


def test_lease_prints_a_comparisons_table_from_the_rows_it_finished(monkeypatch, tmp_path):
    """A comparison stopped before its own table printed still shows the rows it
    wrote, as benchmarks/compare.py renders them; a step that wrote none shows
    the end of its log."""
    lease = lease_module(monkeypatch)
    [step] = [step for step in lease.STEPS if step.name == "wide-tile"]
    row = {
        "family": "depthwise",
        "case": "[32,112,112,32] 5x5 s1 NCHW bfloat16",
        "op": "backprop_filter",
        "file_ms": 0.2,
        "library_ms": 0.1,
        "peers_ms": {"lax": 0.3},
        "same_bits": False,
        "same_program": False,
    }
    (tmp_path / "wide-tile.json").write_text(json.dumps({"rows": [row]}))
    (tmp_path / "wide-tile.log").write_text("Traceback (most recent call last):\n")
    assert "| backprop_filter | 0.200 | 0.100 | 0.50 | lax | 0.300 | 0.33 | no | no |" in (
        lease.table_of(step, tmp_path)
    )
    (tmp_path / "wide-tile.json").unlink()
    assert lease.table_of(step, tmp_path) == "Traceback (most recent call last):"


def test_lease_lists_its_steps_and_their_commands():
    result = run_script("benchmarks/lease.py", "--list", "--out", "build/lease")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("unet-tiled (at most 180 s): the example U-Net's step")
    assert lines[1] == (
        "    python benchmarks/gpu.py --sections train --json build/lease/unet-tiled.json"
    )
    # The whole command, every section and case, for as long as one call allows.
    assert lines[2].startswith("whole (at most 540 s): the whole command in one run")
    assert lines[3] == "    python benchmarks/gpu.py --json build/lease/whole.json"
    assert lines[4].startswith("walk-grid (at most 150 s): the walking NHWC filter gradient")
    assert lines[5] == (
        "    python benchmarks/tune.py --family depthwise --groups 'walk grid' --cases "
        "'3x3 s1 NHWC' '3x3 s2 NHWC' 'M2 NHWC' --ops backprop_filter "
        "--json build/lease/walk-grid.json"
    )
    assert lines[6].startswith("walk-reads (at most 150 s): the NHWC forward and input")
    assert lines[8].startswith("depthwise-before (at most 200 s): the depthwise kernels")
    assert lines[9] == (
        "    python benchmarks/compare.py build/lease/depthwise-before.py --cases '96] 3x3 s1' "
        "'96] 3x3 s2' '192] 5x5 s1 NCHW' M2 --ops forward backprop_input backprop_filter "
        "--json build/lease/depthwise-before.json"
    )
    assert lines[10] == (
        "    depthwise's kernels with 'reuse_rows=True, walk_taps=9, walk_warps=1' -> "
        "'reuse_rows=True'"
    )


def test_host_probe_of_derivatives_traces_each_order(tmp_path):
    # benchmarks/host.py runs a probe in a fresh process for jaxgrad and for its
    # peer, and tables and writes each one's figures: here the tracing and
    # lowering of the first three derivatives, for jaxgrad and lax.
    out = tmp_path / "host.json"
    result = run_script(
        "benchmarks/host.py", "--probes", "depthwise_derivatives", "--json", str(out)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())["depthwise_derivatives"]
    keys = [f"order {n} {phase} s" for n in (1, 2, 3) for phase in ("trace", "lower")]
    for peer in ("jaxgrad", "lax"):
        assert sorted(figures[peer]) == sorted(keys), peer
        assert all(figures[peer][key] > 0 for key in keys), peer
    assert "| depthwise_derivatives | order 3 trace s |" in result.stdout
