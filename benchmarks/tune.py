"""Which launch of each Pallas kernel is fastest on this GPU: a search, not a change.

    python benchmarks/tune.py [--family depthwise resample] [--cases SUBSTRING ...]
                              [--ops forward ...] [--groups GROUP ...]
                              [--json tune.json] [--smoke]

The kernels cut their work by a launch: a tile of ``columns x channels``, the
rows one program owns, and the warps that run it (``_launch`` in
``jaxgrad/_depthwise/_pallas.py`` and ``jaxgrad/_resample/_pallas.py``). For
each case of benchmarks/gpu.py and each op, starting from the launch jaxgrad
picks today, this times the neighbours of the best launch so far in one group of
parameters at a time: for the depthwise kernels, first the filter taps a program
holds in registers (``taps``, halved, kept or doubled: a 5x5 filter's 25 taps
are unrolled at 32, looped over or cut into groups at 16), then whether a
program keeps the input rows that consecutive rows share in registers
(``reuse_rows``: fewer loads, more registers), then whether an NCHW forward or
filter gradient at column stride 2 reads its windows as runs of column pairs
(``wide_strided_reads``: wide loads, twice the columns read; elsewhere the same
program), then whether an NCHW input gradient at column stride 2 writes both
column phases as one run (``wide_strided_writes``: wide stores, both phases'
sums at once), then whether an NCHW kernel reads a run of columns that starts
off a vector's alignment from the aligned vectors under it and moves the columns
into place in registers (``aligned_reads``: fewer loads), then whether a program
reads its next row before it computes the current one (``read_ahead``: loads in
flight during the arithmetic, more registers), then whether an NHWC kernel
walks its rows' columns in order (``walk_columns``: a tile of rows by channels
a step, on one or two warps a program, which takes its own shape, so the tile
and warps of the search then apply to the other kernels only), and, where it
does, the channels of that tile (``walk_channels``: 16, 32 or 64) and the
warps its grid makes at least (``walk_grid_warps``: 1024 to 8192, rows cut into
more, shorter segments as it grows); for the
resample kernel, whether it reads a last axis that repeats every two output
columns or every output two input columns (NCHW's 2x and 0.5x and their
gradients) as contiguous runs instead of a gather per tap (``paired``;
elsewhere the same program), then whether a program of one channel holds its
rows as one tile (``rows_together``), then whether a program of one row at a
time takes whole periods of its last row axis where it repeats and reads each
input row its rows share once (``row_pattern``; the rows then round up to whole
periods); the tile (each side halved, kept or doubled) together with the warps
(1, 2, 4, 8), since their ratio sets each thread's share of the tile and so its
registers; then the rows (a quarter to four times). A coordinate search: about
54 compiles per depthwise op (a walk's tile and grid included) instead of every
combination's 622080. Every case of both families is well over two thousand
compiles, so pick cases with ``--cases`` and ``--ops``
(``--cases "3x3 s1 NHWC bfloat16" --ops backprop_filter``; ``--cases`` also
reaches a few cases outside gpu.py's tables, ``NAMED_DEPTHWISE_CASES`` and
``NAMED_RESAMPLE_CASES``), and groups with
``--groups``: ``--groups "read ahead"`` times the current launch against the one
that differs in that option alone, two compiles per op, which is how to try an
option on a GPU. The depthwise ``backward`` is the forward op's backward, both
gradients: each candidate is given to both of its kernels, so a launch for each
is searched through the gradient ops themselves.

Every candidate's result is compared with the current launch's. The forward and
the gradients gather each output in an order no launch changes, but the filter
gradient's partials are summed per block of rows, so its rounding may move with
the rows and with whether they are kept: a candidate must agree to one rounding
of the output dtype per element plus a few float32 roundings of the largest
value, or it is listed as disagreeing and never chosen.

A launch that fails to compile or run (a tile beyond the GPU's shared memory,
say) is listed with its error and never chosen; the search goes on.

Nothing in the library changes: the candidates are imposed by wrapping
``_launch``. It prints, per case and op, the current launch, the best one found,
their times (medians of interleaved rounds, timed as benchmarks/gpu.py times) and
their ratio, and beside them, timed in the same rounds, the op's peers of
benchmarks/gpu.py (lax and its VJPs and PyTorch for depthwise,
``jax.image.resize`` and its VJP and PyTorch for resample): whether a launch
closes the gap to them is read off one run. Adopting a launch is an edit to
``_launch``, checked by a rerun of benchmarks/gpu.py. ``--smoke`` runs a tiny case
of each family on the CPU (the kernels interpreted, two candidates a group) to
check the script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple
from unittest import mock

import gpu
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrad._depthwise import _pallas as depthwise_kernels
from jaxgrad._resample import _pallas as resample_kernels

FAMILIES = {"depthwise": depthwise_kernels, "resample": resample_kernels}
# The launch's parameters, searched in this order: the filter taps the depthwise
# kernels hold in registers (a filter of more taps loads them where it uses them, or
# sums them in groups of programs); whether they keep the input rows that consecutive
# rows share in registers (fewer loads, more registers); whether they read strided
# NCHW columns in pairs (wider loads, twice the columns), or write them in pairs
# (wider stores, both phases' sums at once); whether they read unaligned runs of NCHW
# columns from aligned vectors (fewer loads); whether they read a row ahead (loads in
# flight during the arithmetic, more registers); whether the NHWC kernels walk their
# rows' columns (a long loop, few loads a multiply-add), the channels of a walk's
# tile (more make fewer rows a program) and the warps of its grid (more cut its rows
# into shorter segments); whether the resample kernel
# reads a last axis that repeats every two columns in pairs (contiguous runs in place
# of gathers), whether its programs hold their rows as one tile (loads of all rows
# in flight at once), and whether they read the input rows a repeating row axis's
# rows share once (fewer gathers); the tile and the warps together (their ratio is
# the elements each thread holds, hence its registers); then the rows.
GROUPS = (
    "taps",
    "rows kept",
    "strided reads",
    "strided writes",
    "aligned reads",
    "read ahead",
    "walk columns",
    "walk tile",
    "walk grid",
    "column pairs",
    "rows together",
    "row pattern",
    "tile and warps",
    "rows",
)
# One warp: a resample tile of 128 columns (the 3-D volume's rows) holds one
# element a thread on four.
WARPS = (1, 2, 4, 8)
# The warps a walk's grid makes at least ("walk grid"): from about one wave of
# programs on an H100 (1024, the default) to several.
WALK_GRID_WARPS = (1024, 2048, 4096, 8192)


# --------------------------------------------------------------------------------------
# Launches
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def launches(module: Any, fields: dict[str, int] | None = None) -> Iterator[list[Any]]:
    """The launches ``module``'s kernels are given while the block runs: the ones
    jaxgrad picks, or with ``fields`` replaced when given."""
    chosen, given = module._launch, []

    def launch(*args: Any, **kwargs: Any) -> Any:
        picked = chosen(*args, **kwargs)
        given.append(dataclasses.replace(picked, **fields) if fields else picked)
        return given[-1]

    with mock.patch.object(module, "_launch", launch):
        yield given


def fields_of(launch: Any) -> dict[str, int]:
    names = (
        "cols",
        "channels",
        "rows",
        "warps",
        "reuse_rows",
        "taps",
        "wide_strided_reads",
        "wide_strided_writes",
        "aligned_reads",
        "read_ahead",
        "walk_columns",
        "walk_warps",
        "walk_channels",
        "walk_grid_warps",
        "paired",
        "rows_together",
        "row_pattern",
    )
    return {name: getattr(launch, name) for name in names if hasattr(launch, name)}


def neighbours(best: dict[str, int], group: str) -> list[dict[str, int]]:
    """Launches that differ from ``best`` in one group of parameters (and ``best``);
    only ``best`` where its kernels have no such parameter."""
    if group == "taps":
        taps = best.get("taps")
        options = [{"taps": t} for t in sorted({taps // 2, taps, taps * 2})] if taps else [{}]
    elif group == "rows kept":
        options = [{"reuse_rows": r} for r in (False, True)] if "reuse_rows" in best else [{}]
    elif group == "strided reads":
        wide = "wide_strided_reads" in best
        options = [{"wide_strided_reads": w} for w in (False, True)] if wide else [{}]
    elif group == "strided writes":
        wide = "wide_strided_writes" in best
        options = [{"wide_strided_writes": w} for w in (False, True)] if wide else [{}]
    elif group == "aligned reads":
        aligned = "aligned_reads" in best
        options = [{"aligned_reads": a} for a in (False, True)] if aligned else [{}]
    elif group == "read ahead":
        options = [{"read_ahead": a} for a in (False, True)] if "read_ahead" in best else [{}]
    elif group == "walk columns":
        # Not walking, or walking on one or two warps a program.
        walks = [{"walk_columns": True, "walk_warps": w} for w in (1, 2)]
        options = [{"walk_columns": False}, *walks] if "walk_columns" in best else [{}]
    elif group == "walk tile":
        # A walk's channels, where the best launch so far walks.
        walks = best.get("walk_columns")
        options = [{"walk_channels": c} for c in (16, 32, 64)] if walks else [{}]
    elif group == "walk grid":
        # The warps a walk's grid makes at least, where the best launch so far
        # walks: the rows cut into more, shorter segments as they grow.
        walks = best.get("walk_columns")
        options = [{"walk_grid_warps": w} for w in WALK_GRID_WARPS] if walks else [{}]
    elif group == "column pairs":
        options = [{"paired": p} for p in (False, True)] if "paired" in best else [{}]
    elif group == "rows together":
        together = "rows_together" in best
        options = [{"rows_together": t} for t in (False, True)] if together else [{}]
    elif group == "row pattern":
        pattern = "row_pattern" in best
        options = [{"row_pattern": p} for p in (False, True)] if pattern else [{}]
    elif group == "tile and warps":
        scales = (0.5, 1, 2)
        options = [
            {"cols": int(best["cols"] * a), "channels": int(best["channels"] * b), "warps": w}
            for a in scales
            for b in scales
            for w in sorted({*WARPS, best["warps"]})
        ]
        options = [o for o in options if o["cols"] >= 1 and o["channels"] >= 1]
    else:
        options = [
            {"rows": r}
            for r in sorted({max(1, int(best["rows"] * a)) for a in (0.25, 0.5, 1, 2, 4)})
        ]
    return [{**best, **o} for o in options]


def label(fields: dict[str, int]) -> str:
    tile = f"{fields['cols']}x{fields['channels']}"
    kept = ", rows kept" if fields.get("reuse_rows") else ""
    kept += ", strided columns read in pairs" if fields.get("wide_strided_reads") else ""
    kept += ", strided columns written in pairs" if fields.get("wide_strided_writes") else ""
    kept += ", unaligned columns read aligned" if fields.get("aligned_reads") else ""
    kept += ", rows read ahead" if fields.get("read_ahead") else ""
    walk = f", columns walked on {fields.get('walk_warps')} warps"
    walk += f" by {fields.get('walk_channels')} channels"
    # Searches before the grid was a field have no such entry.
    walk += f" in {fields['walk_grid_warps']} warps or more" if "walk_grid_warps" in fields else ""
    kept += walk if fields.get("walk_columns") else ""
    kept += ", columns read in pairs" if fields.get("paired") else ""
    kept += ", rows as one tile" if fields.get("rows_together") else ""
    kept += ", rows by their pattern" if fields.get("row_pattern") else ""
    taps = f", taps {fields['taps']}" if "taps" in fields else ""
    return f"tile {tile}, rows {fields['rows']}, warps {fields['warps']}{kept}{taps}"


# --------------------------------------------------------------------------------------
# Cases: each op as a function of its arrays, with the kernels forced
# --------------------------------------------------------------------------------------


class Op(NamedTuple):
    """One op of a case: its function with the kernels forced, its arrays, and the
    peers it is compared with once its search ends, as zero-argument calls."""

    fn: Callable
    args: tuple
    peers: dict[str, Callable[[], Any]]


# (case, op, build): build() makes every op of the case, once, as {op: Op}; only the
# cases asked for are built.
Case = tuple[str, str, Callable[[], dict[str, Op]]]


# Cases no table of benchmarks/gpu.py holds, which only ``--cases`` reaches: the
# kernels whose code was cut down for Triton's compile time (and the 4x gradient,
# the largest scale still unrolled), and a 5x5 filter gradient whose NCHW tile
# narrows to hold its sums, to time against the code before
# (benchmarks/compare.py; docs/performance.md says how).
NAMED_DEPTHWISE_CASES = [
    ("[32,56,56,96] 7x7 s1", (32, 56, 56, 96), (7, 7, 1), 1),
    ("[32,112,112,32] 5x5 s1", (32, 112, 112, 32), (5, 5, 1), 1),
]
NAMED_RESAMPLE_CASES = [
    ("NHWC", (32, 64, 64, 64), (1, 2), "linear", 8.0),
    ("NHWC", (32, 64, 64, 64), (1, 2), "linear", 4.0),
]


def depthwise_cases(smoke: bool, torch: Any = None, named: bool = False) -> Iterator[Case]:
    """Every depthwise case, layout, dtype and op of gpu.py, and the named cases
    where ``named``."""
    cases = gpu.CASES[-1:] if smoke else gpu.CASES + (NAMED_DEPTHWISE_CASES if named else [])
    for _, (n, h, w, c), (fh, fw, m), stride in cases:
        if smoke:
            n, h, w, c = 1, 9, 10, 4
        case = f"[{n},{h},{w},{c}] {fh}x{fw} s{stride}" + (f" M{m}" if m > 1 else "")
        for fmt in gpu.LAYOUTS[:1] if smoke else gpu.LAYOUTS:
            for dtype in gpu.DTYPES[-1:] if smoke else gpu.DTYPES:
                oh, ow = -(-h // stride), -(-w // stride)
                shapes = ((n, h, w, c), (fh, fw, c, m), (n, oh, ow, c * m))
                build = functools.cache(partial(depthwise_ops, fmt, shapes, stride, dtype, torch))
                for op in gpu.OPS:
                    yield f"{case} {fmt} {dtype}", op, build


def depthwise_ops(fmt: str, shapes: tuple, stride: int, dtype: str, torch: Any) -> dict[str, Op]:
    """Each depthwise op with the kernels forced, its arrays, and its peers: lax and
    its VJPs (cuDNN), and PyTorch in both memory formats where it is installed.
    ``shapes`` are the input's, the filter's and the output's, in NHWC."""
    rng = np.random.default_rng(0)
    x, f, dy = (rng.normal(size=s).astype(np.float32) for s in shapes)
    xj, dyj = (jnp.asarray(gpu.in_layout(a, fmt), dtype) for a in (x, dy))
    fj = jnp.asarray(f, dtype)
    _, _, c, m = f.shape
    ours = gpu.jaxgrad_ops(fmt, xj.shape, f.shape, stride, "pallas")
    lax = gpu.lax_ops(fmt, c, m, stride)
    theirs = gpu.torch_ops(torch, x, f, dy, stride, dtype) if torch else {}
    ops = {}
    for op, fn, args in gpu._named(ours, xj, fj, dyj):
        lax_args = (xj, fj) if op == "forward" else (xj, fj, dyj)
        peers = {"lax": partial(lax[op], *lax_args)}
        peers.update({f"torch {memory}": calls[op] for memory, calls in theirs.items()})
        ops[op] = Op(fn, args, peers)
    return ops


