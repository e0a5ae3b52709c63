"""Two versions of a family's kernels timed against each other: a change, measured.

    git show HEAD:jaxgrad/_depthwise/_pallas.py > /tmp/before.py
    python benchmarks/compare.py /tmp/before.py [--family depthwise] [--cases SUBSTRING ...]
                                 [--ops forward ...] [--rounds 20] [--json out.json] [--smoke]

Where ``benchmarks/tune.py`` searches the launches of today's kernels, this times
a change to the kernels' code: the file given (a version of the family's
``_pallas.py``, often the one before the change) against the library's own. Each
op of each case of benchmarks/gpu.py is compiled twice, once over each version's
kernels, and the two are timed with the op's peers in the same interleaved rounds
(as benchmarks/gpu.py times them): their ratio comes from one run, in one process,
which timings of separate runs do not give (two leases timed one program 0.057 and
0.087 ms). The file is loaded beside the library as a module of its own and
imports the rest of jaxgrad as the library's version does, so it must fit the
library's other modules; the family's ops reach it through a copy of the family's
``_partition`` built over it, which stands in for the library's while the
programs compile (no file of the library changes).

It prints, per case and op, both times, their ratio, the fastest peer, whether the
two versions' results have the same bits, and whether their programs are the same
(compared as benchmarks/gpu.py compares programs): a case the change does not
touch is then timed once. ``--cases`` also reaches the cases benchmarks/tune.py
names outside gpu.py's tables (a 7x7 and a wide 5x5 filter, 8x and 4x upsamplings).
``--smoke`` runs a tiny case of the family on the CPU, the kernels interpreted,
to check the script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import math
import pathlib
import sys
from collections.abc import Callable, Iterator
from functools import partial
from types import ModuleType
from typing import Any
from unittest import mock

import gpu
import jax
import numpy as np
import tune

PACKAGES = {"depthwise": "jaxgrad._depthwise", "resample": "jaxgrad._resample"}


def load(path: str, family: str) -> ModuleType:
    """The file at ``path`` as a module of its own, beside the library's kernels."""
    name = f"compared_{family}_kernels"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def kernels_from(family: str, kernels: ModuleType) -> Iterator[None]:
    """The family's ops running ``kernels`` while the block runs: a copy of the
    family's ``_partition``, built while the package's ``_pallas`` is ``kernels``
    (it wraps the kernel functions when it is built), stands in for the one the
    ops call."""
    package = importlib.import_module(PACKAGES[family])
    ops = importlib.import_module(f"{package.__name__}._ops")
    spec = importlib.util.find_spec(f"{package.__name__}._partition")
    assert spec is not None and spec.loader is not None
    partition = importlib.util.module_from_spec(spec)
    with mock.patch.object(package, "_pallas", kernels):
        spec.loader.exec_module(partition)
    with mock.patch.multiple(ops, _pallas=kernels, _partition=partition):
        yield


def lowered(fn: Callable, args: tuple, platforms: tuple[str, ...] | None = None) -> Any:
    """``fn`` lowered for ``args`` (for ``platforms``; default: the backend's), with
    no source locations in its program. A GPU program holds its kernels' Triton
    code, locations included: a file whose lines sit elsewhere than the library's
    (a line added above a kernel, or another path) would otherwise give another
    program for the same kernels. JAX's caches are cleared first: the ops' traces
    would otherwise outlive a swap of kernels."""
    jax.clear_caches()
    limit = jax.config.jax_traceback_in_locations_limit
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=platforms)
    finally:
        jax.config.update("jax_traceback_in_locations_limit", limit)


def compiled(fn: Callable, args: tuple) -> tuple[Callable[[], Any], list[np.ndarray], str]:
    """``fn`` compiled for ``args``, as a call; its results; and its program, as
    benchmarks/gpu.py compares programs (canonical StableHLO)."""
    lowering = lowered(fn, args)
    program = lowering.compile()
    out = jax.block_until_ready(program(*args))
    results = [np.asarray(leaf) for leaf in jax.tree.leaves(out)]
    return partial(program, *args), results, gpu.canonical(lowering.compiler_ir("stablehlo"))


def compare(family: str, kernels: ModuleType, op: tune.Op, rounds: int) -> dict:
    """Both versions' times of ``op``, its peers' in the same rounds, whether the two
    versions' results have the same bits, and whether their programs are the same
    (then timed once)."""
    fn, args, peers = op
    library, want, program = compiled(fn, args)
    with kernels_from(family, kernels):
        given, got, given_program = compiled(fn, args)
    same_program = given_program == program
    versions = {"file": given} if same_program else {"file": given, "library": library}
    ms = gpu.rounds_ms({**versions, **peers}, rounds)
    return {
        "file_ms": ms["file"],
        "library_ms": ms.get("library", ms["file"]),
        "peers_ms": {name: ms[name] for name in peers},
        "same_bits": all(
            np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want, strict=True)
        ),
        "same_program": same_program,
    }


def render(rows: list[dict]) -> str:
    lines = [
        "| family | case | op | file | library | library / file | fastest peer | ms "
        "| library / fastest peer | same bits | same program |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        versus = tune.peer_cells(r, r["library_ms"])
        lines.append(
            f"| {r['family']} | {r['case']} | {r['op']} | {r['file_ms']:.3f} "
            f"| {r['library_ms']:.3f} | {r['library_ms'] / r['file_ms']:.2f} {versus}"
            f"| {'yes' if r['same_bits'] else 'no'} | {'yes' if r['same_program'] else 'no'} |"
        )
    return "\n".join(lines)


def arguments() -> argparse.ArgumentParser:
    """The command line this script reads (benchmarks/lease.py checks its steps' with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a version of the family's _pallas.py")
    parser.add_argument("--family", choices=list(PACKAGES), default="depthwise")
    parser.add_argument("--cases", nargs="+", default=[], help="only cases containing one of these")
    parser.add_argument("--ops", nargs="+", default=[], help="only these ops (e.g. backprop_input)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (median)")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny case on the CPU: checks the script"
    )
    return parser


def main() -> None:
    args = arguments().parse_args()
    torch = tune.start(args, "benchmarks/compare.py")
    kernels = load(args.file, args.family)
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": gpu.environment(),
        "file": str(pathlib.Path(args.file)),
        "rows": [],
    }
    for case, op, build in tune.CASES[args.family](args.smoke, torch, named=bool(args.cases)):
        if not gpu.chosen(case, args.cases) or (args.ops and op not in args.ops):
            continue
        row = {"family": args.family, "case": case, "op": op}
        row.update(compare(args.family, kernels, build()[op], args.rounds))
        results["rows"].append(row)
        if args.json:  # a run cut short keeps the rows it timed
            gpu.write_json(args.json, results)
        ratio = row["library_ms"] / row["file_ms"]
        print(
            f"  {case} {op}: file {row['file_ms']:.3f} ms, library {row['library_ms']:.3f} ms "
            f"({ratio:.2f}), same bits: {row['same_bits']}, same program: {row['same_program']}",
            flush=True,
        )
        if math.isnan(ratio):
            print("    a version failed to run: its error is above", flush=True)
    print()
    print(render(results["rows"]))


if __name__ == "__main__":
    main()
