"""Draw the docs' figures from jaxgrad itself, and the performance tables from the benchmarks.

    python docs/make_figures.py            # rewrite docs/images/*.png and the tables
    python docs/make_figures.py --check    # exit 1 if performance.md's tables are stale

Nothing here is drawn by hand: every sampling pattern, weight curve, receptive field
and gradient below is computed by calling jaxgrad's ops (their Jacobians, one-hot
probes, or the seeds' examples), so a change of semantics shows up in the pictures.
The performance tables and charts are rendered from the JSON that the benchmarks
write (``python benchmarks/<name>.py --json docs/data/<name>.json``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

import jaxgrad

DOCS = pathlib.Path(__file__).resolve().parent
IMAGES = DOCS / "images"
DATA = DOCS / "data"
PERFORMANCE_PAGE = DOCS / "performance.md"
BENCHMARKS = ("relu", "resample", "depthwise", "train")

BLUE, ORANGE, GREEN, GREY, RED = "#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#d62728"


# --- Small drawing helpers ---------------------------------------------------------


def draw_grid(ax, values, origin=(0.0, 0.0), *, fmt="{:g}", shade=None, color=BLUE):
    """Draw a 2-D array as labelled unit cells, row 0 on top; returns cell centres."""
    values = np.asarray(values)
    rows, cols = values.shape
    x0, y0 = origin
    shade = np.zeros(values.shape) if shade is None else np.asarray(shade, float)
    centres = {}
    for r in range(rows):
        for c in range(cols):
            x, y = x0 + c, y0 + rows - 1 - r
            alpha = 0.15 + 0.55 * shade[r, c] if shade[r, c] > 0 else 0.0
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=color, alpha=alpha))
            ax.add_patch(Rectangle((x, y), 1, 1, fill=False, edgecolor="black", lw=1))
            text = fmt.format(values[r, c]) if values[r, c] != 0 or shade[r, c] else ""
            ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=11)
            centres[r, c] = (x + 0.5, y + 0.5)
    return centres


def arrow(ax, start, end, color=GREY, rad=0.25):
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops={
            "arrowstyle": "->",
            "color": color,
            "lw": 1.4,
            "connectionstyle": f"arc3,rad={rad}",
        },
    )


def bare(ax, xlim, ylim):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


def linear_map(fn: Callable[[jax.Array], jax.Array], in_shape) -> np.ndarray:
    """The matrix of a linear op, [output elements, input elements], from its Jacobian.

    Reverse mode, so this goes through the op's custom VJP, which is the backward
    pass under test.
    """
    x = jnp.zeros(in_shape, jnp.float32)
    jac = jax.jacrev(fn)(x)
    out_size = int(np.prod(jac.shape[: jac.ndim - len(in_shape)]))
    return np.asarray(jac).reshape(out_size, -1)


# --- ReLU --------------------------------------------------------------------------


def relu_figure():
    x = jnp.linspace(-2.0, 2.0, 401, dtype=jnp.float32)
    y = jaxgrad.relu(x)
    dx = jaxgrad.relu_grad(x, jnp.ones_like(x))
    at_zero = jaxgrad.relu_grad(jnp.zeros(1), jnp.ones(1))[0]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.plot(x, y, color=BLUE)
    a.set_title("relu(x)")
    b.plot(x[x < 0], dx[x < 0], color=BLUE)
    b.plot(x[x > 0], dx[x > 0], color=BLUE)
    b.plot([0], [at_zero], "o", color=BLUE)
    b.plot([0], [1], "o", mfc="white", color=BLUE)
    b.annotate(
        "x == 0: gradient 0", (0, float(at_zero)), (0.3, 0.35), arrowprops={"arrowstyle": "->"}
    )
    b.set_title("relu_grad(x, dy=1)")
    for ax in (a, b):
        ax.axhline(0, color=GREY, lw=0.5)
        ax.axvline(0, color=GREY, lw=0.5)
        ax.set_xlabel("x")
    fig.tight_layout()
    return fig


# --- Resample ----------------------------------------------------------------------

SEED_SCALES = (0.5, 1.5)  # the seeds' example: x [[1, 2], [3, 4]], nearest, rounding down


def resample_example_figure():
    """Which input each output samples (forward) and how dy splats back (gradient)."""
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    dy = np.array([[4.0, 5.0, 6.0]], np.float32)

    def forward(x):
        return jaxgrad.resample(x, SEED_SCALES, rounding="down")

    y = np.asarray(forward(jnp.asarray(x)))
    dx = np.asarray(jaxgrad.resample_grad(jnp.asarray(dy), x.shape, SEED_SCALES, rounding="down"))
    weights = linear_map(forward, x.shape)  # [3 outputs, 4 inputs]

    fig, (fwd_ax, bwd_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    read = (weights.sum(axis=0) > 0).reshape(x.shape)
    for ax, top, bottom, top_title, bottom_title, color in (
        (fwd_ax, y, x, "y = resample(x)", "x", BLUE),
        (bwd_ax, dy, dx, "dy", "dx = resample_grad(dy)", ORANGE),
    ):
        inputs = draw_grid(ax, bottom, (0, 0), shade=read, color=color)
        outputs = draw_grid(ax, top, (3.5, 1), shade=np.ones(top.shape), color=color)
        ax.text(1, -0.35, bottom_title, ha="center", va="top")
        ax.text(5, 0.65, top_title, ha="center", va="top")
        # An arc over the grids from every output to every input it reads.
        for o, i in zip(*np.nonzero(weights), strict=True):
            (ox, oy), (ix, iy) = (
                outputs[np.unravel_index(o, y.shape)],
                inputs[np.unravel_index(i, x.shape)],
            )
            arrow(ax, (ox, oy + 0.5), (ix, iy + 0.5), color, rad=0.45)
        bare(ax, (-0.2, 6.7), (-0.9, 3.4))
    fwd_ax.set_title("forward: each output reads one input (row 1 is never read)", fontsize=10)
    bwd_ax.set_title("gradient: each dy splats back, dx[0, 0] = 4 + 5", fontsize=10)
    fig.tight_layout()
    return fig


def resample_weights_figure():
    """Weight of each input sample along one axis, as a function of the output position."""
    n_in, scale = 4, 25.0
    n_out = int(n_in * scale)
    position = (np.arange(n_out) + 0.5) / scale  # the output's centre, in input pixels
    configs = [
        ("nearest, rounding='half_up'", {"mode": "nearest", "rounding": "half_up"}),
        ("nearest, rounding='down'", {"mode": "nearest", "rounding": "down"}),
        ("nearest, rounding='up'", {"mode": "nearest", "rounding": "up"}),
        ("linear", {"mode": "linear"}),
    ]
    colors = [BLUE, ORANGE, GREEN, RED]
    fig, axes = plt.subplots(len(configs), 1, figsize=(8, 7), sharex=True)
    for ax, (title, kwargs) in zip(axes, configs, strict=True):
        weights = linear_map(lambda x, kw=kwargs: jaxgrad.resample(x, (scale,), **kw), (n_in,))
        step = "steps-mid" if kwargs["mode"] == "nearest" else "default"
        for i in range(n_in):
            ax.plot(position, weights[:, i], color=colors[i], label=f"input {i}", drawstyle=step)
        for i in range(n_in + 1):
            ax.axvline(i, color=GREY, lw=0.4)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(-0.08, 1.12)
        ax.set_yticks([0, 0.5, 1])
    axes[0].legend(ncol=n_in, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 1.65))
    axes[-1].set_xlabel(
        "output sample centre, in input pixels (half-pixel coordinates; pixel i spans [i, i+1])"
    )
    fig.supylabel("weight")
    fig.tight_layout()
    return fig


# --- Depthwise ---------------------------------------------------------------------


def depthwise_figure():
    """One output's receptive field, one input's readers, and backprop_input's counts.

    3x3 filter with taps 1..9, stride 2, SAME, on a 5x5 input (output 3x3).
    """
    taps = jnp.arange(1.0, 10.0, dtype=jnp.float32).reshape(3, 3, 1, 1)
    strides, padding = (2, 2), "SAME"
    one_hot_dy = jnp.zeros((1, 3, 3, 1), jnp.float32).at[0, 1, 1, 0].set(1)
    window = jaxgrad.depthwise_conv2d_backprop_input(
        (1, 5, 5, 1), taps, one_hot_dy, strides, padding
    )
    one_hot_x = jnp.zeros((1, 5, 5, 1), jnp.float32).at[0, 1, 1, 0].set(1)
    readers = jaxgrad.depthwise_conv2d(one_hot_x, taps, strides, padding)
    counts = jaxgrad.depthwise_conv2d_backprop_input(
        (1, 5, 5, 1), jnp.ones((3, 3, 1, 1)), jnp.ones((1, 3, 3, 1)), strides, padding
    )
    window, readers, counts = (np.asarray(a[0, :, :, 0]) for a in (window, readers, counts))

    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    draw_grid(axes[0], window, shade=window > 0, fmt="f{:g}")
    axes[0].set_title(
        "forward: out[1, 1] reads this window\n(the tap each pixel meets)", fontsize=10
    )
    draw_grid(axes[1], readers, shade=readers > 0, color=ORANGE, fmt="f{:g}")
    axes[1].set_title(
        "the transpose: x[1, 1] is read by these outputs\n(with the mirrored taps)", fontsize=10
    )
    draw_grid(axes[2], counts, shade=counts / counts.max(), color=GREEN)
    axes[2].set_title(
        "backprop_input(dy = 1, filter = 1):\nhow many outputs read each input", fontsize=10
    )
    for ax, n in zip(axes, (5, 3, 5), strict=True):
        bare(ax, (-0.2, n + 0.2), (-0.2, n + 0.2))
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.86, wspace=0.1)
    return fig


# --- Performance -------------------------------------------------------------------


def load_benchmark(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def by_case(data: dict) -> dict[str, dict[str, dict]]:
    """{case: {impl: row}}, in the benchmark's order."""
    cases: dict[str, dict[str, dict]] = {}
    for row in data["rows"]:
        cases.setdefault(row["case"], {})[row["impl"]] = row
    return cases


