"""Prints a digest of every op's forward and gradients, one line each, for comparing
fresh processes (tests/test_determinism.py here, benchmarks/gpu.py on a GPU).

    python tests/determinism_check.py [--size small|large] [--threads N]

Each line is ``<case> <sha256 of the result's bytes>``. The resample and depthwise
ops run in every implementation that can run on the default backend (the default,
"xla" and "pallas" on CUDA GPUs; "xla", and "pallas" in float32, on the CPU, where
the default is "xla"; "pallas" only where this JAX has Pallas' Triton backend).
``large`` uses the shapes a GPU trains on, where XLA's autotuner would pick a
reduction's tiling per process; ``small`` keeps interpreted kernels quick on the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

import jaxgrad
from jaxgrad import _kernels

SIZES = {
    # (resample input NHWC, depthwise input NHWC, depthwise filters). With a
    # multiplier of 2 the kernels read each input channel once and repeat it in
    # registers; with 3, once for each of its output channels.
    "small": ((2, 16, 16, 8), (2, 12, 12, 8), ((3, 3, 8, 2), (3, 3, 8, 3))),
    "large": ((32, 64, 64, 64), (32, 112, 112, 96), ((3, 3, 96, 1),)),
}

# A long axis (rows computed from the pattern) and a large upsampling, whose
# gradient sums each input's 80 taps in a loop: (length, scale).
LONG_AXES = ((5000, 1.37), (200, 40.0))


def digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def implementations(dtype) -> list[str | None]:
    """The implementations to run here for ``dtype``. On the CPU the default is the
    "xla" program itself (tests/test_*_implementations.py compare the lowered
    programs), so it is not run twice, and the interpreted kernels, slow to compile,
    run in float32 alone: interpreted, a half type changes only what they load."""
    platform = jax.default_backend()
    kernels = ["pallas"] if _kernels.AVAILABLE else []
    if platform == "cpu":
        return ["xla", *kernels] if dtype == jnp.float32 else ["xla"]
    if platform == "gpu" and "cuda" in jax.devices()[0].client.platform_version.lower():
        return [None, "xla", *kernels]
    return [None, "xla"]


def cases(size: str):
    """Yields (name, function, arguments): each op's forward and its VJP."""
    resample_shape, conv_shape, filter_shapes = SIZES[size]
    rng = np.random.default_rng(0)

    for dtype in (jnp.float32, jnp.bfloat16):
        tag = jnp.dtype(dtype).name

        def arr(*shape):
            return jnp.asarray(rng.normal(size=shape), dtype)  # noqa: B023

        x = arr(*resample_shape)
        yield f"relu {tag}", lambda x: jax.vjp(jaxgrad.relu, x)[1](x)[0] + jaxgrad.relu(x), (x,)
        long_axes = {(length, scale): arr(2, length) for length, scale in LONG_AXES}
        for implementation in implementations(dtype):
            up = dict(implementation=implementation)
            modes = (("nearest", 2.0), ("linear", 2.0), ("linear", 0.5), ("linear", 1.7))
            if implementation == "pallas" and jax.default_backend() == "cpu":
                modes = modes[:2]  # interpreted kernels are slow to compile
            for (mode, scale), fmt in [*((m, "NHWC") for m in modes), (("linear", 2.0), "NCHW")]:
                xi = x if fmt == "NHWC" else jnp.transpose(x, (0, 3, 1, 2))
                scales = (1.0, scale, scale, 1.0) if fmt == "NHWC" else (1.0, 1.0, scale, scale)

                def resample_vjp(x, scales=scales, mode=mode, up=up):
                    y, vjp = jax.vjp(lambda x: jaxgrad.resample(x, scales, mode=mode, **up), x)
                    return y, vjp(y * 0.5 + 1)[0]

                yield f"resample {implementation} {mode} {scale} {fmt} {tag}", resample_vjp, (xi,)

            def resize_vjp(x, up=up):
                shape = (x.shape[0], 40, 24, x.shape[3])
                y, vjp = jax.vjp(lambda x: jaxgrad.resize(x, shape, mode="linear", **up), x)
                return y, vjp(y)[0]

            yield f"resize {implementation} {tag}", resize_vjp, (x,)

            for (length, scale), xl in long_axes.items():

                def long_vjp(x, scale=scale, up=up):
                    y, vjp = jax.vjp(
                        lambda x: jaxgrad.resample(x, (1, scale), mode="linear", **up), x
                    )
                    return y, vjp(y * 0.5 + 1)[0]

                name = f"resample {implementation} linear {scale} on {length} {tag}"
                yield name, long_vjp, (xl,)

        x = arr(*conv_shape)
        filters = [(f"M{shape[-1]} ", arr(*shape)) for shape in filter_shapes]
        for implementation in implementations(dtype):
            for fmt in ("NHWC", "NCHW"):
                xi = x if fmt == "NHWC" else jnp.transpose(x, (0, 3, 1, 2))

                def conv_vjp(x, f, fmt=fmt, implementation=implementation):
                    def conv(x, f):
                        return jaxgrad.depthwise_conv2d(
                            x, f, (1, 1), "SAME", data_format=fmt, implementation=implementation
                        )

                    y, vjp = jax.vjp(conv, x, f)
                    return y, vjp(y)

                # The kernels launch differently by multiplier; the XLA program
                # does not, and runs the first filter and a large one instead.
                if implementation != "pallas":
                    chosen = filters[:1]
                elif jax.default_backend() == "cpu":
                    # Interpreted kernels, slow to compile: each multiplier in one layout.
                    chosen = [filters[(fmt == "NCHW") % len(filters)]]
                else:
                    chosen = filters
                for multiplier, f in chosen:
                    yield f"depthwise {implementation} {multiplier}{fmt} {tag}", conv_vjp, (xi, f)
                if implementation != "pallas":  # a large filter: the XLA program's loop
                    f7 = arr(7, 7, *filter_shapes[0][2:])
                    yield f"depthwise {implementation} 7x7 {fmt} {tag}", conv_vjp, (xi, f7)


def compiled(case):
    """A case ``(name, function, operands)`` with its function lowered and compiled
    for the operands."""
    name, fn, operands = case
    return name, jax.jit(fn).lower(*operands).compile(), operands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="programs compiled at once"
    )
    args = parser.parse_args()
    # Every process compiles (on a GPU, autotunes) each program itself: a persistent
    # compilation cache (the test suite's, or a JAX_COMPILATION_CACHE_DIR of the
    # user's) would give the later processes the first one's executables.
    jax.config.update("jax_enable_compilation_cache", False)
    # Side by side, as XLA compiles without Python's lock: most of a run is compiling.
    # Each program is still compiled by this process; results come in the cases' order.
    with ThreadPoolExecutor(args.threads) as pool:
        for name, program, operands in pool.map(compiled, cases(args.size)):
            print(name, digest(program(*operands)), flush=True)


if __name__ == "__main__":
    main()