def resample_cases(smoke: bool, torch: Any = None, named: bool = False) -> Iterator[Case]:
    """Every resample case, dtype and op of gpu.py, and the named cases where ``named``."""
    cases = gpu.resample_cases(smoke)
    cases = cases[:1] if smoke else cases + (NAMED_RESAMPLE_CASES if named else [])
    for layout, shape, axes, mode, scale in cases:
        for dtype in gpu.DTYPES[-1:] if smoke else gpu.DTYPES:
            case = f"{list(shape)} {layout} {mode} {scale}x {dtype}"
            build = functools.cache(partial(resample_ops, shape, axes, mode, scale, dtype, torch))
            for op in ("forward", "backward"):
                yield case, op, build


def resample_ops(
    shape: tuple, axes: tuple, mode: str, scale: float, dtype: str, torch: Any
) -> dict[str, Op]:
    """resample and its gradient with the kernel forced, their arrays, and their
    peers: jax.image.resize and its VJP, and PyTorch where it is installed."""
    scales, out = gpu.resample_shapes(shape, axes, scale)
    x, dy = gpu.resample_operands(jax.random.key(0), shape, out, dtype)
    ours = gpu.jaxgrad_resample(shape, scales, mode, "pallas")
    image = gpu.image_resize(shape, out, mode)
    peers = {
        "forward": {"jax.image": partial(image["forward"], x)},
        "backward": {"jax.image": partial(image["backward"], x, dy)},
    }
    if torch:
        tx, tdy = (torch.from_dlpack(a) for a in (x, dy))  # the same memory
        for op, call in gpu.torch_resample(torch, tx, tdy, axes, out, scale, mode).items():
            peers[op]["torch"] = call
    return {
        "forward": Op(ours["forward"], (x,), peers["forward"]),
        "backward": Op(ours["backward"], (dy,), peers["backward"]),
    }