def ours(impls: dict[str, dict]) -> dict:
    """jaxgrad's row of a case; it carries the baseline's and the peers' times."""
    return next(row for name, row in impls.items() if name.startswith("jaxgrad"))


def performance_table(data: dict) -> str:
    """One row per case: jaxgrad's time, then its ratio to the baseline and each peer."""
    header = ["case", "jaxgrad ms", f"x {data['baseline']}", *[f"x {p}" for p in data["peers"]]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for case, impls in by_case(data).items():
        row = ours(impls)
        ratios = [row["ms"] / row["baseline_ms"]]
        ratios += [
            row["ms"] / row["peers"][p] if p in row["peers"] else None for p in data["peers"]
        ]
        cells = ["" if r is None else f"{r:.2f}" for r in ratios]
        lines.append(f"| {case} | {row['ms']:.2f} | " + " | ".join(cells) + " |")
    m = data["machine"]
    torch = f"torch {m['torch']}" if m["torch"] else "torch not installed"
    lines += [
        "",
        f"Measured {m['date']} on {m['processor']}, {m['cpu_cores']} cores ({m['devices']}), "
        f"Python {m['python']}, jax {m['jax']}, numpy {m['numpy']}, {torch}: "
        f"`{data['command']}`.",
    ]
    return "\n".join(lines)


def performance_figure(data: dict):
    """Each implementation's time over jaxgrad's, per case (log scale; right of 1 is slower)."""
    cases = by_case(data)
    impls = [name for name in next(iter(cases.values())) if not name.startswith("jaxgrad")]
    colors = dict(zip(impls, [GREY, ORANGE, GREEN, RED, BLUE], strict=False))
    height = 0.8 / len(impls)
    all_ratios: list[float] = []
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.17 * len(cases) * len(impls)))
    for k, impl in enumerate(impls):
        ys, ratios = [], []
        for row, timings in enumerate(cases.values()):
            if impl in timings:
                ys.append(row + k * height)
                ratios.append(timings[impl]["ms"] / ours(timings)["ms"])
        all_ratios += ratios
        # Bars grow from 1 (jaxgrad's time): left is faster than jaxgrad, right slower.
        widths = [r - 1 for r in ratios]
        ax.barh(ys, widths, left=1, height=height, color=colors[impl], label=impl)
    ax.set_xscale("log")
    # At least 0.5x to 2x, whatever the data: a ratio near 1 must look near 1.
    ax.set_xlim(min(0.5, min(all_ratios) / 1.3), max(2.0, max(all_ratios) * 1.3))
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain if ax.get_xlim()[1] / ax.get_xlim()[0] < 20 else "")
    ax.axvline(1, color="black", lw=1)
    ax.set_yticks([row + 0.4 - height / 2 for row in range(len(cases))], list(cases), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time / jaxgrad's time in the same run (log; right of 1: jaxgrad is faster)")
    ax.set_title(data["title"], fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


TABLE = re.compile(r"(<!-- table: (\w+) -->\n).*?(<!-- end table -->)", re.DOTALL)


def benchmark_script(name: str) -> Any:
    """The module of ``benchmarks/<name>.py``, whose renderers the pages reuse."""
    scripts = str(DOCS.parent / "benchmarks")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    return importlib.import_module(name)


# The GPU benchmark's tables, which benchmarks/gpu.py renders itself.
GPU_TABLE = re.compile(r"(<!-- gpu table: (\w+) -->\n).*?(<!-- end table -->)", re.DOTALL)
# The launch searches' table, which benchmarks/tune.py renders itself.
TUNE_TABLE = re.compile(r"(<!-- tune table: (\w+) -->\n).*?(<!-- end table -->)", re.DOTALL)
# A change timed against the library's kernels, which benchmarks/compare.py renders.
COMPARE_TABLE = re.compile(r"(<!-- compare table: (\w+) -->\n).*?(<!-- end table -->)", re.DOTALL)


def gpu_tables(data: dict) -> str:
    """The tables ``benchmarks/gpu.py`` prints for the run that wrote ``data``."""
    return benchmark_script("gpu").render(data)  # type: ignore[no-any-return]


def tune_table(data: dict) -> str:
    """The table ``benchmarks/tune.py`` prints for the searches in ``data``."""
    return benchmark_script("tune").render(data["rows"])  # type: ignore[no-any-return]


def compare_table(data: dict) -> str:
    """The table ``benchmarks/compare.py`` prints for the run in ``data``."""
    return benchmark_script("compare").render(data["rows"])  # type: ignore[no-any-return]


def performance_page(text: str) -> str:
    """The page with every marked table re-rendered from its benchmark's JSON."""
    text = TABLE.sub(lambda m: m[1] + performance_table(load_benchmark(m[2])) + "\n" + m[3], text)
    text = GPU_TABLE.sub(lambda m: m[1] + gpu_tables(load_benchmark(m[2])) + "\n" + m[3], text)
    text = COMPARE_TABLE.sub(
        lambda m: m[1] + compare_table(load_benchmark(m[2])) + "\n" + m[3], text
    )
    return TUNE_TABLE.sub(lambda m: m[1] + tune_table(load_benchmark(m[2])) + "\n" + m[3], text)


# --- Writing -----------------------------------------------------------------------


def figures() -> dict[str, Callable[[], object]]:
    """Every figure the pages show, by file name."""
    makers: dict[str, Callable[[], object]] = {
        "relu.png": relu_figure,
        "resample_example.png": resample_example_figure,
        "resample_weights.png": resample_weights_figure,
        "depthwise_receptive_field.png": depthwise_figure,
    }
    for name in BENCHMARKS:
        makers[f"performance_{name}.png"] = lambda name=name: performance_figure(
            load_benchmark(name)
        )
    return makers


def write_figures(out_dir: pathlib.Path) -> list[pathlib.Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in figures().items():
        fig = make()
        path = out_dir / name
        # No "Software" stamp, so an unchanged figure is an unchanged file.
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the tables are current")
    args = parser.parse_args()
    text = PERFORMANCE_PAGE.read_text()
    if args.check:
        stale = performance_page(text) != text
        print("performance.md's tables are stale" if stale else "performance.md is current")
        return int(stale)
    PERFORMANCE_PAGE.write_text(performance_page(text))
    for path in write_figures(IMAGES):
        print(path.relative_to(DOCS.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
