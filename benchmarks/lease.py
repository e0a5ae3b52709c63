"""What to measure first on a lent GPU, most urgent first, within one call's time.

    python benchmarks/lease.py [--budget 540] [--out DIR] [--steps NAME ...] [--list]

A GPU for this project is lent for minutes: one command of at most ten minutes,
a few in a lease. This runs the measurements the kernels wait for
(docs/performance.md, "Still to measure") in the order they matter, each step
as its own process of benchmarks/compare.py, tune.py or gpu.py, until
``--budget`` seconds are spent:

- each step runs for at most its own limit, so that no step starves the ones
  after it, and at most the budget left; a step stopped there keeps the rows it
  finished (each script writes its JSON after every row);
- the steps the budget leaves out are listed, with the command that runs them
  in the next call;
- what a step needs to compare is built here from the library's own files: a
  copy of a family's ``_pallas.py`` with a launch option or a limit set
  otherwise, by substitutions that must each match (a test checks every step's
  on the library as it is, and every step's command line against its script's);
- under ``--out`` (default: ``$OUT`` where it is set, as on the device
  machine, else ``build/lease``), each step leaves its log, its JSON and the
  kernels file it compared;
- it prints each step's table as it ends, and last a short table of the steps:
  how each ended, its seconds, what its JSON holds.

``--list`` prints the steps and their commands without running them;
``--steps`` runs some, in the order given.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
KERNELS = {
    "depthwise": ROOT / "jaxgrad" / "_depthwise" / "_pallas.py",
    "resample": ROOT / "jaxgrad" / "_resample" / "_pallas.py",
}
# One call of the device tool runs at most 600 s; the rest is the margin for
# the steps' last rows to be written and the summary to print.
BUDGET = 540
# After a stopped step's SIGTERM, how long it has to end before SIGKILL.
GRACE = 10
# What the device tool brings back of a command's output: its last 12,000
# characters. A step's table is cut to its last lines where longer.
TABLE_LINES = 30


@dataclasses.dataclass(frozen=True)
class Variant:
    """A family's kernels file with each ``old`` text replaced by ``new``."""

    family: str
    substitutions: tuple[tuple[str, str], ...]

    def text(self) -> str:
        """The library's file with the substitutions made; each must match."""
        text = KERNELS[self.family].read_text()
        for old, new in self.substitutions:
            if old not in text:
                raise ValueError(
                    f"{KERNELS[self.family].relative_to(ROOT)} has no {old!r} to set to "
                    f"{new!r}: the option was renamed or moved; update benchmarks/lease.py"
                )
            text = text.replace(old, new)
        return text


@dataclasses.dataclass(frozen=True)
class Step:
    """One measurement: ``script`` (in benchmarks/) run with ``args``, given the
    ``variant`` file first where there is one, for at most ``limit`` seconds."""

    name: str
    question: str
    script: str
    args: str  # as typed on a command line
    limit: float
    variant: Variant | None = None

    def command(self, out: pathlib.Path) -> list[str]:
        """The command line, writing its JSON (and reading its variant) under ``out``."""
        given = [str(out / f"{self.name}.py")] if self.variant else []
        return [
            sys.executable,
            str(BENCHMARKS / self.script),
            *given,
            *shlex.split(self.args),
            "--json",
            str(out / f"{self.name}.json"),
        ]


def limit(name: str, old: str, new: str) -> tuple[str, str]:
    """A module-level limit, from ``old`` to ``new``."""
    return f"\n{name} = {old}\n", f"\n{name} = {new}\n"