CASES = {"depthwise": depthwise_cases, "resample": resample_cases}


# --------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------


def compiled(
    module: Any, fn: Callable, args: tuple, fields: dict[str, int] | None = None
) -> tuple[Callable[[], Any], list[np.ndarray], dict[str, int]]:
    """``fn`` jitted and compiled with the launch ``fields`` (default: jaxgrad's), as
    a call; its results (one array, or the backward's two gradients); and the
    launch its first kernel was given."""
    # JAX caches traces (of jitted functions, of custom VJPs) and the launch is read
    # when the kernels are traced and lowered, under the sharding wrapper at compile
    # time: so the caches are cleared and the program compiled ahead of time under
    # the patch. The compiled program keeps its launch whatever is traced later.
    jax.clear_caches()
    with launches(module, fields) as given:
        program = jax.jit(fn).lower(*args).compile()
    if not given:
        raise RuntimeError("the kernels were not traced under the patched launch")
    out = jax.block_until_ready(program(*args))
    results = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(out)]
    return partial(program, *args), results, fields_of(given[0])


def agrees(got: list[np.ndarray], want: list[np.ndarray], dtype: Any) -> bool:
    """Whether two launches' results agree, each up to a sum regrouped in float32
    and rounded once to ``dtype``: one rounding of ``dtype`` per element, and a few
    of float32 relative to the result's largest value."""

    def close(got: np.ndarray, want: np.ndarray) -> bool:
        rounding = float(jnp.finfo(dtype).eps) * np.abs(want)
        regrouping = 16 * float(jnp.finfo(jnp.float32).eps) * float(np.max(np.abs(want)))
        return bool(np.all(np.abs(got - want) <= rounding + regrouping))

    return all(close(g, w) for g, w in zip(got, want, strict=True))


