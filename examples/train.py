"""Train a tiny U-Net denoiser built from jaxgrad's ops, data-parallel over devices.

    python examples/train.py                      # all local devices
    python examples/train.py --cpu-devices 8      # 8 virtual CPU devices
    python examples/train.py --steps 50 --out /tmp/run

Every op of jaxgrad is on the training path: depthwise_conv2d (and its two backprops
in the backward pass), relu (relu_grad), resample 0.5x and 2x linear (resample_grad).
The batch is sharded over a 1-D device mesh with jax.sharding; the parameters are
replicated, and XLA inserts the one all-reduce of the gradients. Data are generated
on the fly (noisy discs and boxes), deterministically from --seed.

Writes ``loss.png`` (the loss curve) and ``samples.png`` (inputs, targets and
predictions) to --out, and exits with status 1 unless the loss fell by at least half.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=32, help="global batch, split over devices")
    p.add_argument("--image-size", type=int, default=64, help="height and width (even)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out", help="folder for loss.png and samples.png")
    p.add_argument("--devices", type=int, default=None, help="devices to use (default: all)")
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="create this many virtual CPU devices (set before JAX starts)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax

    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import unet

    devices = jax.devices()[: args.devices] if args.devices else jax.devices()
    if args.batch_size % len(devices):
        print(f"--batch-size {args.batch_size} must be divisible by {len(devices)} devices")
        return 2
    mesh = Mesh(np.array(devices), ("batch",))
    replicated = NamedSharding(mesh, PartitionSpec())
    by_batch = NamedSharding(mesh, PartitionSpec("batch"))

    key = jax.random.key(args.seed)
    params = jax.device_put(unet.init_params(jax.random.fold_in(key, 0)), replicated)
    opt = jax.device_put(unet.adam_init(params), replicated)
    batch = jax.jit(
        lambda step: unet.make_batch(
            jax.random.fold_in(jax.random.fold_in(key, 1), step), args.batch_size, args.image_size
        ),
        out_shardings=(by_batch, by_batch),
    )
    step_fn = jax.jit(
        unet.train_step,
        in_shardings=(replicated, replicated, by_batch, by_batch),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0, 1),
    )

    print(
        f"jaxgrad U-Net denoiser: {args.steps} steps, batch {args.batch_size} of "
        f"{args.image_size}x{args.image_size}, {len(devices)} x {devices[0].device_kind}"
    )
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        # On a terminal the bar redraws in place; in a log (stderr not a terminal)
        # each redraw is a line, so it redraws every 10 s instead of 10 times a second.
        interactive = sys.stderr.isatty()
        bar = tqdm(
            total=args.steps,
            unit="step",
            dynamic_ncols=interactive,
            mininterval=0.1 if interactive else 10.0,
        )
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        noisy, clean = batch(step)
        params, opt, loss = step_fn(params, opt, noisy, clean)
        losses.append(float(loss))
        if bar is not None:
            bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
            bar.update(1)  # one redraw per step at most, with the new loss
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - start

    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    print(f"loss {first:.4f} -> {last:.4f} in {elapsed:.1f} s ({args.steps / elapsed:.1f} steps/s)")
    noisy, clean = batch(10**6)  # a batch never trained on
    pred = jax.jit(unet.apply)(params, noisy)
    # What predicting the noisy input itself would score: the line to get below.
    baseline = float(np.mean((np.asarray(noisy) - np.asarray(clean)) ** 2))
    write_pngs(args.out, losses, baseline, np.asarray(noisy), np.asarray(clean), np.asarray(pred))
    if not last <= first / 2:
        print(f"FAILED: the loss did not fall by half ({first:.4f} -> {last:.4f})")
        return 1
    return 0


def write_pngs(out: str, losses: list[float], baseline: float, noisy, clean, pred) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.semilogy(losses, lw=1, label="training loss")
    ax.axhline(baseline, color="gray", ls="--", lw=1, label="noise: the input as prediction")
    ax.legend(loc="upper right")
    ax.set_xlabel("step")
    ax.set_ylabel("MSE")
    ax.set_title("jaxgrad U-Net denoiser: training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=100)
    plt.close(fig)

    n = min(6, noisy.shape[0])
    fig, axes = plt.subplots(3, n, figsize=(1.6 * n, 5.4))
    # The noisy inputs leave [0, 1]: shown over their own range, not clipped to it.
    low, high = float(noisy[:n].min()), float(noisy[:n].max())
    rows = (
        (f"noisy input\n[{low:.1f}, {high:.1f}]", noisy, (low, high)),
        ("target\n[0, 1]", clean, (0, 1)),
        ("prediction\n[0, 1]", pred, (0, 1)),
    )
    for i in range(n):
        for row, (name, images, (vmin, vmax)) in enumerate(rows):
            axes[row, i].imshow(images[i, :, :, 0], cmap="gray", vmin=vmin, vmax=vmax)
            axes[row, i].set_xticks([])
            axes[row, i].set_yticks([])
            if i == 0:
                axes[row, i].set_ylabel(name)
    fig.suptitle("jaxgrad U-Net denoiser on images it never trained on")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "samples.png"), dpi=100)
    plt.close(fig)
    print(f"wrote {os.path.join(out, 'loss.png')} and {os.path.join(out, 'samples.png')}")


if __name__ == "__main__":
    sys.exit(main())