# The launches before the sixth lease's measurements: no kernel walking its columns,
# every NCHW kernel reading unaligned runs from aligned vectors; resample reading
# through its tables alone.
BEFORE_DEPTHWISE = Variant(
    "depthwise",
    (
        ("reuse_rows=True, walk_taps=9, walk_warps=1", "reuse_rows=True"),
        ("wide_strided_reads=True\n", "wide_strided_reads=True, aligned_reads=True\n"),
        ("wide_strided_writes=True)", "wide_strided_writes=True, aligned_reads=True)"),
    ),
)
RESAMPLE_LAUNCH = "return dataclasses.replace(launch, paired=True, rows_together=together)"
BEFORE_RESAMPLE = Variant("resample", ((RESAMPLE_LAUNCH, "return launch"),))
VOLUME = Variant(
    "resample",
    (
        (
            RESAMPLE_LAUNCH,
            "return dataclasses.replace(launch, paired=True, row_pattern=True, warps=1)",
        ),
    ),
)
# Resample's rows held together where they are short alone, as before rows of two
# outputs a lane were held together for their stores.
SHORT_ROWS_ONLY = Variant(
    "resample", (("together = short_rows or narrow_stores\n", "together = short_rows\n"),)
)
WIDE_TILE = Variant("depthwise", (limit("_MOST_SUMS", "72", "1 << 30"),))
UNROLLED = Variant("resample", (limit("_MAX_UNROLLED_READS", "64", "1 << 30"),))
LOOPED = Variant("resample", (limit("_MAX_UNROLLED_READS", "64", "63"),))
OPS = "--ops forward backprop_input backprop_filter"

# Most urgent first: what the defaults changed since they were last timed (the
# U-Net step, then every case in the one run the targets are read from), then
# the designs meant to reach the targets, then launch options and searches, then
# what compiles for longest.
STEPS = (
    Step(
        "unet-tiled",
        "the example U-Net's step with jaxgrad's ops against stock ops, and with no "
        "depthwise kernel walking its columns (the NHWC filter gradient walks by default)",
        "gpu.py",
        "--sections train",
        limit=180,
    ),
    Step(
        "whole",
        "the whole command in one run, as the GPU issues read their targets: every section "
        "with the defaults as they are, and its wall time against the 8 minutes the "
        "depthwise GPU issue asks for (stopped at the budget, its rows say how far it got)",
        "gpu.py",
        "",
        limit=BUDGET,
    ),
    Step(
        "walk-grid",
        "the walking NHWC filter gradient's grid cut into more, shorter programs (its rows "
        "in segments), where whole rows make just over one wave of programs",
        "tune.py",
        '--family depthwise --groups "walk grid" --cases "3x3 s1 NHWC" "3x3 s2 NHWC" '
        '"M2 NHWC" --ops backprop_filter',
        limit=150,
    ),
    Step(
        "walk-reads",
        "the NHWC forward and input gradient walking their columns, an iteration's reads "
        "before its arithmetic (read step by step, each step waited on memory), against "
        "their tiles, then the walk's grid",
        "tune.py",
        '--family depthwise --groups "walk columns" "walk grid" --cases "96] 3x3 s1 NHWC" '
        "--ops forward backprop_input",
        limit=150,
    ),
    Step(
        "depthwise-before",
        "the depthwise kernels as they are (the NHWC filter gradient walking a 3x3 "
        "filter's columns, no NCHW kernel but the multiplier's forward and filter gradient "
        "reading aligned vectors) against the launches "
        "before, every case they change",
        "compare.py",
        f'--cases "96] 3x3 s1" "96] 3x3 s2" "192] 5x5 s1 NCHW" M2 {OPS}',
        limit=200,
        variant=BEFORE_DEPTHWISE,
    ),
    Step(
        "resample-before",
        "the resample kernel as it is (a last axis read in pairs, short rows and rows of "
        "two outputs a lane storing narrow vectors held together) against its tables alone, "
        "every channels-first case",
        "compare.py",
        "--family resample --cases NCHW NCDHW",
        limit=240,
        variant=BEFORE_RESAMPLE,
    ),
    Step(
        "narrow-stores",
        "the resample kernel holding rows of two outputs a lane together where a row alone "
        "stores under 16 bytes a thread (timed so only with every row together) against "
        "holding short rows alone",
        "compare.py",
        '--family resample --cases "NCHW linear 2.0x bfloat16" "NCHW nearest 2.0x bfloat16" '
        '"NCHW linear 0.5x bfloat16" "NCHW nearest 0.5x bfloat16"',
        limit=120,
        variant=SHORT_ROWS_ONLY,
    ),
    Step(
        "resample-defaults",
        "the kernel, as it launches, against XLA's program, where "
        "the default takes the kernel for the channels-first linear 2x forwards and leaves "
        "their gradients with XLA",
        "gpu.py",
        '--sections resample --cases NCDHW "NCHW linear 2.0x" --dtypes bfloat16',
        limit=150,
    ),
    Step(
        "walk-tile",
        "the channels of the walking NHWC filter gradient's tile (16, 32 or 64), never searched",
        "tune.py",
        '--family depthwise --groups "walk tile" --cases "3x3 s1 NHWC" "3x3 s2 NHWC" '
        '"M2 NHWC" --ops backprop_filter',
        limit=120,
    ),
    Step(
        "wide-tile",
        "a 5x5 NCHW filter gradient whose tile narrows to 64 columns to hold its sums, "
        "against the 128-column tile",
        "compare.py",
        '--cases "[32,112,112,32] 5x5 s1 NCHW" --ops backprop_filter',
        limit=90,
        variant=WIDE_TILE,
    ),
    Step(
        "read-ahead",
        "the depthwise kernels reading their next row before computing the current one",
        "tune.py",
        f'--family depthwise --groups "read ahead" --cases "96] 3x3 s1" {OPS}',
        limit=120,
    ),
    Step(
        "row-pattern",
        "resample reading once each input row that a block of whole periods shares, 2-D linear",
        "tune.py",
        '--family resample --groups "row pattern" --cases "NCHW linear" "NHWC linear 2.0x" '
        '"NHWC linear 0.5x" "NHWC linear 1.7x"',
        limit=180,
    ),
    Step(
        "volume",
        "the 3-D volume's rows read by their height's pattern, on one warp, in place of its "
        "rows held together, against the library",
        "compare.py",
        "--family resample --cases NCDHW",
        limit=150,
        variant=VOLUME,
    ),
    Step(
        "looped-4x",
        "the 4x linear resample gradient with its row taps summed in a loop, which compiles "
        "in a tenth of the time, against unrolled (64 reads, the most unrolled)",
        "compare.py",
        '--family resample --cases "linear 4.0x" --ops backward',
        limit=90,
        variant=LOOPED,
    ),
    Step(
        "nchw-5x5-taps",
        "the 5x5 NCHW forward and input gradient holding more of their taps, then their "
        "tile and warps (never searched)",
        "tune.py",
        '--family depthwise --groups taps "tile and warps" --cases "192] 5x5 s1 NCHW bfloat16" '
        "--ops forward backprop_input",
        limit=240,
    ),
    Step(
        "walks-5x5",
        "the 5x5 NHWC kernels walking their columns (each walk holds about 250 registers)",
        "tune.py",
        f'--family depthwise --groups "walk columns" --cases "192] 5x5 s1 NHWC bfloat16" {OPS}',
        limit=300,
    ),
    Step(
        "unrolled-8x",
        "the 8x linear resample gradient with its row taps unrolled, as before they were "
        "looped to compile in a second (the unrolled kernel compiles for about a minute)",
        "compare.py",
        "--family resample --cases 8.0x --ops backward",
        limit=300,
        variant=UNROLLED,
    ),
)


