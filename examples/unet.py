"""A tiny U-Net denoiser built from jaxgrad's ops, and the synthetic data it learns from.

Shared by ``examples/train.py``, ``benchmarks/train.py`` and the sharding tests. The
model's four primitive ops are pluggable (:class:`Ops`), so the same network can be
built from jaxgrad or from the stock JAX ops it replaces, for comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import jaxgrad

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Ops:
    """The model's primitives: depthwise 3x3 SAME conv (NHWC), 2x down/up, activation."""

    depthwise: Callable[[jax.Array, jax.Array], jax.Array]
    down: Callable[[jax.Array], jax.Array]
    up: Callable[[jax.Array], jax.Array]
    relu: Callable[[jax.Array], jax.Array]


JAXGRAD = Ops(
    depthwise=lambda x, f: jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME"),
    down=lambda x: jaxgrad.resample(x, (1, 0.5, 0.5, 1), mode="linear"),
    up=lambda x: jaxgrad.resample(x, (1, 2, 2, 1), mode="linear"),
    relu=jaxgrad.relu,
)


def _lax_depthwise(x: jax.Array, f: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(
        x,
        f.reshape(3, 3, 1, -1),
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=x.shape[-1],
    )


def _image_resize(x: jax.Array, factor: float) -> jax.Array:
    n, h, w, c = x.shape
    return jax.image.resize(x, (n, int(h * factor), int(w * factor), c), "linear")


# The same model from stock JAX: lax's grouped convolution, jax.image.resize (which
# antialiases when shrinking, so "down" is not numerically the same op) and
# jax.nn.relu. Used by benchmarks/train.py.
STOCK = Ops(
    depthwise=_lax_depthwise,
    down=lambda x: _image_resize(x, 0.5),
    up=lambda x: _image_resize(x, 2.0),
    relu=jax.nn.relu,
)

WIDTHS = (16, 32)


def init_params(key: jax.Array, channels: int = 1) -> Params:
    """He-initialised weights for the blocks below."""
    w1, w2 = WIDTHS

    def block(key: jax.Array, c_in: int, c_out: int) -> Params:
        k1, k2 = jax.random.split(key)
        return {
            "depthwise": jax.random.normal(k1, (3, 3, c_in, 1)) / 3.0,
            "pointwise": jax.random.normal(k2, (c_in, c_out)) * jnp.sqrt(2.0 / c_in),
            "bias": jnp.zeros((c_out,)),
        }

    keys = jax.random.split(key, 5)
    return {
        "stem": block(keys[0], channels, w1),
        "down": block(keys[1], w1, w2),
        "bottom": block(keys[2], w2, w2),
        "up": block(keys[3], w2 + w1, w1),
        "head": jax.random.normal(keys[4], (w1, channels)) * jnp.sqrt(1.0 / w1),
    }


def _block(ops: Ops, p: Params, x: jax.Array) -> jax.Array:
    """Depthwise-separable conv: depthwise 3x3, pointwise 1x1, relu."""
    y = ops.depthwise(x, p["depthwise"])
    y = jnp.einsum("nhwc,cd->nhwd", y, p["pointwise"]) + p["bias"]
    return ops.relu(y)


def apply(params: Params, x: jax.Array, ops: Ops = JAXGRAD) -> jax.Array:
    """Denoises a batch of NHWC images (H and W divisible by 2)."""
    skip = _block(ops, params["stem"], x)
    y = _block(ops, params["down"], ops.down(skip))
    y = _block(ops, params["bottom"], y)
    y = _block(ops, params["up"], jnp.concatenate([ops.up(y), skip], axis=-1))
    return x + jnp.einsum("nhwc,cd->nhwd", y, params["head"])  # predicts the residual


def loss_fn(params: Params, noisy: jax.Array, clean: jax.Array, ops: Ops = JAXGRAD) -> jax.Array:
    return jnp.mean((apply(params, noisy, ops) - clean) ** 2)


def make_batch(
    key: jax.Array, batch: int, size: int, noise: float = 0.3
) -> tuple[jax.Array, jax.Array]:
    """Random discs and boxes of random intensity, and the same under Gaussian noise."""
    k_shape, k_noise = jax.random.split(key)
    coords = (jnp.arange(size) + 0.5) / size
    yy, xx = coords[:, None], coords[None, :]

    def image(key: jax.Array) -> jax.Array:
        ks = jax.random.split(key, 4)
        centres = jax.random.uniform(ks[0], (4, 2), minval=0.15, maxval=0.85)
        radii = jax.random.uniform(ks[1], (4,), minval=0.06, maxval=0.22)
        values = jax.random.uniform(ks[2], (4,), minval=0.3, maxval=1.0)
        is_box = jax.random.bernoulli(ks[3], 0.5, (4,))
        dy, dx = yy[None] - centres[:, 0, None, None], xx[None] - centres[:, 1, None, None]
        disc = dy**2 + dx**2 < radii[:, None, None] ** 2
        box = jnp.maximum(jnp.abs(dy), jnp.abs(dx)) < radii[:, None, None]
        shapes = jnp.where(is_box[:, None, None], box, disc)
        return jnp.max(shapes * values[:, None, None], axis=0)

    clean = jax.vmap(image)(jax.random.split(k_shape, batch))[..., None]
    noisy = clean + noise * jax.random.normal(k_noise, clean.shape)
    return noisy, clean


def adam_init(params: Params) -> Params:
    def zeros() -> Params:  # a fresh tree each: the train step donates both
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    return {"m": zeros(), "v": zeros(), "t": jnp.zeros((), jnp.int32)}


def adam_update(
    grads: Params, state: Params, params: Params, lr: float = 3e-3
) -> tuple[Params, Params]:
    """Adam (b1 = 0.9, b2 = 0.999), written out so that the example needs no optimizer library."""
    t = state["t"] + 1
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, state["m"], grads)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, state["v"], grads)
    scale = lr * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
    params = jax.tree_util.tree_map(
        lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), params, m, v
    )
    return params, {"m": m, "v": v, "t": t}


def train_step(
    params: Params, opt: Params, noisy: jax.Array, clean: jax.Array, ops: Ops = JAXGRAD
) -> tuple[Params, Params, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, noisy, clean, ops)
    params, opt = adam_update(grads, opt, params)
    return params, opt, loss
