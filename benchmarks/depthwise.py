"""Depthwise conv2d and its two backprops against the roofline, lax and PyTorch.

    python benchmarks/depthwise.py [--dtypes float32 bfloat16] [--repeats 9]

Cases: [8, 64, 64, 64] 3x3 stride 1 SAME in NHWC and NCHW, 5x5 stride 2 with
depth multiplier 2 (NHWC), and 5x5 stride 1 (NHWC). Peers: lax.conv_general_dilated with
feature_group_count (and its VJP for each backprop alone), and PyTorch CPU
(F.conv2d with groups; aten.convolution_backward for each backprop alone) when
installed. The roofline reads and writes as many bytes as the op must (see
_harness.roofline).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from _harness import Table, finish, interleaved_ms, nbytes, parser, roofline, torch_or_none
from jax import lax

import jaxgrad

CASES = [
    # name, data_format, (N, H, W, C), (fh, fw, M), stride
    ("3x3 s1 NHWC", "NHWC", (8, 64, 64, 64), (3, 3, 1), 1),
    ("3x3 s1 NCHW", "NCHW", (8, 64, 64, 64), (3, 3, 1), 1),
    ("5x5 s2 M2 NHWC", "NHWC", (8, 64, 64, 64), (5, 5, 2), 2),
    ("5x5 s1 NHWC", "NHWC", (8, 64, 64, 64), (5, 5, 1), 1),
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


def torch_calls(torch, fmt, x_np, f_np, dy_np, stride, dtype_name):
    """Forward, backprop input and backprop filter as zero-argument calls (NCHW
    tensors, channels_last memory for NHWC)."""
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
    args = (dy, x, w, None, [stride] * 2, list(pad), [1, 1], False, [0, 0], c)

    def no_grad(fn, *a):
        def call():
            with torch.no_grad():
                return fn(*a)

        return call

    return {
        "fwd": no_grad(F.conv2d, x, w, None, stride, pad, 1, c),
        "bp input": no_grad(aten.convolution_backward, *args, [True, False, False]),
        "bp filter": no_grad(aten.convolution_backward, *args, [False, True, False]),
    }


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
            directions = {
                # name: (jaxgrad call, lax call, (bytes the op must read, write))
                "fwd": (partial(ours[0], x, f), partial(peer[0], x, f), (nbytes(x, f), nbytes(dy))),
                "bp input": (
                    partial(ours[1], f, dy),
                    partial(peer[1], x, f, dy),
                    (nbytes(f, dy), nbytes(x)),
                ),
                "bp filter": (
                    partial(ours[2], x, dy),
                    partial(peer[2], x, f, dy),
                    (nbytes(x, dy), nbytes(f)),
                ),
            }
            torch_ops = (
                torch_calls(torch, fmt, x_np, f_np, dy_np, stride, dtype_name)
                if torch is not None
                else {}
            )
            for direction, (mine, lax_call, moved) in directions.items():
                floor, floor_args = roofline(*moved)
                calls = {"roofline": partial(floor, *floor_args), "lax": lax_call, "jaxgrad": mine}
                if direction in torch_ops:
                    calls["torch"] = torch_ops[direction]
                ms = interleaved_ms(calls, repeats=args.repeats)
                roof = ms["roofline"]
                case = f"{direction} {name} {dtype_name}"
                peers = {p: ms[p] for p in PEERS if p in ms}
                table.add_case(case, ms["jaxgrad"], roof, peers)
    finish(table, args)


if __name__ == "__main__":
    main()