@dataclasses.dataclass
class Ended:
    """How a step ended: ``"done"``, ``"failed (rc N)"``, ``"stopped at its limit"``,
    ``"stopped at the budget"`` or ``"not run"``; its seconds, and what its JSON
    holds (``wrote``)."""

    step: Step
    how: str
    seconds: float = 0.0
    wrote: str = "nothing"


def json_of(path: pathlib.Path) -> dict[str, Any]:
    """A step's JSON (empty where it wrote none, or half of one)."""
    try:
        results: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return results


def rows_of(path: pathlib.Path) -> list[dict[str, Any]]:
    """The rows a comparison's or a search's JSON holds."""
    rows: list[dict[str, Any]] = json_of(path).get("rows", [])
    return rows


def wrote(path: pathlib.Path) -> str:
    """What a step's JSON holds: its rows (compare.py, tune.py), or the
    measurements it recorded (gpu.py's sections)."""
    results = json_of(path)
    if "rows" in results:
        return f"{len(results['rows'])} row" + ("" if len(results["rows"]) == 1 else "s")
    measured = [key for key in results if key not in ("command", "machine", "seconds")]
    return ", ".join(measured) or "nothing"


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stops ``process`` and every process it started: SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(step: Step, out: pathlib.Path, seconds: float) -> Ended:
    """Runs ``step`` for at most ``seconds`` (and its limit), its log under ``out``."""
    if step.variant:
        (out / f"{step.name}.py").write_text(step.variant.text())
    (out / f"{step.name}.json").unlink(missing_ok=True)  # an earlier run's rows are not its
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    allowed = min(step.limit, seconds)
    start = time.monotonic()
    with open(out / f"{step.name}.log", "w") as log:
        process = subprocess.Popen(
            step.command(out),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with its children
        )
        try:
            rc = process.wait(timeout=allowed)
            how = "done" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            stop(process)
            how = "stopped at its limit" if allowed == step.limit else "stopped at the budget"
    return Ended(step, how, time.monotonic() - start, wrote(out / f"{step.name}.json"))