def candidate(
    module: Any,
    fn: Callable,
    args: tuple,
    fields: dict[str, int],
    want: list[np.ndarray],
    dtype: Any,
) -> dict:
    """``fn`` compiled and run under the launch ``fields``, and whether its result
    agrees with ``want``. A launch the GPU cannot run (a tile too large for its
    shared memory, say) is recorded with the error's first line, not raised: one
    such candidate must not end a search that has used minutes of the GPU."""
    try:
        call, got, given = compiled(module, fn, args, fields)
    except Exception as error:  # whatever the failure, it rules the candidate out
        return {"launch": fields, "call": None, "agrees": False, "error": gpu.failure(error)}
    return {"launch": given, "call": call, "agrees": agrees(got, want, dtype)}


def search(module: Any, op: Op, rounds: int, smoke: bool, groups: tuple[str, ...] = GROUPS) -> dict:
    """The current launch of ``op``'s kernels, the best one found in ``groups``
    (searched in order), every candidate, and the times of the op's peers beside
    the two launches."""
    fn, args, peers = op
    dtype = args[0].dtype
    call, want, current = compiled(module, fn, args)
    tried = {label(current): {"launch": current, "call": call, "agrees": True}}
    best = current
    for group in groups:
        options = neighbours(best, group)
        if smoke:  # the current launch and one other: the code path, not the answer
            options = [best, *[o for o in options if o != best][:1]]
        for fields in options:
            if label(fields) not in tried:
                tried[label(fields)] = candidate(module, fn, args, fields, want, dtype)
        valid = {label(o): tried[label(o)]["call"] for o in options if tried[label(o)]["agrees"]}
        for name, ms in gpu.rounds_ms(valid, rounds).items():
            tried[name]["ms"] = ms
        # A launch that failed when timed (NaN) is never the best.
        fastest = min(valid, key=lambda name: (math.isnan(tried[name]["ms"]), tried[name]["ms"]))
        best = tried[fastest]["launch"]
    # The current and the best launch timed together once more, with the peers: their
    # ratios in one run.
    finalists = {"current": tried[label(current)]["call"]}
    if best != current:
        finalists["best"] = tried[label(best)]["call"]
    final = gpu.rounds_ms({**finalists, **peers}, rounds)
    final.setdefault("best", final["current"])
    return {
        "current": current,
        "best": best,
        "current_ms": final["current"],
        "best_ms": final["best"],
        "peers_ms": {name: final[name] for name in peers},
        "candidates": [
            {
                "launch": t["launch"],
                "ms": t.get("ms"),
                "agrees": t["agrees"],
                "error": t.get("error"),
            }
            for t in tried.values()
        ],
    }


