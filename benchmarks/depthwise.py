"""Depthwise conv2d and its two backprops against the roofline, lax and PyTorch.

    python benchmarks/depthwise.py [--dtypes float32 bfloat16] [--repeats 9]

Cases: [8, 64, 64, 64] 3x3 stride 1 SAME in NHWC and NCHW, and 5x5 stride 2 with
depth multiplier 2 (NHWC). Peers: lax.conv_general_dilated with
feature_group_count (and its VJP for each backprop alone), and PyTorch CPU
(F.conv2d with groups; aten.convolution_backward for each backprop alone) when
installed. The roofline copies as many bytes as the op must read and write.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _harness import Table, finish, median_ms, nbytes, parser, roofline, torch_or_none
from jax import lax

import jaxgrad

CASES = [
    # name, data_format, (N, H, W, C), (fh, fw, M), stride
    ("3x3 s1 NHWC", "NHWC", (8, 64, 64, 64), (3, 3, 1), 1),
    ("3x3 s1 NCHW", "NCHW", (8, 64, 64, 64), (3, 3, 1), 1),
    ("5x5 s2 M2 NHWC", "NHWC", (8, 64, 64, 64), (5, 5, 2), 2),
]
PEERS = ["lax", "torch"]


def jaxgrad_fns(fmt, x_shape, f_shape, stride):
    kw = dict(data_format=fmt)
    fwd = jax.jit(lambda x, f: jaxgrad.depthwise_conv2d(x, f, (stride, stride), "SAME", **kw))
    bpi = jax.jit(
        lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(
            x_shape, f, dy, (stride, stride), "SAME", **kw
        )
    )
    bpf = jax.jit(
        lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(
            x, f_shape, dy, (stride, stride), "SAME", **kw
        )
    )
    return fwd, bpi, bpf


def lax_fns(fmt, c, m, stride):
    def conv(x, f):
        w = f.reshape(*f.shape[:2], 1, c * m)
        return lax.conv_general_dilated(
            x,
            w,
            (stride, stride),
            "SAME",
            dimension_numbers=(fmt, "HWIO", fmt),
            feature_group_count=c,
        )

    fwd = jax.jit(conv)
    bpi = jax.jit(lambda x, f, dy: jax.vjp(lambda x: conv(x, f), x)[1](dy)[0])
    bpf = jax.jit(lambda x, f, dy: jax.vjp(lambda f: conv(x, f), f)[1](dy)[0])
    return fwd, bpi, bpf


def torch_times(torch, fmt, x_np, f_np, dy_np, stride, dtype_name, repeats):
    """Forward, backprop input and backprop filter, each timed alone (NCHW tensors,
    channels_last memory for NHWC)."""
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    fmt_memory = torch.channels_last if fmt == "NHWC" else torch.contiguous_format

    def tensor(a_nhwc):
        t = torch.tensor(np.ascontiguousarray(np.transpose(a_nhwc, (0, 3, 1, 2)))).to(dtype)
        return t.contiguous(memory_format=fmt_memory)

    x, dy = tensor(x_np), tensor(dy_np)
    fh, fw, c, m = f_np.shape
    w = torch.tensor(
        np.ascontiguousarray(np.transpose(f_np.reshape(fh, fw, c * m), (2, 0, 1))[:, None])
    ).to(dtype)
    # PyTorch pads symmetrically, while SAME with stride 2 on an even size pads one
    # pixel more after. The work is what is compared, so symmetric padding is used.
    pad = ((fh - 1) // 2, (fw - 1) // 2)
    F, aten = torch.nn.functional, torch.ops.aten
    with torch.no_grad():
        fwd = median_ms(lambda: F.conv2d(x, w, None, stride, pad, 1, c), repeats=repeats)
        args = (dy, x, w, None, [stride] * 2, list(pad), [1, 1], False, [0, 0], c)
        bpi = median_ms(
            lambda: aten.convolution_backward(*args, [True, False, False]), repeats=repeats
        )
        bpf = median_ms(
            lambda: aten.convolution_backward(*args, [False, True, False]), repeats=repeats
        )
    return fwd, bpi, bpf


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = p.parse_args()
    torch = torch_or_none()
    rng = np.random.default_rng(0)
    table = Table("depthwise conv2d, [8, 64, 64, 64] input, SAME", PEERS)
    for dtype_name in args.dtypes:
        dtype = jnp.dtype(dtype_name)
        for name, fmt, (n, h, w, c), (fh, fw, m), stride in CASES:
            oh, ow = -(-h // stride), -(-w // stride)
            x_np = rng.normal(size=(n, h, w, c)).astype(np.float32)
            f_np = rng.normal(size=(fh, fw, c, m)).astype(np.float32)
            dy_np = rng.normal(size=(n, oh, ow, c * m)).astype(np.float32)
            layout = (lambda a: np.transpose(a, (0, 3, 1, 2))) if fmt == "NCHW" else (lambda a: a)
            x = jnp.asarray(layout(x_np), dtype)
            f = jnp.asarray(f_np, dtype)
            dy = jnp.asarray(layout(dy_np), dtype)
            ours = jaxgrad_fns(fmt, x.shape, f.shape, stride)
            peer = lax_fns(fmt, c, m, stride)
            timed = {
                "fwd": (
                    median_ms(ours[0], x, f, repeats=args.repeats),
                    median_ms(peer[0], x, f, repeats=args.repeats),
                    nbytes(x, f, dy),
                ),
                "bp input": (
                    median_ms(ours[1], f, dy, repeats=args.repeats),
                    median_ms(peer[1], x, f, dy, repeats=args.repeats),
                    nbytes(f, dy, x),
                ),
                "bp filter": (
                    median_ms(ours[2], x, dy, repeats=args.repeats),
                    median_ms(peer[2], x, f, dy, repeats=args.repeats),
                    nbytes(x, dy, f),
                ),
            }
            torch_ms = (
                torch_times(torch, fmt, x_np, f_np, dy_np, stride, dtype_name, args.repeats)
                if torch is not None
                else None
            )
            for j, (direction, (mine, lax_ms, moved)) in enumerate(timed.items()):
                copy, copy_args = roofline(moved)
                roof = median_ms(copy, *copy_args, repeats=args.repeats)
                case = f"{direction} {name} {dtype_name}"
                peers = {"lax": lax_ms}
                table.add(case, "roofline (copy)", roof, roof)
                table.add(case, "lax", lax_ms, roof)
                if torch_ms is not None:
                    peers["torch"] = torch_ms[j]
                    table.add(case, "torch", torch_ms[j], roof)
                table.add(case, "jaxgrad", mine, roof, **peers)
    finish(table, args)


if __name__ == "__main__":
    main()