def table_of(step: Step, out: pathlib.Path) -> str:
    """What ``step`` measured, as its script renders it (from its JSON, so a step
    stopped early shows the rows it finished); else its log's last lines."""
    rows = rows_of(out / f"{step.name}.json")
    render: Callable[[list[dict[str, Any]]], str] | None = None
    if rows and step.script in ("compare.py", "tune.py"):
        # The renderers import the library, which a bare machine has not installed.
        for path in (str(ROOT), str(BENCHMARKS)):
            if path not in sys.path:
                sys.path.insert(0, path)
        render = importlib.import_module(step.script.removesuffix(".py")).render
    text = render(rows) if render else (out / f"{step.name}.log").read_text()
    return "\n".join(text.rstrip().splitlines()[-TABLE_LINES:])


def summary(ended: Sequence[Ended]) -> str:
    lines = ["| step | ended | seconds | its JSON holds |", "|---|---|---|---|"]
    lines += [f"| {e.step.name} | {e.how} | {e.seconds:.0f} | {e.wrote} |" for e in ended]
    left = [e.step.name for e in ended if e.how == "not run"]
    if left:
        lines += ["", "Not run: python benchmarks/lease.py --steps " + " ".join(left)]
    return "\n".join(lines)


def run(steps: Sequence[Step], out: pathlib.Path, budget: float) -> list[Ended]:
    """Runs ``steps`` in order until ``budget`` seconds are spent, printing each
    step's table as it ends and the summary last."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget
    ended = []
    for step in steps:
        left = deadline - time.monotonic()
        if left < 1:
            ended.append(Ended(step, "not run"))
            continue
        print(f"== {step.name}: {step.question}", flush=True)
        ended.append(run_step(step, out, left))
        print(f"-- {ended[-1].how} after {ended[-1].seconds:.0f} s", flush=True)
        print(table_of(step, out), flush=True)
        print(flush=True)
    print(summary(ended), flush=True)
    return ended


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget", type=float, default=BUDGET, help=f"seconds for all steps (default {BUDGET})"
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(os.environ.get("OUT") or ROOT / "build" / "lease"),
        help="where each step's log, JSON and kernels file go (default: $OUT, else build/lease)",
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        choices=[step.name for step in STEPS],
        default=None,
        help="only these steps, in this order (default: all, most urgent first)",
    )
    parser.add_argument(
        "--list", action="store_true", help="print the steps and their commands, run nothing"
    )
    return parser


def main() -> None:
    args = arguments().parse_args()
    by_name = {step.name: step for step in STEPS}
    steps = [by_name[name] for name in args.steps] if args.steps else list(STEPS)
    if args.list:
        for step in steps:
            print(f"{step.name} (at most {step.limit:.0f} s): {step.question}")
            command = step.command(args.out)[2:]
            print("    " + shlex.join(["python", f"benchmarks/{step.script}", *command]))
            if step.variant:
                for old, new in step.variant.substitutions:
                    change = f"{old.strip()!r} -> {new.strip()!r}"
                    print(f"    {step.variant.family}'s kernels with {change}")
        return
    run(steps, args.out, args.budget)


if __name__ == "__main__":
    main()
