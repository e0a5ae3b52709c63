"""Shared benchmark harness: warm up, block_until_ready, medians, ratios measured in one run.

The implementations of one case (jaxgrad, its peers, the roofline) are timed
in interleaved rounds in the same process, so the ratios between them are what to
read; the absolute milliseconds move from run to run on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import operator
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _block(tree: Any) -> None:
    for leaf in jax.tree_util.tree_leaves(tree):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()


def interleaved_ms(
    calls: dict[str, Callable[[], Any]], warmup: int = 2, repeats: int = 9
) -> dict[str, float]:
    """Median wall time in milliseconds of each zero-argument call, timed in rounds.

    Every call is first made ``warmup`` times untimed (the first compiles); results
    are blocked on, so that a time covers the computation and not its dispatch.
    Then each round times every call once, starting one further along each time, so
    that every implementation sees the same stretch of machine noise: on a shared
    machine a burst of load lasting seconds would otherwise land on whichever row
    happened to be running, and the ratios between rows would report the burst.
    Each timed call follows an untimed one of the same implementation, so it runs
    in its steady state, as in a training loop: its caches warm and its thread pool
    awake. (PyTorch's OpenMP threads go to sleep while XLA runs; timed cold, its
    depthwise forward measured 4.1 ms instead of 1.4.)
    """
    for call in calls.values():
        for _ in range(warmup):
            _block(call())
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _block(calls[name]())  # settle: back to the steady state
            start = time.perf_counter()
            _block(calls[name]())
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def roofline(read_bytes: int, write_bytes: int) -> tuple[Callable[..., Any], tuple[jax.Array]]:
    """A plain jnp op that reads ``read_bytes`` and writes ``write_bytes``, streaming.

    This is the memory-bandwidth floor for an op with those reads and writes: no
    op can be faster than moving its traffic once. It moves the op's own bytes in
    each direction, not their total split in half: an output of another size lands
    on another side of the cache size and of glibc's 32 MB mmap threshold, above
    which every call page-faults its fresh output (docs/performance.md). Float32
    words, the ratio of reads to writes rounded to a whole number ``k``:

    - ``k == 1``: a copy.
    - reads ``k`` times the writes: the sum of ``k`` contiguous chunks, with
      explicit adds (one fused loop; XLA:CPU's reduction over a major axis of 2
      or 4 measured 18-34x slower), or a row reduction for ``k > 8`` (a filter
      gradient's tiny output).
    - writes ``k`` times the reads: the input broadcast ``k`` times.
    """
    n_read, n_write = max(1, read_bytes // 4), max(1, write_bytes // 4)
    rng = np.random.default_rng(0)
    if n_read >= n_write:
        k = max(1, round(n_read / n_write))
        if k == 1:
            return jax.jit(jnp.copy), (jnp.asarray(rng.random(n_write, np.float32)),)
        if k > 8:
            rows = jnp.asarray(rng.random((n_write, k), np.float32))
            return jax.jit(lambda a: jnp.sum(a, axis=1)), (rows,)
        chunks = jnp.asarray(rng.random((k, n_write), np.float32))
        return jax.jit(lambda a: functools.reduce(operator.add, list(a))), (chunks,)
    k = max(1, round(n_write / n_read))
    src = jnp.asarray(rng.random(n_read, np.float32))
    return jax.jit(lambda a: jnp.broadcast_to(a, (k, n_read))), (src,)


def nbytes(*arrays: Any) -> int:
    """Total bytes of arrays (or shape-dtype structs)."""
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays)


@dataclass
class Row:
    case: str
    impl: str
    ms: float
    baseline_ms: float
    peers: dict[str, float] = field(default_factory=dict)


class Table:
    """Collects rows and prints them with ratios to the roofline and to named peers."""

    def __init__(self, title: str, peer_names: Sequence[str], baseline: str = "roofline") -> None:
        self.title = title
        self.baseline = baseline
        self.peer_names = list(peer_names)
        self.rows: list[Row] = []

    def add(self, case: str, impl: str, ms: float, baseline_ms: float, **peers: float) -> None:
        self.rows.append(Row(case, impl, ms, baseline_ms, peers))
        print(f"  {case:<44} {impl:<22} {ms:9.2f} ms", flush=True)

    def add_case(
        self,
        case: str,
        ours: float,
        baseline: float,
        peers: dict[str, float],
        baseline_name: str = "roofline",
    ) -> None:
        """One case's rows: the baseline, each peer, then jaxgrad with its ratios."""
        self.add(case, baseline_name, baseline, baseline)
        for name, ms in peers.items():
            self.add(case, name, ms, baseline)
        self.add(case, "jaxgrad", ours, baseline, **peers)

    def render(self) -> str:
        header = ["case", "impl", "ms", f"x {self.baseline}", *[f"x {p}" for p in self.peer_names]]
        lines = [
            f"### {self.title}",
            "",
            describe_machine(),
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for r in self.rows:
            cells = [r.case, r.impl, f"{r.ms:.2f}", f"{r.ms / r.baseline_ms:.2f}"]
            for p in self.peer_names:
                cells.append(f"{r.ms / r.peers[p]:.2f}" if p in r.peers else "")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if self.baseline == "roofline":
            lines.append(
                "x roofline: time over a jnp op reading and writing the op's bytes (1.0 is "
                "memory bandwidth); x peer: time over the peer's time in this run (below 1 is "
                "faster)."
            )
        else:
            lines.append(f"x {self.baseline}: time over the {self.baseline} time in this run.")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The table as data (for docs/make_figures.py), with the machine it ran on."""
        return {
            "title": self.title,
            "baseline": self.baseline,
            "peers": self.peer_names,
            "machine": machine(),
            "command": " ".join(["python", *sys.argv]),
            "rows": [_rounded(dataclasses.asdict(r)) for r in self.rows],
        }


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    """Milliseconds to the microsecond: more digits are noise, and noise in the docs' diffs."""
    return {
        key: round(value, 3)
        if isinstance(value, float)
        else {k: round(v, 3) for k, v in value.items()}
        if isinstance(value, dict)
        else value
        for key, value in row.items()
    }


def machine() -> dict[str, Any]:
    """Where and with what a table was measured: versions, cores, date."""
    devices = jax.devices()
    return {
        "date": datetime.date.today().isoformat(),
        "processor": _processor(),
        "cpu_cores": _cpu_count(),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "torch": _torch_version(),
    }


# The vector extensions a CPU's kernels are chosen by: without AVX-512, PyTorch
# does not hand bfloat16 convolutions to oneDNN and runs its own, far slower,
# kernels, so a table's PyTorch column depends on them.
_VECTOR_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _processor() -> str:
    """The CPU's model and vector extensions (on Linux), else its architecture."""
    try:
        return describe_cpu(pathlib.Path("/proc/cpuinfo").read_text())
    except OSError:
        return platform.processor() or platform.machine()


def describe_cpu(cpuinfo: str) -> str:
    """``model (extensions)`` from the text of Linux's /proc/cpuinfo (its first CPU):
    which of ``_VECTOR_EXTENSIONS`` it has, the model alone if none."""
    fields = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = fields.get("flags", "").split()
    extensions = ", ".join(e for e in _VECTOR_EXTENSIONS if e in flags)
    model = fields.get("model name", platform.machine())
    return f"{model} ({extensions})" if extensions else model


def describe_machine() -> str:
    m = machine()
    return (
        f"{m['processor']}, {m['cpu_cores']} cores, {m['devices']}, jax {m['jax']}, "
        f"numpy {m['numpy']}, " + (f"torch {m['torch']}" if m["torch"] else "torch not installed")
    )


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def torch_or_none() -> Any:
    """PyTorch if installed (an optional peer, never a dependency), else None."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(_cpu_count())  # the same cores XLA:CPU uses
    return torch


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repeats", type=int, default=9, help="timed calls per row (median taken)")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    p.add_argument(
        "--json", default=None, help="also write the table as JSON (docs/make_figures.py reads it)"
    )
    return p


def finish(table: Table, args: argparse.Namespace) -> None:
    text = table.render()
    print()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table.to_json(), f, indent=1)
            f.write("\n")
