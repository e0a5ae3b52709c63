"""Training-step throughput: the example U-Net from jaxgrad vs the same model from stock JAX.

    python benchmarks/train.py [--steps 20] [--batch-size 32] [--image-size 64]

The stock model uses lax.conv_general_dilated with feature_group_count,
jax.image.resize and jax.nn.relu in place of jaxgrad's ops. Both run data-parallel on
1 and on 2 CPU devices (the batch sharded with jax.sharding); each device count runs
in its own process, since JAX fixes it at start-up. Reported: median step time and
images per second, after compilation and warm-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial

from _harness import Table, finish, interleaved_ms, parser


def worker(devices: int, batch: int, size: int, repeats: int) -> dict[str, float]:
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    import unet

    mesh = Mesh(np.array(jax.devices()[:devices]), ("batch",))
    rep = NamedSharding(mesh, PartitionSpec())
    by_batch = NamedSharding(mesh, PartitionSpec("batch"))
    params = jax.device_put(unet.init_params(jax.random.key(0)), rep)
    noisy, clean = jax.device_put(unet.make_batch(jax.random.key(1), batch, size), by_batch)
    opt = jax.device_put(unet.adam_init(params), rep)
    calls = {}
    for name, ops in (("jaxgrad", unet.JAXGRAD), ("stock", unet.STOCK)):
        step = jax.jit(lambda p, o, x, y, ops=ops: unet.train_step(p, o, x, y, ops))
        calls[name] = partial(step, params, opt, noisy, clean)
    return interleaved_ms(calls, repeats=repeats)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--worker", type=int, default=None, help=argparse_hidden())
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch_size, args.image_size, args.repeats)))
        return
    table = Table(
        f"U-Net training step, batch {args.batch_size} of {args.image_size}x{args.image_size}",
        [],
        baseline="stock",
    )
    for devices in (1, 2):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                str(devices),
                "--repeats",
                str(args.repeats),
                "--batch-size",
                str(args.batch_size),
                "--image-size",
                str(args.image_size),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        times = json.loads(out.strip().splitlines()[-1])
        case = f"train step, {devices} CPU device{'s' if devices > 1 else ''}"
        table.add_case(case, times["jaxgrad"], times["stock"], {}, baseline_name="stock JAX")
        images = args.batch_size / (times["jaxgrad"] / 1e3)
        print(
            f"  jaxgrad: {images:.0f} images/s; stock: "
            f"{args.batch_size / (times['stock'] / 1e3):.0f} images/s"
        )
    finish(table, args)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