def fastest_peer(row: dict) -> tuple[str, float] | None:
    """The name and time of the fastest peer that ran, None where none did."""
    ran = {name: ms for name, ms in row.get("peers_ms", {}).items() if not math.isnan(ms)}
    return min(ran.items(), key=lambda item: item[1]) if ran else None


def peer_cells(row: dict, ms: float) -> str:
    """The table cells of ``row``'s fastest peer: its name, its time and ``ms`` over
    it (dashes where no peer ran)."""
    peer = fastest_peer(row)
    return f"| {peer[0]} | {peer[1]:.3f} | {ms / peer[1]:.2f} " if peer else "| - | - | - "


def render(rows: list[dict]) -> str:
    lines = [
        "| family | case | op | current launch | ms | best launch | ms | current / best "
        "| fastest peer | ms | best / fastest peer |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        versus = peer_cells(r, r["best_ms"]) + "|"
        lines.append(
            f"| {r['family']} | {r['case']} | {r['op']} | {label(r['current'])} "
            f"| {r['current_ms']:.3f} | {label(r['best'])} | {r['best_ms']:.3f} "
            f"| {r['current_ms'] / r['best_ms']:.2f} {versus}"
        )
    wrong = [(r, c) for r in rows for c in r["candidates"] if not c["agrees"]]
    if wrong:
        lines += ["", "Launches that failed, or disagree with the current launch's (never chosen):"]
        lines += [
            f"- {r['family']} {r['case']} {r['op']}: {label(c['launch'])}"
            + (f" ({c['error']})" if c["error"] else "")
            for r, c in wrong
        ]
    return "\n".join(lines)


def start(args: argparse.Namespace, script: str) -> Any:
    """Sets up a run as ``args`` ask: ``--smoke`` on the CPU with one round (PyTorch
    too), else on a CUDA GPU, or exits. Returns PyTorch, the optional peer, or None
    where it is not installed."""
    if args.smoke:
        args.rounds = 1
        gpu.TORCH_DEVICE = "cpu"
    elif jax.default_backend() != "gpu":
        raise SystemExit(f"{script} needs a CUDA GPU as JAX's default backend")
    with contextlib.suppress(ImportError):
        import torch

        return torch
    return None


def arguments() -> argparse.ArgumentParser:
    """The command line this script reads (benchmarks/lease.py checks its steps' with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--cases", nargs="+", default=[], help="only cases containing one of these")
    parser.add_argument(
        "--ops", nargs="+", default=[], help="only these ops (e.g. backprop_filter)"
    )
    parser.add_argument(
        "--rounds", type=int, default=10, help="timed rounds per candidate (median)"
    )
    parser.add_argument(
        "--groups",
        nargs="+",
        choices=GROUPS,
        default=list(GROUPS),
        help="only these groups of parameters, in the search's order (default: all)",
    )
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny case per family on the CPU: checks the script"
    )
    return parser


def main() -> None:
    args = arguments().parse_args()
    torch = start(args, "benchmarks/tune.py")
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": gpu.environment(),
        "rows": [],
    }

    def save() -> None:
        """Writes the rows searched so far: a run cut short keeps them."""
        if args.json:
            gpu.write_json(args.json, results)

    save()
    for family in args.family:
        for case, op, build in CASES[family](args.smoke, torch, named=bool(args.cases)):
            if not gpu.chosen(case, args.cases):
                continue
            if args.ops and op not in args.ops:
                continue
            row = {"family": family, "case": case, "op": op}
            groups = tuple(g for g in GROUPS if g in args.groups)
            row.update(search(FAMILIES[family], build()[op], args.rounds, args.smoke, groups))
            results["rows"].append(row)
            save()
            peers = "".join(f", {name} {ms:.3f} ms" for name, ms in row["peers_ms"].items())
            print(
                f"  {family} {case} {op}: {label(row['current'])} {row['current_ms']:.3f} ms, "
                f"best {label(row['best'])} {row['best_ms']:.3f} ms{peers}",
                flush=True,
            )
    print()
    print(render(results["rows"]))


if __name__ == "__main__":
    main()
