"""resample forward and backward against the roofline, jax.image.resize and PyTorch.

    python benchmarks/resample.py [--dtypes float32 bfloat16] [--layouts NCHW NHWC]
                                  [--repeats 9]

[8, 32, 128, 128] NCHW and [8, 128, 128, 32] NHWC, half-pixel, linear and nearest,
spatial scale 2 and 0.5.
Forward: y = resample(x). Backward: dx = resample_grad(dy) (what jax.grad runs).
The roofline moves the same bytes as the op, each way: it reads |x| and writes |y|
for the forward, reads |dy| and writes |dx| for the backward. PyTorch (CPU,
F.interpolate) is timed when installed, with the same number of threads as XLA, on
tensors in the same memory layout (NHWC as PyTorch's channels_last).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from _harness import Table, finish, interleaved_ms, nbytes, parser, roofline, torch_or_none

import jaxgrad

SHAPE = (8, 32, 128, 128)  # NCHW
PEERS = ["jax.image.resize", "torch"]


def nhwc(shape_or_scales):
    n, c, h, w = shape_or_scales
    return (n, h, w, c)


def jaxgrad_fns(mode, scales, in_shape):
    fwd = jax.jit(lambda x: jaxgrad.resample(x, scales, mode=mode))
    bwd = jax.jit(lambda dy: jaxgrad.resample_grad(dy, in_shape, scales, mode=mode))
    return fwd, bwd


def jax_image_fns(mode, out_shape):
    method = "linear" if mode == "linear" else "nearest"

    def f(x):
        return jax.image.resize(x, out_shape, method)

    fwd = jax.jit(f)
    bwd = jax.jit(lambda x, dy: jax.vjp(f, x)[1](dy)[0])
    return fwd, bwd


def torch_calls(torch, mode, scale, x_np, dy_np, dtype_name, layout):
    """PyTorch's forward and backward (CPU, F.interpolate) as zero-argument calls.

    The arrays are NCHW; for NHWC they are laid out channels_last, so that PyTorch
    reads and writes the same memory order as jaxgrad.
    """
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    kw = dict(scale_factor=scale, mode="bilinear" if mode == "linear" else "nearest-exact")
    if mode == "linear":
        kw["align_corners"] = False
    memory = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    x = torch.tensor(x_np).to(dtype).contiguous(memory_format=memory)
    dy = torch.tensor(dy_np).to(dtype).contiguous(memory_format=memory)
    F = torch.nn.functional

    def fwd():
        with torch.no_grad():
            return F.interpolate(x, **kw)

    xg = x.clone().requires_grad_(True)
    y = F.interpolate(xg, **kw)
    return {"fwd": fwd, "bwd": lambda: torch.autograd.grad(y, xg, dy, retain_graph=True)}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--layouts", nargs="+", default=["NCHW", "NHWC"])
    args = p.parse_args()
    torch = torch_or_none()
    rng = np.random.default_rng(0)
    table = Table("resample, half-pixel: NCHW [8, 32, 128, 128], NHWC [8, 128, 128, 32]", PEERS)
    for layout in args.layouts:
        to_layout = nhwc if layout == "NHWC" else (lambda shape: shape)
        for dtype_name in args.dtypes:
            dtype = jnp.dtype(dtype_name)
            for mode in ("linear", "nearest"):
                for scale in (2, 0.5):
                    # NCHW arrays for PyTorch, transposed for jaxgrad's NHWC.
                    out_shape = (*SHAPE[:2], int(SHAPE[2] * scale), int(SHAPE[3] * scale))
                    x_np = rng.normal(size=SHAPE).astype(np.float32)
                    dy_np = rng.normal(size=out_shape).astype(np.float32)
                    x = jnp.asarray(x_np.transpose(to_layout((0, 1, 2, 3))), dtype)
                    dy = jnp.asarray(dy_np.transpose(to_layout((0, 1, 2, 3))), dtype)
                    scales = to_layout((1, 1, scale, scale))
                    fwd, bwd = jaxgrad_fns(mode, scales, x.shape)
                    peer_fwd, peer_bwd = jax_image_fns(mode, dy.shape)
                    # The forward reads x and writes y; the backward reads dy, writes dx.
                    fwd_roof, fwd_roof_args = roofline(nbytes(x), nbytes(dy))
                    bwd_roof, bwd_roof_args = roofline(nbytes(dy), nbytes(x))
                    calls = {
                        "fwd roofline": partial(fwd_roof, *fwd_roof_args),
                        "bwd roofline": partial(bwd_roof, *bwd_roof_args),
                        "fwd jaxgrad": partial(fwd, x),
                        "fwd jax.image.resize": partial(peer_fwd, x),
                        "bwd jaxgrad": partial(bwd, dy),
                        "bwd jax.image.resize": partial(peer_bwd, x, dy),
                    }
                    if torch is not None:
                        peer = torch_calls(torch, mode, scale, x_np, dy_np, dtype_name, layout)
                        calls |= {"fwd torch": peer["fwd"], "bwd torch": peer["bwd"]}
                    ms = interleaved_ms(calls, repeats=args.repeats)
                    for direction in ("fwd", "bwd"):
                        case = f"{direction} {mode} x{scale} {dtype_name} {layout}"
                        peers = {
                            name: ms[f"{direction} {name}"]
                            for name in PEERS
                            if f"{direction} {name}" in ms
                        }
                        ours, floor = ms[f"{direction} jaxgrad"], ms[f"{direction} roofline"]
                        table.add_case(case, ours, floor, peers)
    finish(table, args)


if __name__ == "__main__":
    main()
