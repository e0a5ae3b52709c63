"""The depthwise ops' float64 reference, from their definition literally (NHWC, loops
over pixels and taps), and the configurations the tests draw: shared by the tests of
every implementation."""

import jax.numpy as jnp
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import jaxgrad

# ----------------------------------------------------------------------------------
# Reference, from their definition literally: NHWC, float64, loops over pixels and taps.
# ----------------------------------------------------------------------------------


def geometry(n, k, s, d, padding, explicit=(0, 0)):
    """(out, before) for one spatial axis, as the definition states it."""
    e = (k - 1) * d + 1
    if padding == "VALID":
        return (n - e + s) // s, 0
    if padding == "SAME":
        out = -(-n // s)
        need = max(0, (out - 1) * s + e - n)
        return out, need // 2
    before, after = explicit
    return (n + before + after - e + s) // s, before


def reads(cfg):
    """Yields (i, j, di, dj, row, col) for every in-bounds read of the forward sum."""
    (_, h, w, _), (fh, fw, _, _) = cfg["x_shape"], cfg["f_shape"]
    (sh, sw), (dh, dw) = cfg["strides"], cfg["dilations"]
    (oh, top), (ow, left) = cfg["geom"]
    for i in range(oh):
        for j in range(ow):
            for di in range(fh):
                for dj in range(fw):
                    r, c = i * sh - top + di * dh, j * sw - left + dj * dw
                    if 0 <= r < h and 0 <= c < w:
                        yield i, j, di, dj, r, c


def out_shape(cfg):
    (n, _, _, c), m = cfg["x_shape"], cfg["f_shape"][3]
    return (n, cfg["geom"][0][0], cfg["geom"][1][0], c * m)


def ref_forward(x, f, cfg):
    n, _, _, c = x.shape
    m = f.shape[3]
    out = np.zeros(out_shape(cfg)).reshape(n, *out_shape(cfg)[1:3], c, m)
    for i, j, di, dj, r, col in reads(cfg):
        out[:, i, j] += x[:, r, col, :, None] * f[di, dj]
    return out.reshape(out_shape(cfg))


def ref_backprop_input(f, dy, cfg):
    _n, _, _, c = cfg["x_shape"]
    dy5 = dy.reshape(*dy.shape[:3], c, -1)
    dx = np.zeros(cfg["x_shape"])
    for i, j, di, dj, r, col in reads(cfg):
        dx[:, r, col] += (dy5[:, i, j] * f[di, dj]).sum(-1)
    return dx


def ref_backprop_filter(x, dy, cfg):
    c = x.shape[3]
    dy5 = dy.reshape(*dy.shape[:3], c, -1)
    df = np.zeros(cfg["f_shape"])
    for i, j, di, dj, r, col in reads(cfg):
        df[di, dj] += (x[:, r, col, :, None] * dy5[:, i, j]).sum(0)
    return df


def to_nchw(a):
    return np.transpose(a, (0, 3, 1, 2))


def from_nchw(a):
    return np.transpose(a, (0, 2, 3, 1))


# ----------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------


def make_cfg(x_shape, f_shape, strides, dilations, padding, explicit_hw=((0, 0), (0, 0))):
    geom = tuple(
        geometry(x_shape[1 + a], f_shape[a], strides[a], dilations[a], padding, explicit_hw[a])
        for a in range(2)
    )
    return dict(
        x_shape=x_shape,
        f_shape=f_shape,
        strides=strides,
        dilations=dilations,
        padding=padding,
        explicit_hw=explicit_hw,
        geom=geom,
    )


def op_kwargs(cfg, data_format, four_ints=False):
    """Arguments for jaxgrad in data_format order; strides/dilations in 2- or 4-int form."""
    kw = dict(data_format=data_format)
    (ht, hb), (wl, wr) = cfg["explicit_hw"]
    if cfg["padding"] == "EXPLICIT":
        kw["explicit_paddings"] = (
            (0, 0, 0, 0, ht, hb, wl, wr) if data_format == "NCHW" else (0, 0, ht, hb, wl, wr, 0, 0)
        )
    s, d = cfg["strides"], cfg["dilations"]
    if four_ints:
        s = (1, 1, *s) if data_format == "NCHW" else (1, *s, 1)
        d = (1, 1, *d) if data_format == "NCHW" else (1, *d, 1)
    kw["dilations"] = d
    return s, cfg["padding"], kw


@st.composite
def configs(draw, kernel=(1, 5), min_taps=1, sides=(1, 12), channels=(1, 4)):
    """Random op configurations; filter sides drawn from ``kernel``, with at least
    ``min_taps`` taps; the input's sides from ``sides`` and its channels from
    ``channels``."""
    n, c, m = draw(st.integers(1, 3)), draw(st.integers(*channels)), draw(st.integers(1, 3))
    h, w = draw(st.integers(*sides)), draw(st.integers(*sides))
    fh, fw = draw(st.integers(*kernel)), draw(st.integers(*kernel))
    assume(fh * fw >= min_taps)
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilations = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = st.tuples(st.integers(0, 4), st.integers(0, 4))
    explicit = (draw(pads), draw(pads)) if padding == "EXPLICIT" else ((0, 0), (0, 0))
    cfg = make_cfg((n, h, w, c), (fh, fw, c, m), strides, dilations, padding, explicit)
    assume(cfg["geom"][0][0] > 0 and cfg["geom"][1][0] > 0)
    return cfg


def random_operands(cfg, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=cfg["x_shape"])
    f = rng.normal(size=cfg["f_shape"])
    dy = rng.normal(size=out_shape(cfg))
    return x, f, dy


def run_all_three(cfg, data_format, x, f, dy, four_ints=False, **extra):
    """The three ops on NHWC float64 operands, laid out as data_format; NHWC results.
    ``extra`` keywords go to every op (``implementation=``)."""
    strides, padding, kw = op_kwargs(cfg, data_format, four_ints)
    kw.update(extra)
    layout = to_nchw if data_format == "NCHW" else (lambda a: a)
    back = from_nchw if data_format == "NCHW" else (lambda a: a)
    y = jaxgrad.depthwise_conv2d(jnp.asarray(layout(x)), jnp.asarray(f), strides, padding, **kw)
    dx = jaxgrad.depthwise_conv2d_backprop_input(
        layout(x).shape, jnp.asarray(f), jnp.asarray(layout(dy)), strides, padding, **kw
    )
    df = jaxgrad.depthwise_conv2d_backprop_filter(
        jnp.asarray(layout(x)), f.shape, jnp.asarray(layout(dy)), strides, padding, **kw
    )
    return back(np.asarray(y)), back(np.asarray(dx)), np.asarray(df)


# Fixed cases that differ most: stride 1 SAME; strided SAME with a multiplier;
# strided, dilated VALID; dilated EXPLICIT.
CASES = [
    # x_shape (NHWC), f_shape, strides, dilations, padding, explicit
    ((2, 9, 8, 3), (3, 3, 3, 1), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0))),
    ((2, 9, 8, 3), (5, 5, 3, 2), (2, 2), (1, 1), "SAME", ((0, 0), (0, 0))),
    ((1, 10, 11, 2), (2, 4, 2, 3), (3, 2), (2, 1), "VALID", ((0, 0), (0, 0))),
    ((1, 7, 6, 2), (3, 2, 2, 2), (1, 2), (2, 2), "EXPLICIT", ((2, 1), (0, 3))),
]
