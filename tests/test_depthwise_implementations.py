"""The depthwise ops' implementations: choosing one (``implementation=``), the Pallas
kernels against the float64 reference (in Pallas' interpret mode on the CPU), and the
kernels' lowering for CUDA GPUs, checked here without one."""

import dataclasses
import functools
import math
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from depthwise_reference import (
    CASES,
    configs,
    from_nchw,
    make_cfg,
    op_kwargs,
    out_shape,
    random_operands,
    ref_backprop_filter,
    ref_backprop_input,
    ref_forward,
    run_all_three,
    to_nchw,
)
from helpers import (
    H100_CAPABILITY,
    TOLERANCE,
    TRANSFORMS,
    TRITON_CALL,
    bounds_checked_kernels,
    examples,
    kernel_launches,
    kernel_primitives,
    launched_kernels,
    lowered_text,
    needs_kernels,
    transformed,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src import deprecations
from jax.test_util import check_grads

import jaxgrad
from jaxgrad import _implementation, _kernels
from jaxgrad._depthwise import _convolution, _pallas, _plan, _xla


def three_ops(cfg, data_format, **extra):
    """The three ops as functions of their arrays, with ``extra`` keywords."""
    strides, padding, kw = op_kwargs(cfg, data_format)
    kw.update(extra)
    x_shape = cfg["x_shape"]
    if data_format == "NCHW":
        x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    return {
        "forward": lambda x, f: jaxgrad.depthwise_conv2d(x, f, strides, padding, **kw),
        "backprop_input": lambda f, dy: jaxgrad.depthwise_conv2d_backprop_input(
            x_shape, f, dy, strides, padding, **kw
        ),
        "backprop_filter": lambda x, dy: jaxgrad.depthwise_conv2d_backprop_filter(
            x, cfg["f_shape"], dy, strides, padding, **kw
        ),
    }


def operands(cfg, data_format, dtype, seed=0):
    """(x, f, dy) as arrays of ``dtype`` in ``data_format``, and their float64 values
    in NHWC (the rounded operands, so that only the computation's error remains)."""
    x, f, dy = random_operands(cfg, seed)
    layout = to_nchw if data_format == "NCHW" else (lambda a: a)
    back = from_nchw if data_format == "NCHW" else (lambda a: a)
    arrays = jnp.asarray(layout(x), dtype), jnp.asarray(f, dtype), jnp.asarray(layout(dy), dtype)
    x64, f64, dy64 = (np.asarray(a, np.float64) for a in arrays)
    return arrays, (back(x64), f64, back(dy64))


def references(cfg, x, f, dy):
    return {
        "forward": ref_forward(x, f, cfg),
        "backprop_input": ref_backprop_input(f, dy, cfg),
        "backprop_filter": ref_backprop_filter(x, dy, cfg),
    }


def run_ops(ops, data_format, x, f, dy, transform="jit"):
    """Each op's result, NHWC, as float64."""
    back = from_nchw if data_format == "NCHW" else (lambda a: a)
    args = {"forward": (x, f), "backprop_input": (f, dy), "backprop_filter": (x, dy)}
    out = {}
    for name, fn in ops.items():
        result = transformed(fn, transform)(*args[name])
        out[name] = np.asarray(result, np.float64)
        if name != "backprop_filter":
            out[name] = back(out[name])
    return out


def relative_error(got, want):
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300)


# ----------------------------------------------------------------------------------
# The kernels against the reference
# ----------------------------------------------------------------------------------


# Interpreted kernels compile slowly: fewer examples than the default implementation's.
@needs_kernels
@settings(max_examples=examples(10))
@given(configs(), st.sampled_from(["NHWC", "NCHW"]), st.integers(0, 2**31 - 1))
def test_kernels_match_reference(cfg, data_format, seed):
    x, f, dy = random_operands(cfg, seed)
    y, dx, df = run_all_three(cfg, data_format, x, f, dy, implementation="pallas")
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(df, ref_backprop_filter(x, dy, cfg), rtol=1e-10, atol=1e-10)


def kernel_grid(cases):
    """(case, layout, dtype) for ``cases`` cases: every case in both layouts, the
    dtypes by turns, so that each dtype meets both layouts (the kernels differ
    between the dtypes only in the type they load and store; tests/test_depthwise.py
    runs the full grid of dtypes, layouts and cases through the default
    implementation)."""
    dtypes = (jnp.float32, jnp.bfloat16, jnp.float16)
    for case in range(cases):
        for i, data_format in enumerate(("NHWC", "NCHW")):
            dtype = dtypes[(case + 2 * i) % len(dtypes)]
            yield pytest.param(
                case, data_format, dtype, id=f"{case}-{data_format}-{dtype.__name__}"
            )


@needs_kernels
@pytest.mark.parametrize("case, data_format, dtype", list(kernel_grid(len(CASES))))
def test_kernels_accumulate_in_float32(case, data_format, dtype):
    # float32: within 1e-6 relative of float64. Half types: the float32 sums of the
    # kernels are rounded once, so their error is that of the portable implementation,
    # which does the same, up to how the last bit rounds.
    cfg = make_cfg(*CASES[case])
    (x, f, dy), exact = operands(cfg, data_format, dtype, seed=case)
    want = references(cfg, *exact)
    kernels = run_ops(three_ops(cfg, data_format, implementation="pallas"), data_format, x, f, dy)
    if dtype == jnp.float32:
        for name in want:
            error = relative_error(kernels[name], want[name])
            assert error < 1e-6, (name, error)
        return
    portable = run_ops(three_ops(cfg, data_format, implementation="xla"), data_format, x, f, dy)
    for name in want:
        error = relative_error(kernels[name], want[name])
        assert error <= 1.25 * relative_error(portable[name], want[name]) + 1e-6, name


@needs_kernels
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_kernels_under_transforms(transform):
    cfg = make_cfg(*CASES[1])
    (x, f, dy), exact = operands(cfg, "NHWC", jnp.float32)
    got = run_ops(three_ops(cfg, "NHWC", implementation="pallas"), "NHWC", x, f, dy, transform)
    for name, want in references(cfg, *exact).items():
        np.testing.assert_allclose(got[name], want, rtol=TOLERANCE[np.dtype("float32")], atol=1e-4)


@needs_kernels
def test_kernels_check_grads():
    # The VJPs of the kernel path are the kernel path's ops, on a small strided case
    # with a multiplier (interpreted kernels compile slowly). The forward's second
    # order differentiates both gradient ops, and so checks all three VJP rules;
    # each gradient op is checked on its own to first order.
    cfg = make_cfg((1, 5, 4, 2), (3, 2, 2, 2), (2, 1), (1, 1), "SAME")
    (x, f, dy), _ = operands(cfg, "NHWC", jnp.float64)
    ops = three_ops(cfg, "NHWC", implementation="pallas")
    args = {"forward": (x, f), "backprop_input": (f, dy), "backprop_filter": (x, dy)}
    order = {"forward": 2, "backprop_input": 1, "backprop_filter": 1}
    for name, fn in ops.items():
        check_grads(jax.jit(fn), args[name], order=order[name], modes=["rev"])


@needs_kernels
def test_kernel_vjps_are_the_kernel_ops():
    cfg = make_cfg(*CASES[2])
    (x, f, dy), _ = operands(cfg, "NCHW", jnp.float64)
    ops = three_ops(cfg, "NCHW", implementation="pallas")
    gx, gf = jax.vjp(ops["forward"], x, f)[1](dy)
    np.testing.assert_array_equal(gx, ops["backprop_input"](f, dy))
    np.testing.assert_array_equal(gf, ops["backprop_filter"](x, dy))


@needs_kernels
@pytest.mark.parametrize(("data_format", "m"), [("NHWC", 1), ("NCHW", 2)])
def test_kernels_read_padding_as_zero_next_to_inf_and_nan(data_format, m):
    # Masked lanes load their clamped neighbours' addresses on no device and read 0:
    # an inf or NaN at the edge must not reach an output whose window is padding.
    cfg = make_cfg((2, 5, 6, 3), (3, 3, 3, m), (1, 2), (1, 1), "EXPLICIT", ((2, 1), (1, 2)))
    x, f, dy = random_operands(cfg, 4)
    x[0, 0, 0, 0], x[1, -1, -1, 2], x[0, 0, -1, 1] = np.inf, np.nan, -np.inf
    dy[0, 0, 0, 0], dy[1, -1, -1, -1] = np.inf, np.nan
    y, dx, _ = run_all_three(cfg, data_format, x, f, dy, implementation="pallas")
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)


def zero_padded_sums(cfg, x, f, dy):
    """The forward and the filter gradient over the input padded with zeros that
    take part in the products, and, at stride 1, the input gradient over the
    output gradient padded so: float64, NHWC, IEEE arithmetic (0 * inf is NaN)."""
    (n, h, w, c), (fh, fw, _, m) = cfg["x_shape"], cfg["f_shape"]
    (oh, top), (ow, left) = cfg["geom"]
    (sh, sw), (dh, dw) = cfg["strides"], cfg["dilations"]
    # Enough zeros after the input for every window, however far it reaches.
    below = max(0, (oh - 1) * sh + (fh - 1) * dh + 1 - h - top)
    right = max(0, (ow - 1) * sw + (fw - 1) * dw + 1 - w - left)
    xp = np.pad(x, ((0, 0), (top, below), (left, right), (0, 0)))
    dy5 = dy.reshape(n, oh, ow, c, m)
    y, df = np.zeros((n, oh, ow, c, m)), np.zeros((fh, fw, c, m))
    for di in range(fh):
        for dj in range(fw):
            rows = slice(di * dh, di * dh + (oh - 1) * sh + 1, sh)
            cols = slice(dj * dw, dj * dw + (ow - 1) * sw + 1, sw)
            window = xp[:, rows, cols, :, None]
            y += window * f[di, dj]
            df[di, dj] = (window * dy5).sum(axis=(0, 1, 2))
    sums = {"forward": y.reshape(n, oh, ow, c * m), "backprop_filter": df}
    if (sh, sw) == (1, 1):
        # Input pixel (r, q) meets output (r + top - di * dh, q + left - dj * dw).
        up, before = (fh - 1) * dh, (fw - 1) * dw
        dyp = np.pad(dy5, ((0, 0), (up, h + top - oh), (before, w + left - ow), (0, 0), (0, 0)))
        dx = np.zeros((n, h, w, c))
        for di in range(fh):
            for dj in range(fw):
                r0, q0 = up + top - di * dh, before + left - dj * dw
                dx += (dyp[:, r0 : r0 + h, q0 : q0 + w] * f[di, dj]).sum(-1)
        sums["backprop_input"] = dx
    return sums


@needs_kernels
@pytest.mark.parametrize("case", [0, 1, 3])
def test_infinities_meet_the_padding_as_zeros_in_both_implementations(case):
    # Padding is zeros that take part in the products, in every implementation: an
    # infinite filter tap makes NaN in the outputs whose windows reach it, an
    # infinite output gradient in the filter gradient's taps that pair it with
    # padding, and, at stride 1, an infinite tap in the input gradient at the
    # edges, where the output gradient is read past its border as zeros. Where the
    # input gradient at larger strides meets such zeros is the implementation's
    # (the portable one multiplies those between strided outputs too): not compared.
    cfg = make_cfg(*CASES[case])
    x, f, dy = random_operands(cfg, 5)
    f[0, 0, 0, 0], f[-1, -1, -1, -1] = np.inf, -np.inf
    dy[0, 0, 0, 0], dy[-1, -1, -1, -1] = np.inf, np.nan
    with np.errstate(invalid="ignore"):
        wants = zero_padded_sums(cfg, x, f, dy)
        without_padding = references(cfg, x, f, dy)
    for name, want in wants.items():  # the padding's zeros make NaNs of their own
        assert (np.isnan(want) & ~np.isnan(without_padding[name])).any(), name
    names = ("forward", "backprop_input", "backprop_filter")
    for implementation in ("xla", "pallas"):
        results = run_all_three(cfg, "NHWC", x, f, dy, implementation=implementation)
        got = dict(zip(names, results, strict=True))
        for name, want in wants.items():
            message = f"{implementation} {name}"
            finite = np.isfinite(want)
            np.testing.assert_array_equal(got[name][~finite], want[~finite], err_msg=message)
            np.testing.assert_allclose(
                got[name][finite], want[finite], rtol=1e-10, atol=1e-10, err_msg=message
            )


@needs_kernels
def test_kernels_with_an_empty_input():
    cfg = make_cfg((2, 0, 4, 3), (2, 1, 3, 2), (1, 1), (1, 1), "EXPLICIT", ((2, 1), (0, 0)))
    x, f, dy = random_operands(cfg, 5)
    y, dx, df = run_all_three(cfg, "NHWC", x, f, dy, implementation="pallas")
    assert y.shape == (2, 2, 4, 6) and not y.any()
    assert dx.shape == (2, 0, 4, 3)
    np.testing.assert_array_equal(df, np.zeros(cfg["f_shape"]))


# 7x7 taps: more than one filter-gradient program sums at once.
LARGE = ((1, 9, 10, 2), (7, 7, 2, 1), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)))


@needs_kernels
@pytest.mark.parametrize(
    "cfg_args",
    [
        LARGE,  # groups of 2, 2, 2 and 1 filter rows
        ((1, 11, 9, 3), (6, 6, 3, 1), (1, 1), (1, 2), "SAME", ((0, 0), (0, 0))),  # 2, 2 and 2
    ],
)
def test_a_filter_larger_than_one_program_holds(cfg_args):
    # The filter gradient splits the taps into groups of whole filter rows, each
    # group its own program.
    cfg = make_cfg(*cfg_args)
    strides, padding, kw = op_kwargs(cfg, "NHWC")
    conv = _plan.configure(
        "test", cfg["x_shape"], cfg["f_shape"], strides, padding, "NHWC", kw["dilations"], ()
    )
    assert len(_pallas._tap_groups(conv, _pallas._launch(conv, True, "filter"))) > 1
    x, f, dy = random_operands(cfg, 6)
    y, dx, df = run_all_three(cfg, "NHWC", x, f, dy, implementation="pallas")
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(df, ref_backprop_filter(x, dy, cfg), rtol=1e-10, atol=1e-10)


@needs_kernels
@pytest.mark.parametrize(
    ("kernel", "taps_in_code"),
    [
        ((7, 7), 14 + 7),  # groups of 2, 2, 2 and 1 filter rows: one body of 2, one of 1
        ((6, 6), 12),  # 2, 2 and 2: one body
        ((5, 5), 15 + 10),  # 3 and 2
        ((3, 3), 9),  # one group
    ],
)
def test_groups_of_whole_filter_rows_share_their_code(kernel, taps_in_code):
    # Triton's compile time grows faster than the code it compiles: the filter
    # gradient's groups of full filter rows (at most 16 taps here) are one body of
    # code, which stores the partials of its taps once.
    cfg = make_cfg((1, 12, 12, 2), (*kernel, 2, 1), (1, 1), (1, 1), "SAME")
    (x, _, dy), _ = operands(cfg, "NHWC", jnp.float32)
    backprop_filter = three_ops(cfg, "NHWC", implementation="pallas")["backprop_filter"]
    with launches_with(taps=16):
        kernels = kernel_primitives(backprop_filter, x, dy)
    partials, total = kernels[0], kernels[-1]  # the partials, then their sum
    assert partials["masked_swap"] == taps_in_code
    assert total["masked_swap"] == 1


@needs_kernels
@pytest.mark.parametrize(
    ("strides", "dilations", "padding", "m"),
    [
        ((1, 1), (1, 1), "SAME", 1),
        ((2, 1), (1, 2), "VALID", 2),  # the multiplier repeated in registers
        ((1, 2), (2, 1), "SAME", 3),  # 25 taps for 3 lane sets: 75, looped over
    ],
)
def test_a_wide_filter_in_nhwc(strides, dilations, padding, m):
    # A 5x5 filter in NHWC: the forward and the input gradient take the wide
    # filter's cut, which holds up to 32 taps in registers and keeps shared rows.
    cfg = make_cfg((2, 13, 9, 3), (5, 5, 3, m), strides, dilations, padding)
    s, p, kw = op_kwargs(cfg, "NHWC")
    conv = _plan.configure(
        "test", cfg["x_shape"], cfg["f_shape"], s, p, "NHWC", kw["dilations"], ()
    )
    for kernel in ("forward", "input"):
        launch = _pallas._launch(conv, True, kernel)
        assert (launch.taps, launch.reuse_rows) == (32, True), kernel
    x, f, dy = random_operands(cfg, 7)
    y, dx, df = run_all_three(cfg, "NHWC", x, f, dy, implementation="pallas")
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(df, ref_backprop_filter(x, dy, cfg), rtol=1e-10, atol=1e-10)


@needs_kernels
@pytest.mark.parametrize(
    ("x_shape", "f_shape", "strides", "dilations", "padding", "data_format", "phase_taps"),
    [
        # Tap column 0 reaches phase 0, column 1 phase 1, none phase 2: its
        # columns' gradient is zero.
        ((1, 4, 11, 2), (1, 2, 2, 1), (1, 3), (1, 1), "VALID", "NHWC", [[0], [1], []]),
        # Padding wider than the stride: taps read output columns left of the
        # tile's, masked at the edge.
        ((2, 7, 9, 3), (3, 3, 3, 2), (2, 2), (1, 3), ((1, 2), (3, 0)), "NCHW", [[1], [0, 2]]),
        # Every tap reaches one phase of two.
        ((1, 5, 10, 4), (2, 3, 4, 1), (1, 2), (1, 2), "SAME", "NHWC", [[], [0, 1, 2]]),
        # A 5x5 filter in NCHW loops over its filter rows.
        ((1, 9, 12, 2), (5, 5, 2, 1), (2, 2), (1, 1), "SAME", "NCHW", [[1, 3], [0, 2, 4]]),
    ],
)
def test_the_input_gradient_sums_each_column_phase_over_the_taps_that_reach_it(
    x_shape, f_shape, strides, dilations, padding, data_format, phase_taps
):
    # At a stride sw the input gradient's columns c * sw + phase are reached by
    # the same tap columns each, so a tile of one phase reads only those, at
    # output columns that follow each other.
    if isinstance(padding, tuple):
        cfg = make_cfg(x_shape, f_shape, strides, dilations, "EXPLICIT", padding)
    else:
        cfg = make_cfg(x_shape, f_shape, strides, dilations, padding)
    s, p, kw = op_kwargs(cfg, data_format)
    n, h, w, c = x_shape
    shape = (n, c, h, w) if data_format == "NCHW" else x_shape
    explicit = kw.get("explicit_paddings", ())
    conv = _plan.configure("test", shape, f_shape, s, p, data_format, kw["dilations"], explicit)
    assert [_pallas._phase_taps(conv, a) for a in range(strides[1])] == phase_taps
    (x, f, dy), (_, f64, dy64) = operands(cfg, data_format, jnp.float64, seed=3)
    backprop_input = three_ops(cfg, data_format, implementation="pallas")["backprop_input"]
    dx = run_ops({"backprop_input": backprop_input}, data_format, x, f, dy)["backprop_input"]
    np.testing.assert_allclose(dx, ref_backprop_input(f64, dy64, cfg), rtol=1e-10, atol=1e-10)


@needs_kernels
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_programs_of_many_rows(case, data_format, monkeypatch):
    # On a GPU a program owns several rows where the grid has programs enough (on
    # these small arrays, one row): here every kernel takes its most rows, so the
    # row loops run, and the last block of rows is cut short by the image.
    monkeypatch.setattr(_pallas, "_MIN_WARPS", 0)
    jax.clear_caches()  # no kernel traced with one row a program is reused
    cfg = make_cfg(*CASES[case])
    (x, f, dy), exact = operands(cfg, data_format, jnp.float64, seed=case)
    strides, padding, kw = op_kwargs(cfg, data_format)
    conv = _plan.configure(
        "test",
        x.shape,
        f.shape,
        strides,
        padding,
        data_format,
        kw["dilations"],
        kw.get("explicit_paddings", ()),
    )
    assert all(_pallas._launch(conv, True, k).rows > 1 for k in ("forward", "input", "filter"))
    want = references(cfg, *exact)
    got = run_ops(three_ops(cfg, data_format, implementation="pallas"), data_format, x, f, dy)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-10, err_msg=name)


def under_both_launches(monkeypatch, field, ops, data_format, x, f, dy):
    """Each op's result (``run_ops``) under the kernels' launches with ``field``
    set False, then True, keyed by that value; and every launch given."""
    chosen, given = _pallas._launch, []

    def launch(*args, value):
        given.append(dataclasses.replace(chosen(*args), **{field: value}))
        return given[-1]

    got = {}
    for value in (False, True):
        jax.clear_caches()  # no kernel traced under the other launch is reused
        monkeypatch.setattr(_pallas, "_launch", functools.partial(launch, value=value))
        got[value] = run_ops(ops, data_format, x, f, dy)
    return got, given


def check_a_row_option(monkeypatch, field, kernel, strides, dilations, padding, data_format):
    """Runs the three ops under the launches with the row option ``field`` off and
    on, programs owning many rows: the forward and the input gradient give the
    same bits both ways, and every result of both equals float64's. An infinite
    input in the last row reaches exactly the results whose sums read it: none
    where no output reads that row, and an infinity, not a NaN, where the last
    output row does (the rows past it, in the last block of rows, must not meet it
    again with a zero)."""
    monkeypatch.setattr(_pallas, "_MIN_WARPS", 0)  # many rows a program
    cfg = make_cfg((2, 14, 6, 3), (*kernel, 3, 2), strides, dilations, padding)
    (x, f, dy), (x64, f64, dy64) = operands(cfg, data_format, jnp.float32, seed=sum(strides))
    x64[0, 13, 2, 1] = np.inf
    x = x.at[(0, 13, 2, 1) if data_format == "NHWC" else (0, 1, 13, 2)].set(jnp.inf)
    ops = three_ops(cfg, data_format, implementation="pallas")
    got, given = under_both_launches(monkeypatch, field, ops, data_format, x, f, dy)
    assert {getattr(launch, field) for launch in given} == {False, True}
    assert all(launch.rows > 1 for launch in given)
    for name in ("forward", "backprop_input"):
        np.testing.assert_array_equal(got[True][name], got[False][name], err_msg=name)
    for name, want in references(cfg, x64, f64, dy64).items():
        finite = np.isfinite(want)
        for value, results in got.items():  # the filter gradient's two orders too
            message = f"{name}, {field}: {value}"
            np.testing.assert_array_equal(results[name][~finite], want[~finite], err_msg=message)
            assert relative_error(results[name][finite], want[finite]) < 1e-6, message


@needs_kernels
@pytest.mark.parametrize(
    # The layouts by turns: the rows kept are the same in both.
    ("kernel", "strides", "dilations", "padding", "data_format"),
    [
        ((3, 2), (1, 1), (1, 1), "SAME", "NHWC"),  # the next row shares two filter rows' windows
        ((3, 2), (1, 1), (1, 1), "SAME", "NCHW"),
        ((3, 2), (2, 1), (1, 1), "VALID", "NHWC"),  # one
        ((3, 2), (2, 2), (2, 1), "SAME", "NCHW"),  # one, two input rows apart
        ((3, 2), (1, 2), (2, 1), "VALID", "NHWC"),  # none: dilated rows at stride 1
        ((3, 2), (3, 1), (1, 1), "VALID", "NCHW"),  # none: the stride passes the filter
        # More taps than the usual cut holds: the filter gradient's groups of filter
        # rows share rows within a group; in NHWC the forward and the input gradient
        # take the wide filter's cut, which holds all 20 taps and keeps rows, in NCHW
        # they loop over the filter rows and keep none.
        ((5, 4), (1, 1), (1, 1), "SAME", "NHWC"),
        ((5, 4), (1, 1), (1, 1), "SAME", "NCHW"),
    ],
)
def test_rows_kept_in_registers_change_no_bits(
    kernel, strides, dilations, padding, data_format, monkeypatch
):
    # A launch may keep the input rows that consecutive rows share in registers
    # rather than read them again. The forward and the input gradient sum the same
    # products in the same order, so they give the same bits either way; the filter
    # gradient's partials then sum a program's column tiles one after another, each
    # down all of its rows: another fixed order.
    check_a_row_option(monkeypatch, "reuse_rows", kernel, strides, dilations, padding, data_format)


@needs_kernels
@pytest.mark.parametrize(
    ("kernel", "strides", "dilations", "padding", "data_format"),
    [
        # Rows read where they are used (the NHWC forward and input gradient) and
        # rows kept (the filter gradient; the NCHW forward).
        ((3, 3), (1, 1), (1, 1), "SAME", "NHWC"),
        ((3, 3), (1, 1), (1, 1), "SAME", "NCHW"),
        # Strided: the input gradient's phases and its branch over rows; the NCHW
        # forward and filter gradient read column pairs.
        ((3, 2), (2, 2), (2, 1), "SAME", "NCHW"),
        # More taps than the usual cut holds: the filter gradient's groups of rows.
        ((5, 4), (1, 1), (1, 1), "VALID", "NHWC"),
    ],
)
def test_rows_read_ahead_change_no_bits(
    kernel, strides, dilations, padding, data_format, monkeypatch
):
    # A launch may read a program's next row before it computes the current one
    # (the last row reads itself again, unused). The same products are summed in
    # the same order: the forward and the input gradient give the same bits either
    # way. So does the filter gradient in interpret mode; on a GPU its sum across a
    # tile's columns follows the registers' layout, so it is checked against
    # float64 under both launches.
    check_a_row_option(monkeypatch, "read_ahead", kernel, strides, dilations, padding, data_format)


@needs_kernels
@pytest.mark.parametrize(
    ("kernel", "dilations", "padding", "m"),
    [
        ((3, 3), (1, 1), "SAME", 1),  # taps at columns 2c - 1, 2c, 2c + 1: both halves
        ((2, 3), (1, 2), "VALID", 2),  # 2c, 2c + 2, 2c + 4: even halves; channels repeated
        ((3, 2), (2, 3), "SAME", 3),  # 2c - 1, 2c + 2: an odd offset before the tile
    ],
)
def test_strided_columns_read_in_pairs(kernel, dilations, padding, m, monkeypatch):
    # In NCHW at column stride 2 a launch may read a window's columns as one run of
    # column pairs and keep one column of each pair, rather than every other column
    # alone. The forward then sums the same products in the same order: the same
    # bits. So does the filter gradient's sum down a tile's rows, but its sum across
    # the tile's columns follows the registers' layout on a GPU, which the pairs
    # change: there each reading has bits of its own, both close to float64. An
    # infinite input in the last column reaches exactly the results whose sums read
    # it, whichever way it is read: the pair read past the last output column must
    # not bring it into the filter gradient.
    monkeypatch.setattr(_pallas, "_MIN_WARPS", 0)  # many rows a program
    cfg = make_cfg((2, 5, 15, 3), (*kernel, 3, m), (1, 2), dilations, padding)
    (x, f, dy), (x64, f64, dy64) = operands(cfg, "NCHW", jnp.float32, seed=m)
    x64[1, 3, 14, 2] = np.inf
    x = x.at[1, 2, 3, 14].set(jnp.inf)
    ops = three_ops(cfg, "NCHW", implementation="pallas")
    del ops["backprop_input"]  # it reads the output gradient, not strided windows
    got, given = under_both_launches(monkeypatch, "wide_strided_reads", ops, "NCHW", x, f, dy)
    assert {launch.wide_strided_reads for launch in given} == {False, True}
    np.testing.assert_array_equal(got[True]["forward"], got[False]["forward"])
    wants = references(cfg, x64, f64, dy64)
    for name in ("forward", "backprop_filter"):
        want = wants[name]
        finite = np.isfinite(want)
        for paired, results in got.items():
            message = f"{name}, columns read in pairs: {paired}"
            np.testing.assert_array_equal(results[name][~finite], want[~finite], err_msg=message)
            assert relative_error(results[name][finite], want[finite]) < 1e-6, message


@needs_kernels
@pytest.mark.parametrize(
    ("kernel", "strides", "dilations", "padding", "m", "width", "reuse_rows"),
    [
        # Phase 0 takes taps 0 and 2, phase 1 tap 1, which reads phase 0's tap 0's
        # tile; an odd width leaves phase 1 a column short.
        ((3, 3), (1, 2), (1, 1), "SAME", 1, 15, False),
        ((3, 3), (1, 2), (1, 1), "SAME", 1, 15, True),  # the shared tile kept too
        # Every tap in phase 0 (an even dilation): phase 1's columns are zeros; the
        # channels are repeated in registers and summed before the write.
        ((2, 3), (2, 2), (1, 2), "VALID", 2, 14, False),
        # A multiplier not repeated (lists of tiles), rows skipped at stride 2, with
        # kept rows read before the branch.
        ((3, 2), (2, 2), (1, 3), "EXPLICIT", 3, 15, True),
        # More taps than a program holds: the loop over the filter rows.
        ((5, 4), (1, 2), (1, 1), "SAME", 1, 15, False),
    ],
)
def test_strided_columns_written_in_pairs(
    kernel, strides, dilations, padding, m, width, reuse_rows, monkeypatch
):
    # In NCHW at column stride 2 a launch may compute both column phases of the input
    # gradient's tile and write them interleaved as one run, rather than each phase's
    # every other column alone. Each phase sums the same products in the same order
    # either way: the same bits. An infinite output gradient in the last column
    # reaches exactly the input pixels that read it.
    monkeypatch.setattr(_pallas, "_MIN_WARPS", 0)  # many rows a program
    chosen = _pallas._launch
    monkeypatch.setattr(
        _pallas,
        "_launch",
        lambda *args: dataclasses.replace(chosen(*args), reuse_rows=reuse_rows),
    )
    explicit = ((1, 2), (2, 0)) if padding == "EXPLICIT" else ((0, 0), (0, 0))
    cfg = make_cfg((2, 9, width, 3), (*kernel, 3, m), strides, dilations, padding, explicit)
    (x, f, dy), (_, f64, dy64) = operands(cfg, "NCHW", jnp.float32, seed=m)
    last = cfg["geom"][1][0] - 1  # the output's last column
    dy64[1, 2, last, 3 * m - 1] = np.inf
    dy = dy.at[1, 3 * m - 1, 2, last].set(jnp.inf)
    ops = {"backprop_input": three_ops(cfg, "NCHW", implementation="pallas")["backprop_input"]}
    got, given = under_both_launches(monkeypatch, "wide_strided_writes", ops, "NCHW", x, f, dy)
    assert {launch.wide_strided_writes for launch in given} == {False, True}
    assert all(launch.rows > 1 for launch in given)
    np.testing.assert_array_equal(got[True]["backprop_input"], got[False]["backprop_input"])
    want = ref_backprop_input(f64, dy64, cfg)
    finite = np.isfinite(want)
    assert not finite.all()
    np.testing.assert_array_equal(got[True]["backprop_input"][~finite], want[~finite])
    assert relative_error(got[True]["backprop_input"][finite], want[finite]) < 1e-6


def launch_on_one_warp(monkeypatch):
    """Every kernel launched on one warp, programs owning many rows: a wide tile on
    few warps gives each thread a group of columns (4 of float32, 8 of 16 bits)."""
    monkeypatch.setattr(_pallas, "_MIN_WARPS", 0)
    chosen = _pallas._launch
    monkeypatch.setattr(
        _pallas, "_launch", lambda *args: dataclasses.replace(chosen(*args), warps=1)
    )


@needs_kernels
@pytest.mark.parametrize(
    ("kernel", "strides", "dilations", "padding", "dtype", "width"),
    [
        # Windows at column offsets -1, 0, 1: one column off the groups each way.
        ((3, 3), (1, 1), (1, 1), "SAME", jnp.float32, 40),
        # Offsets -2 to 2 in groups of 8: moved two columns, and a half group
        # (4 in 8, at offset 2 of a stride-2 run of pairs) read as it was.
        ((5, 5), (1, 2), (1, 1), "SAME", jnp.bfloat16, 40),
        # Offsets 0, 3, 6, 9 in groups of 8: read from 0 and moved 3 columns left,
        # from 8 and moved 2 right, from 8 and moved 1 left.
        ((2, 4), (2, 1), (1, 3), "VALID", jnp.bfloat16, 40),
        # The input gradient's phases at stride 2, offsets -1 and 0, in an output
        # gradient of 24 columns.
        ((3, 2), (2, 2), (2, 1), "EXPLICIT", jnp.float32, 45),
    ],
)
def test_unaligned_columns_read_from_aligned_vectors(
    kernel, strides, dilations, padding, dtype, width, monkeypatch
):
    # In NCHW a launch may read a run of columns that starts off a vector's
    # alignment from the aligned vectors under it, plus an element a thread for
    # each column of the offset, and move the columns into place in registers. A
    # thread holds a group of columns only in a wide tile on few warps: one warp
    # here, so that the groups are 4 (float32) and 8 (16-bit) columns. The same
    # values reach the same sums, so each result equals float64's either way, to
    # the dtype's rounding, infinities and NaNs where they reach (an infinite input
    # in the last column, and in the columns the stride-2 runs of pairs read past
    # the output). (The two programs are not compared bit for bit: in interpret
    # mode XLA:CPU may fuse a product and its sum into one rounding in one of them
    # and not in the other.)
    launch_on_one_warp(monkeypatch)
    explicit = ((1, 2), (2, 1)) if padding == "EXPLICIT" else ((0, 0), (0, 0))
    # Rows of a multiple of 8 columns (or of 4, float32) start on a vector's
    # alignment (``_kernels.row_aligned``).
    cfg = make_cfg((2, 7, width, 3), (*kernel, 3, 2), strides, dilations, padding, explicit)
    (x, f, dy), (x64, f64, dy64) = operands(cfg, "NCHW", dtype, seed=kernel[1])
    x64[1, 3, width - 1, 2] = np.inf
    x = x.at[1, 2, 3, width - 1].set(jnp.inf)
    ops = three_ops(cfg, "NCHW", implementation="pallas")
    with mock.patch.object(_kernels, "aligned_run", wraps=_kernels.aligned_run) as moved:
        got, given = under_both_launches(monkeypatch, "aligned_reads", ops, "NCHW", x, f, dy)
    assert moved.called
    assert {launch.aligned_reads for launch in given} == {False, True}
    groups = {_kernels.thread_columns(g.cols * g.channels, g.cols, g.warps, dtype) for g in given}
    assert groups == {4 if dtype == jnp.float32 else 8}
    tolerance = 1e-6 if dtype == jnp.float32 else 1e-2  # bfloat16 rounds its results
    for name, want in references(cfg, x64, f64, dy64).items():
        finite = np.isfinite(want)
        for aligned, results in got.items():
            message = f"{name}, aligned reads: {aligned}"
            np.testing.assert_array_equal(results[name][~finite], want[~finite], err_msg=message)
            assert relative_error(results[name][finite], want[finite]) < tolerance, message


@needs_kernels
@pytest.mark.parametrize(("width", "moved"), [(40, True), (44, True), (42, False), (41, False)])
def test_columns_are_read_from_aligned_vectors_where_rows_start_aligned(width, moved, monkeypatch):
    # Row r of an NCHW array starts at element r * width, so Triton finds its runs
    # aligned only to the powers of two dividing the width: 8 columns of bfloat16
    # at 40, 4 at 44, 2 at 42, none at 41. A window one column off the groups
    # (8 columns a thread here) is read from the aligned vectors under it where
    # they hold 4 columns or more; at 42 and 41 the aligned run would load in as
    # many pieces as the window itself, so the window is read as it is. (A launch
    # option no cut sets.)
    launch_on_one_warp(monkeypatch)
    cfg = make_cfg((1, 4, width, 8), (3, 3, 8, 1), (1, 1), (1, 1), "SAME")
    (x, f, _), (x64, f64, _) = operands(cfg, "NCHW", jnp.bfloat16)
    forward = three_ops(cfg, "NCHW", implementation="pallas")["forward"]
    spy = mock.patch.object(_kernels, "aligned_run", wraps=_kernels.aligned_run)
    # launches_with clears JAX's caches: no kernel traced for another width is reused.
    with launches_with(aligned_reads=True), spy as aligned_run:
        y = from_nchw(np.asarray(forward(x, f), np.float64))
    assert aligned_run.called == moved
    assert relative_error(y, ref_forward(x64, f64, cfg)) < 1e-2


@needs_kernels
@pytest.mark.parametrize(
    ("x_shape", "kernel", "strides", "dilations", "padding", "m", "dtype", "segments"),
    [
        # All three walks, with a padding on the left and a dilated filter row
        # (the input gradient's first steps read columns left of the output
        # gradient), each program a segment of a row: the forward's and the
        # filter gradient's three columns of nine, fewer than the four between a
        # filter row's first and last tap; the input gradient's five of ten.
        # Programs of one row and one warp.
        ((2, 9, 10, 8), (2, 3), (1, 1), (2, 2), "EXPLICIT", 1, jnp.bfloat16, True),
        # Row stride 2 and column dilation 2 (a window of five columns), input
        # channels repeated for a multiplier of 2, bfloat16; whole rows, every
        # output column in the loop but for the first and last steps, unrolled,
        # which the filter gradient's leave out past the output.
        ((2, 9, 13, 4), (3, 3), (2, 1), (1, 2), "VALID", 2, jnp.bfloat16, False),
        # An explicit padding, a 2x4 filter dilated along its rows, a multiplier
        # that is not a power of two; segments of as many columns as lie
        # between a filter row's first and last tap.
        ((2, 9, 12, 3), (2, 4), (1, 1), (2, 1), "EXPLICIT", 3, jnp.float32, True),
        # Outputs no more than the columns between a filter row's taps: every
        # step unrolled, no loop.
        ((2, 5, 2, 8), (3, 3), (1, 1), (1, 1), "SAME", 1, jnp.float16, False),
        # Column stride 3 and dilation 2: a step reads three input columns, the
        # taps read phases 0, 2 and 1, the last one step later; segments of
        # three of the six output columns.
        ((2, 9, 17, 8), (3, 3), (2, 3), (1, 2), "EXPLICIT", 1, jnp.float32, True),
        # A 5x5 filter: 25 taps, 4 channels a thread, four columns kept.
        ((2, 6, 9, 4), (5, 5), (1, 1), (1, 1), "SAME", 1, jnp.bfloat16, False),
    ],
)
def test_kernels_walking_the_columns(
    x_shape, kernel, strides, dilations, padding, m, dtype, segments, monkeypatch
):
    # An NHWC kernel at column stride 1 may walk its rows' columns in order
    # (``_Launch.walk_columns``), each step a tile of rows by channels, the
    # columns later steps read again kept in registers: the forward's and the
    # filter gradient's input columns, the input gradient's and the filter
    # gradient's output-gradient columns. The filter gradient adds each tap's
    # products in another order than the tiled kernel, so each result is
    # compared with float64's: to float32's rounding, or the dtype's, with
    # infinities and NaNs exactly where float64 has them (an infinite input in
    # the first and the last column, which the walk's first and last steps read
    # beside output columns that do not exist, and in the last row, which rows
    # past the output read; and one output gradient). These grids are too small
    # for a GPU: a walk then cuts each row into as many segments as it can and
    # gives a program fewer rows, or, with no warps asked for, walks whole rows.
    if segments:
        monkeypatch.setattr(_pallas, "_MIN_WALK_COLUMNS", 3)
    explicit = ((1, 2), (2, 1)) if padding == "EXPLICIT" else ((0, 0), (0, 0))
    cfg = make_cfg(x_shape, (*kernel, x_shape[3], m), strides, dilations, padding, explicit)
    (x, f, dy), (x64, f64, dy64) = operands(cfg, "NHWC", dtype, seed=sum(kernel))
    for row, col in [(1, 0), (x_shape[1] - 1, x_shape[2] - 1)]:
        x64[1, row, col, 1] = np.inf
        x = x.at[1, row, col, 1].set(jnp.inf)
    # The input gradient walks at strides of 1 and without a multiplier.
    input_walks = strides == (1, 1) and m == 1
    # An infinite output gradient whose window lies inside the input (where it
    # reads a padding's zero, every implementation's filter gradient has 0 * inf).
    centre = [out // 2 for out, _ in cfg["geom"]]
    axes = zip(centre, cfg["geom"], strides, kernel, dilations, x_shape[1:3], strict=True)
    inside = all(0 <= o * st - b <= n - 1 - (k - 1) * d for o, (_, b), st, k, d, n in axes)
    if inside:
        dy64[0, *centre, 0] = np.inf
        dy = dy.at[0, *centre, 0].set(jnp.inf)
    ops = three_ops(cfg, "NHWC", implementation="pallas")
    kernels = ("_walk_forward_kernel", "_walk_input_kernel", "_walk_partials_kernel")
    spies = [mock.patch.object(_pallas, k, wraps=getattr(_pallas, k)) for k in kernels]
    chosen, given = _pallas._launch, []

    def launch(*args):
        # Tiles of 8 channels: the 9 output channels of a multiplier of 3 take two
        # channel blocks, the second one lane. Whole rows where no warps are asked for.
        walk = dict(walk_columns=True, walk_warps=1 if segments else 2, walk_channels=8)
        walk |= {} if segments else {"walk_grid_warps": 0}
        given.append(dataclasses.replace(chosen(*args), **walk))
        return given[-1]

    monkeypatch.setattr(_pallas, "_launch", launch)
    jax.clear_caches()  # no kernel traced under another launch is reused
    with spies[0] as forward_walked, spies[1] as input_walked, spies[2] as filter_walked:
        results = run_ops(ops, "NHWC", x, f, dy)
    jax.clear_caches()
    assert forward_walked.call_count > 0 and filter_walked.call_count > 0
    assert (input_walked.call_count > 0) == input_walks
    conv = configured(cfg, "NHWC")
    walked = ("forward", "filter", "input") if input_walks else ("forward", "filter")
    walks = {(k, _pallas._walk_launch(conv, g, k)) for g in given for k in walked}
    for k, walk in walks:
        width = _pallas._tiled(conv, k)[0][1]
        assert (walk.cols < width, walk.rows == 1) == (segments, segments), k
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, in float64 too
        wants = references(cfg, x64, f64, dy64)
    tolerance = 1e-6 if dtype == jnp.float32 else 1e-2  # half types round their results
    for name, want in wants.items():
        finite = np.isfinite(want)
        assert finite.all() == (name == "backprop_input" and not inside), name
        np.testing.assert_array_equal(results[name][~finite], want[~finite], err_msg=name)
        assert relative_error(results[name][finite], want[finite]) < tolerance, name


def test_which_kernels_walk_the_columns():
    # A walk reads the input columns of one output column a step (as many as the
    # column stride) along the channels, the minor axis in NHWC only, a run of 8
    # a thread, 4 for a filter of more than 16 taps (fewer would leave its loads
    # narrow), and pairs them with the
    # columns at fixed distances from it; its taps are all held at once, and so
    # are the columns later steps read again. The input gradient's columns and
    # rows read the output gradient's at fixed offsets only at strides of 1,
    # and its lanes are the output's only without a multiplier.
    def walks(kernel, x_shape, f_shape, strides=(1, 1), dilations=(1, 1), data_format="NHWC"):
        cfg = make_cfg(x_shape, f_shape, strides, dilations, "SAME")
        conv = configured(cfg, data_format)
        launch = dataclasses.replace(_pallas._launch(conv, True, kernel), walk_columns=True)
        return _pallas._walks_columns(conv, launch, kernel)

    x, f = (2, 9, 40, 8), (3, 3, 8, 1)
    for kernel in ("forward", "input", "filter"):
        assert walks(kernel, x, f)
        assert not walks(kernel, x, f, data_format="NCHW")
        assert walks(kernel, x, f, strides=(1, 2)) == (kernel != "input")
        assert walks(kernel, x, (5, 5, 8, 1))  # 25 taps, 4 channels a thread
        assert walks(kernel, (2, 9, 40, 4), (5, 5, 4, 1))
        assert not walks(kernel, x, (7, 7, 8, 1))  # 49 taps, more than a walk holds
        assert not walks(kernel, x, f, dilations=(1, 5))  # ten columns kept
        # At column stride 2, the last tap five steps on, both phases: ten kept.
        assert not walks(kernel, x, f, strides=(1, 2), dilations=(1, 5))
        assert walks(kernel, x, f, strides=(1, 2), dilations=(1, 4)) == (kernel != "input")
        assert walks(kernel, x, f, strides=(2, 1)) == (kernel != "input")
        assert walks(kernel, x, (3, 3, 8, 2)) == (kernel != "input")
        assert not walks(kernel, (2, 9, 40, 4), (3, 3, 4, 1))  # four channels
        # Eight output channels from four: the input gradient's lanes are the four.
        assert walks(kernel, (2, 9, 40, 4), (3, 3, 4, 2)) == (kernel != "input")


def test_the_nhwc_filter_gradient_walks_small_filters_by_default():
    # The cuts walk the columns of the NHWC filter gradient of filters of up to 9
    # taps whose walk keeps at most two columns of a filter row, as a 3x3 filter's
    # does at column strides 1 and 2, on one warp a program. No other kernel walks,
    # nor a filter whose walk keeps more (a dilated or a wider one, whose walk
    # takes most of a thread's registers), unless a launch sets it.
    def walks(kernel, f_shape, data_format="NHWC", strides=(1, 1), dilations=(1, 1)):
        cfg = make_cfg((2, 9, 40, 8), f_shape, strides, dilations, "SAME")
        conv = configured(cfg, data_format)
        launch = _pallas._launch(conv, True, kernel)
        return _pallas._walks_columns(conv, launch, kernel), launch.walk_warps

    assert walks("filter", (3, 3, 8, 1)) == (True, 1)
    assert walks("filter", (3, 3, 8, 1), strides=(1, 2)) == (True, 1)
    assert walks("filter", (3, 3, 8, 1), strides=(2, 2)) == (True, 1)
    assert walks("filter", (3, 3, 8, 2)) == (True, 1)
    assert walks("filter", (3, 3, 8, 1), dilations=(2, 1)) == (True, 1)  # rows: kept 2
    assert walks("filter", (9, 1, 8, 1)) == (True, 1)  # one column: none kept
    assert walks("filter", (2, 2, 8, 1)) == (True, 1)
    for dilation in (2, 3, 4):  # 4, 6 and 8 columns kept
        assert not walks("filter", (3, 3, 8, 1), dilations=(1, dilation))[0], dilation
    assert not walks("filter", (1, 9, 8, 1))[0]  # 8 kept
    assert not walks("filter", (1, 5, 8, 1))[0]  # 4 kept
    assert not walks("filter", (4, 4, 8, 1))[0]
    assert not walks("filter", (5, 5, 8, 1))[0]
    assert not walks("filter", (3, 3, 8, 1), "NCHW")[0]
    for kernel in ("forward", "input"):
        assert not walks(kernel, (3, 3, 8, 1))[0]


def test_a_walk_keeps_its_phases_for_each_step_its_last_tap_lags():
    # A walk keeps, of each filter row, the columns of the steps between an output
    # column's own and the last its taps read, every phase of a step some tap reads.
    def kept(f_shape, strides=(1, 1), dilations=(1, 1)):
        cfg = make_cfg((2, 9, 40, 8), f_shape, strides, dilations, "SAME")
        return _pallas._walk_kept(configured(cfg, "NHWC"))

    assert kept((3, 3, 8, 1)) == 2  # taps 0, 1, 2 steps on, one phase
    assert kept((3, 3, 8, 1), strides=(1, 2)) == 2  # 0, 0, 1 steps on, two phases
    assert kept((3, 3, 8, 1), strides=(1, 3)) == 0  # all in the output column's step
    assert kept((3, 3, 8, 1), dilations=(1, 2)) == 4
    assert kept((3, 3, 8, 1), dilations=(1, 4)) == 8
    assert kept((1, 9, 8, 1)) == 8
    assert kept((1, 5, 8, 1), strides=(1, 2)) == 4  # 2 steps on, two phases


@pytest.mark.parametrize(
    ("x_shape", "side", "warps", "channels", "cols", "rows"),
    [
        # Whole rows of 16 rows by 32 channels make 672 programs of 2 warps.
        ((32, 112, 112, 96), 3, 2, 32, 112, 16),
        ((32, 112, 112, 96), 3, 1, 32, 112, 8),
        # A tile of 64 channels: 8 rows, 896 programs.
        ((32, 112, 112, 96), 3, 2, 64, 112, 8),
        # 4 channels a thread for a 5x5 filter: 8 rows, 1344 programs.
        ((32, 56, 56, 192), 5, 2, 32, 56, 8),
        # The example U-Net's layers: 128 programs of whole rows, 32 by 16
        # channels, make 256 warps; four segments of 16 columns, 1024.
        ((64, 64, 64, 16), 3, 2, 16, 16, 32),
        ((64, 128, 128, 48), 3, 2, 32, 128, 16),
        ((64, 64, 64, 32), 3, 1, 32, 32, 8),
        # 61 columns cannot be cut into equal segments: fewer rows instead.
        ((32, 64, 61, 32), 3, 2, 32, 61, 4),
    ],
)
def test_walks_cut_rows_into_segments_to_fill_the_gpu(x_shape, side, warps, channels, cols, rows):
    # A walk's program holds a tile of rows by channels (``walk_channels`` at
    # most) that gives each thread a run of 8 channels (4 for a 5x5 filter), and
    # walks a whole row
    # where the grid then has warps enough to keep the GPU busy; where it does
    # not, the row is cut into equal segments, a program each, of 16 columns at
    # least; only where those are still too few do the programs take fewer rows.
    cfg = make_cfg(x_shape, (side, side, x_shape[3], 1), (1, 1), (1, 1), "SAME")
    conv = configured(cfg, "NHWC")
    for kernel in ("forward", "input", "filter"):
        walk = dict(walk_columns=True, walk_warps=warps, walk_channels=max(channels, 32))
        launch = dataclasses.replace(_pallas._launch(conv, False, kernel), **walk)
        walk = _pallas._walk_launch(conv, launch, kernel)
        assert (walk.channels, walk.cols, walk.rows, walk.warps) == (channels, cols, rows, warps)
        grid = _pallas._walk_grid(conv, walk, kernel)
        assert grid[2] * walk.cols == x_shape[2], kernel
        assert math.prod(grid) * warps >= walk.walk_grid_warps, kernel


@pytest.mark.parametrize(
    ("grid_warps", "cols", "programs"),
    [(1024, 112, 1344), (2048, 56, 2688), (4096, 28, 5376), (8192, 16, 9408)],
)
def test_a_walks_grid_of_more_warps_cuts_its_rows_into_shorter_segments(grid_warps, cols, programs):
    # The grid a walk makes at least (``_Launch.walk_grid_warps``) sets how many
    # segments its rows are cut into: the NHWC filter gradient of the [32,112,
    # 112,96] 3x3 case, on one warp a program, walks whole rows at the default,
    # 1344 programs, which a GPU of 132 multiprocessors holding 10 of them runs
    # in two waves, the second of 24; more warps cut the rows into halves,
    # quarters and sevenths, the shortest of 16 columns.
    cfg = make_cfg((32, 112, 112, 96), (3, 3, 96, 1), (1, 1), (1, 1), "SAME")
    conv = configured(cfg, "NHWC")
    launch = _pallas._launch(conv, False, "filter")
    assert launch.walk_columns and launch.walk_grid_warps == 1024
    launch = dataclasses.replace(launch, walk_grid_warps=grid_warps)
    walk = _pallas._walk_launch(conv, launch, "filter")
    grid = _pallas._walk_grid(conv, walk, "filter")
    assert (walk.cols, walk.rows, walk.warps, math.prod(grid)) == (cols, 8, 1, programs)
    assert grid[2] * walk.cols == 112 and math.prod(grid) * walk.warps >= grid_warps


@needs_kernels
@pytest.mark.parametrize(
    ("data_format", "channels", "m", "repeats"),
    [
        ("NHWC", 3, 2, True),
        ("NHWC", 9, 4, True),  # 36 output channels: a second, partial channel tile
        ("NCHW", 3, 8, True),  # a tile of 8 output channels: one input channel
        ("NCHW", 2, 16, False),  # more than a tile's 8 channels
        ("NHWC", 2, 3, False),  # not a power of two
    ],
)
def test_multipliers_read_each_input_channel_once_where_they_can(data_format, channels, m, repeats):
    # With a power-of-two multiplier that fits in a tile, the kernels read a tile's
    # input channels once and repeat them across the output lanes (the input
    # gradient: read output lanes and sum each channel's M); otherwise they read an
    # input channel once for each of its output channels. Both give the reference.
    cfg = make_cfg((2, 6, 5, channels), (3, 2, channels, m), (2, 1), (1, 2), "SAME")
    (x, f, dy), exact = operands(cfg, data_format, jnp.float64, seed=m)
    strides, padding, kw = op_kwargs(cfg, data_format)
    conv = _plan.configure(
        "test", x.shape, f.shape, strides, padding, data_format, kw["dilations"], ()
    )
    assert _pallas._repeats(conv) == repeats
    want = references(cfg, *exact)
    got = run_ops(three_ops(cfg, data_format, implementation="pallas"), data_format, x, f, dy)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-10, err_msg=name)


@needs_kernels
@pytest.mark.parametrize(
    ("x_shape", "f_shape", "stride", "data_format", "launches"),
    [
        # benchmarks/gpu.py's cases, where benchmarks/tune.py searched the launches:
        # kernel -> (columns, channels, rows, warps, rows kept, taps).
        (
            (32, 112, 112, 96),
            (3, 3, 96, 1),
            1,
            "NHWC",
            {"forward": (16, 32, 8, 4, False, 16), "filter": (8, 64, 4, 8, True, 16)},
        ),
        ((32, 112, 112, 96), (3, 3, 96, 1), 2, "NHWC", {"filter": (8, 64, 2, 8, True, 16)}),
        (
            (32, 56, 56, 192),
            (5, 5, 192, 1),
            1,
            "NHWC",
            {
                "forward": (8, 16, 8, 2, True, 32),
                "input": (8, 16, 8, 2, True, 32),
                "filter": (8, 64, 8, 8, True, 16),
            },
        ),
        ((32, 112, 112, 32), (3, 3, 32, 2), 1, "NHWC", {"filter": (8, 64, 2, 8, True, 16)}),
        (
            (32, 96, 112, 112),
            (3, 3, 96, 1),
            1,
            "NCHW",
            {
                "forward": (128, 8, 8, 4, True, 16),
                "input": (64, 8, 8, 4, False, 16),
                "filter": (128, 8, 16, 4, True, 16),
            },
        ),
    ],
)
def test_the_benchmark_cases_get_the_searched_launches(
    x_shape, f_shape, stride, data_format, launches
):
    # The launch table (_CUTS) and the rows rule give, on the cases a GPU searched,
    # launches the searches timed (docs/performance.md has them); and every grid
    # has warps enough, or one row a program.
    conv = _plan.configure(
        "test", x_shape, f_shape, (stride, stride), "SAME", data_format, (1, 1), ()
    )
    for kernel, want in launches.items():
        launch = _pallas._launch(conv, False, kernel)
        got = (
            launch.cols,
            launch.channels,
            launch.rows,
            launch.warps,
            launch.reuse_rows,
            launch.taps,
        )
        assert got == want, kernel
    for kernel in ("forward", "input", "filter"):
        launch = _pallas._launch(conv, False, kernel)
        warps = math.prod(_pallas._grid(conv, launch, kernel)) * launch.warps
        assert warps >= _pallas._MIN_WARPS or launch.rows == 1, kernel


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3])
def test_only_the_multipliers_nchw_forward_and_filter_gradient_read_aligned(
    data_format, multiplier
):
    # Timed on a GPU, reading unaligned runs of columns from aligned vectors made
    # every NCHW kernel slower but the forward and the filter gradient with a depth
    # multiplier: those launches read so, and no other.
    shape = (32, 112, 112, 32) if data_format == "NHWC" else (32, 32, 112, 112)
    conv = _plan.configure(
        "test", shape, (3, 3, 32, multiplier), (1, 1), "SAME", data_format, (1, 1), ()
    )
    for kernel in ("forward", "input", "filter"):
        aligned = data_format == "NCHW" and multiplier > 1 and kernel != "input"
        assert _pallas._launch(conv, False, kernel).aligned_reads == aligned, kernel


def sums_per_thread(conv, launch):
    """The float32 sums a filter-gradient thread holds: a tap of its largest
    group for each element of its tile."""
    taps = max(end - start for start, end in _pallas._tap_groups(conv, launch))
    return taps * launch.cols * launch.channels / (32 * launch.warps)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("kernel", [(3, 3), (4, 4), (5, 5), (7, 7), (3, 5), (1, 9)])
@pytest.mark.parametrize("width", [56, 94, 112, 137])
def test_a_filter_gradient_thread_holds_no_more_sums_than_a_3x3_filters(data_format, kernel, width):
    # The cuts were searched with 3x3 filters, whose NCHW tile holds the most sums
    # a thread; a larger filter's group of taps holds more at the same tile,
    # crowding out the windows beside them. Its tile narrows to the widest of its
    # cut that holds no more than the 3x3's.
    def filter_launch(kernel, data_format, width):
        n, h, c = 8, 112, 32
        shape = (n, h, width, c) if data_format == "NHWC" else (n, c, h, width)
        conv = _plan.configure(
            "test", shape, (*kernel, c, 1), (1, 1), "SAME", data_format, (1, 1), ()
        )
        return conv, _pallas._launch(conv, False, "filter")

    most = sums_per_thread(*filter_launch((3, 3), "NCHW", 112))
    conv, launch = filter_launch(kernel, data_format, width)
    assert sums_per_thread(conv, launch) <= most
    whole = launch.cols * launch.channels == _pallas._cut(conv, "filter").tile
    wider = dataclasses.replace(launch, cols=2 * launch.cols)
    assert whole or launch.cols >= width or sums_per_thread(conv, wider) > most
    if data_format == "NCHW" and kernel in [(5, 5), (7, 7)] and width > 64:
        assert launch.cols == 64  # half the 3x3's 128 columns


@needs_kernels
@pytest.mark.parametrize("stride", [1, 2])
def test_a_narrowed_tile_sums_a_wide_image(stride):
    # A 5x5 filter's gradient in NCHW sums an output of 70 columns in tiles of 64
    # (a 3x3 filter's would span 128): two column tiles, the second 6 columns. At
    # stride 2 each tile reads its windows as runs of column pairs.
    cfg = make_cfg((1, 6, 70 * stride, 8), (5, 5, 8, 1), (stride, stride), (1, 1), "SAME")
    launch = _pallas._launch(configured(cfg, "NCHW"), True, "filter")
    assert launch.cols == 64
    assert launch.wide_strided_reads
    (x, _, dy), (x64, _, dy64) = operands(cfg, "NCHW", jnp.float64, seed=8)
    df = three_ops(cfg, "NCHW", implementation="pallas")["backprop_filter"](x, dy)
    np.testing.assert_allclose(df, ref_backprop_filter(x64, dy64, cfg), rtol=1e-10, atol=1e-10)


@needs_kernels
def test_the_partials_of_many_programs_are_added_block_by_block(monkeypatch):
    # The last kernel of the filter gradient adds the partials in blocks of
    # _SUM_BLOCK elements, at most _SUM_LANES filter elements a program. Small
    # blocks make a small case take several of each, the last ones cut short by
    # masks.
    monkeypatch.setattr(_pallas, "_SUM_BLOCK", 32)
    monkeypatch.setattr(_pallas, "_SUM_LANES", 8)
    jax.clear_caches()  # no kernel traced with the usual blocks is reused
    cfg = make_cfg((5, 19, 6, 3), (3, 3, 3, 1), (1, 1), (1, 1), "SAME")
    strides, padding, kw = op_kwargs(cfg, "NHWC")
    conv = _plan.configure(
        "test", cfg["x_shape"], cfg["f_shape"], strides, padding, "NHWC", kw["dilations"], ()
    )
    programs = _pallas._row_programs(conv, _pallas._launch(conv, True, "filter"), "filter")
    rows, lanes = _pallas._sum_block(3 * 3 * 3)
    assert (rows, lanes) == (4, 8)  # 27 elements: four programs, the last one partial
    assert programs % rows and programs > 2 * rows  # three blocks or more, the last partial
    x, _, dy = random_operands(cfg, 7)
    df = jaxgrad.depthwise_conv2d_backprop_filter(
        x, cfg["f_shape"], dy, strides, padding, implementation="pallas"
    )
    np.testing.assert_allclose(df, ref_backprop_filter(x, dy, cfg), rtol=1e-10, atol=1e-10)


def test_a_small_filter_sums_more_partials_a_block():
    # A block holds _SUM_BLOCK partial elements; lanes a filter lacks hold more partials.
    block = _pallas._SUM_BLOCK
    assert _pallas._sum_block(3 * 3 * 96) == (block // 32, 32)
    assert _pallas._sum_block(3 * 3) == (block // 16, 16)
    assert _pallas._sum_block(1) == (block, 1)


# ----------------------------------------------------------------------------------
# The forward op's backward
# ----------------------------------------------------------------------------------


def configured(cfg, data_format):
    strides, padding, kw = op_kwargs(cfg, data_format)
    x_shape = cfg["x_shape"] if data_format == "NHWC" else to_nchw_shape(cfg["x_shape"])
    return _plan.configure(
        "test",
        x_shape,
        cfg["f_shape"],
        strides,
        padding,
        data_format,
        kw["dilations"],
        kw.get("explicit_paddings", ()),
    )


def to_nchw_shape(shape):
    n, h, w, c = shape
    return (n, c, h, w)


STRIDE_1 = ((2, 9, 8, 3), (3, 3, 3, 1), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)))


@needs_kernels
@pytest.mark.parametrize(
    ("wrt", "kernels"),
    [
        ((0, 1), {"_input_kernel", "_partials_kernel", "_sum_kernel"}),
        ((0,), {"_input_kernel"}),  # the filter is fixed: no filter gradient
        ((1,), {"_partials_kernel", "_sum_kernel"}),  # the input is data: no input gradient
    ],
)
def test_the_backward_computes_only_the_gradients_asked_for(wrt, kernels):
    # The backward computes the gradients of the differentiated operands alone: the
    # first layer of a network reads data, and computes the filter gradient only.
    cfg = make_cfg(*STRIDE_1)
    (x, f, _), _ = operands(cfg, "NHWC", jnp.float32)
    forward = three_ops(cfg, "NHWC", implementation="pallas")["forward"]
    grad = jax.grad(lambda x, f: jnp.sum(forward(x, f) ** 2), wrt)
    launched = launched_kernels(lowered_text(grad, x, f, platform="cuda"))
    assert sorted(launched) == sorted({"_forward_kernel", *kernels})


def spy_on_rules(monkeypatch):
    """A list that records from now on, by name, each call the depthwise VJP
    rules make of the three ops (``"_conv"``, ``"_backprop_input"``,
    ``"_backprop_filter"``). JAX's caches are cleared, so that every backward is
    traced anew."""
    from jaxgrad._depthwise import _ops

    calls = []
    for name in ("_conv", "_backprop_input", "_backprop_filter"):  # the rules call them compiled
        original = getattr(_ops, f"_compiled{name}")
        spy = lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)  # noqa: E731
        monkeypatch.setattr(_ops, f"_compiled{name}", spy)
    jax.clear_caches()
    return calls


@pytest.mark.parametrize(
    ("wrt", "rules"),
    [
        ((0, 1), ["_backprop_input", "_backprop_filter"]),
        ((0,), ["_backprop_input"]),
        ((1,), ["_backprop_filter"]),
    ],
)
def test_the_backward_rule_calls_only_the_gradients_asked_for(wrt, rules, monkeypatch):
    # The lowered programs above lose an unused gradient to dead-code elimination
    # anyway (a rule that computes both passes that test); the rule must not
    # trace it either.
    cfg = make_cfg(*STRIDE_1)
    (x, f, _), _ = operands(cfg, "NHWC", jnp.float32)
    forward = three_ops(cfg, "NHWC", implementation="xla")["forward"]
    calls = spy_on_rules(monkeypatch)
    jax.grad(lambda x, f: jnp.sum(forward(x, f) ** 2), wrt)(x, f)
    assert [call for call in calls if call != "_conv"] == rules  # the forward aside


@pytest.mark.parametrize(
    ("wanted", "rules"),
    [
        ("dx", ["_backprop_filter"]),
        ("df", ["_backprop_input"]),
        ("both", ["_backprop_input", "_backprop_filter"]),
    ],
)
def test_a_derivative_through_one_gradient_costs_that_gradient_alone(wanted, rules, monkeypatch):
    # Differentiated through the input gradient alone (a penalty on dx), the
    # filter gradient gets no cotangent, and only the input gradient's rules run:
    # the ops its VJP is made of, and of those only what the perturbed operands
    # need (dy is data here: the filter gradient, not a forward).
    calls = spy_on_rules(monkeypatch)
    cfg = make_cfg(*STRIDE_1)
    (x, f, dy), _ = operands(cfg, "NHWC", jnp.float32)
    forward = three_ops(cfg, "NHWC", implementation="xla")["forward"]

    def penalty(x, f):
        gx, gf = jax.vjp(forward, x, f)[1](dy)
        picked = {"dx": (gx,), "df": (gf,), "both": (gx, gf)}[wanted]
        return sum(jnp.sum(g**2) for g in picked)

    penalized, pullback = jax.vjp(penalty, x, f)
    calls.clear()  # the forward and its backward: what the penalty computes
    pullback(jnp.ones_like(penalized))
    assert calls == rules


def test_a_hessian_vector_product_in_the_input_computes_no_filter_gradient(monkeypatch):
    # With the filter fixed, the gradient in the input is the input gradient of a
    # cotangent that depends on the input; differentiated again, its VJP needs
    # that cotangent's gradient alone (a forward), not the filter's.
    cfg = make_cfg(*STRIDE_1)
    (x, f, v), (_, f64, v64) = operands(cfg, "NHWC", jnp.float32)
    forward = three_ops(cfg, "NHWC", implementation="xla")["forward"]
    calls = spy_on_rules(monkeypatch)
    gradient = jax.grad(lambda x: jnp.sum(forward(x, f) ** 2))
    product = jax.grad(lambda x: jnp.vdot(gradient(x), v))(x)
    assert "_backprop_filter" not in calls and "_backprop_input" in calls
    # The loss is quadratic in x: its Hessian-vector product is 2 A^T A v.
    reference = 2 * ref_backprop_input(f64, ref_forward(v64, f64, cfg), cfg)
    np.testing.assert_allclose(product, reference, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------
# Choosing the implementation
# ----------------------------------------------------------------------------------


def grad_fn(implementation, dtype=jnp.float32):
    cfg = make_cfg(*CASES[0])
    (x, f, _), _ = operands(cfg, "NHWC", dtype)

    def loss(x, f):
        y = jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", implementation=implementation)
        return (y.astype(jnp.float32) ** 2).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1))), (x, f)


def lowered(implementation, platform, dtype=jnp.float32):
    fn, args = grad_fn(implementation, dtype)
    return lowered_text(fn, *args, platform=platform)


def test_default_is_the_portable_program_on_the_cpu(patch):
    # No CUDA GPU in the process (as on a machine without one, whatever this one
    # has): the default traces the portable arithmetic alone, and the program is
    # exactly the "xla" one.
    patch(_implementation, "_cuda_capability", lambda: None)
    assert lowered(None, "cpu") == lowered("xla", "cpu")


@needs_kernels
def test_default_picks_the_kernels_when_the_program_is_lowered_for_cuda(patch):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    assert TRITON_CALL in lowered(None, "cuda")
    assert TRITON_CALL not in lowered(None, "cpu")
    # float64 stays on the portable arithmetic on every platform.
    assert TRITON_CALL not in lowered(None, "cuda", jnp.float64)


@needs_kernels
def test_default_is_the_portable_program_on_gpus_older_than_ampere(patch):
    # XLA compiles Triton kernels for GPUs of compute capability 8.0 and newer
    # only: on a V100 or a T4 the default program is exactly "xla"'s.
    patch(_implementation, "_cuda_capability", lambda: (7, 5))
    assert lowered(None, "cuda") == lowered("xla", "cuda")
    patch(_implementation, "_cuda_capability", lambda: (8, 0))  # an A100
    jax.clear_caches()
    assert TRITON_CALL in lowered(None, "cuda")


@needs_kernels
def test_explicit_pallas_raises_on_gpus_older_than_ampere(patch):
    patch(_implementation, "_backend_platform", lambda: "cuda")
    patch(_implementation, "_cuda_capability", lambda: (7, 0))
    with pytest.raises(ValueError, match=r"capability 8.0 \(Ampere\) or newer.*this one's is 7.0"):
        lowered("pallas", "cpu")


def test_default_falls_back_without_pallas(patch):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    patch(_pallas, "AVAILABLE", False)
    assert TRITON_CALL not in lowered(None, "cuda")
    with pytest.raises(ValueError, match=r"implementation='pallas' needs Pallas' Triton backend"):
        lowered("pallas", "cpu")


def test_a_jax_that_refuses_to_lower_triton_kernels_is_recognised(patch):
    # JAX 0.11 deprecates Pallas' Triton backend. Once JAX turns the deprecation
    # into an error, _kernels.AVAILABLE is false, and the ops behave as in
    # test_default_falls_back_without_pallas.
    patch(deprecations, "is_accelerated", lambda name: False)
    assert not _kernels._lowering_refused()
    patch(deprecations, "is_accelerated", lambda name: name == "jax-pallas-triton")
    assert _kernels._lowering_refused()


def test_the_kernels_run_on_every_jax_that_lowers_them():
    # Every JAX jaxgrad supports (0.7.2 and later) has the loads and stores of
    # Pallas' Triton backend that the kernels use, until JAX refuses to lower it.
    # Where this JAX lowers them, the kernels' tests run (tests/helpers.py:
    # needs_kernels); a wrong AVAILABLE would skip them.
    lowers = not _kernels._lowering_refused()
    assert lowers == _kernels.AVAILABLE


@needs_kernels
def test_explicit_pallas_raises_on_another_backend(patch):
    patch(_implementation, "_backend_platform", lambda: "tpu")
    with pytest.raises(ValueError, match=r"runs on CUDA GPUs .* not on 'tpu'"):
        lowered("pallas", "cpu")


def test_xla_never_uses_the_kernels(patch):
    patch(_implementation, "_cuda_capability", lambda: H100_CAPABILITY)
    assert TRITON_CALL not in lowered("xla", "cuda")


@pytest.mark.parametrize("bad", ["triton", "XLA", 1])
def test_bad_implementation(bad):
    with pytest.raises(ValueError, match=r"depthwise_conv2d: implementation must be None"):
        jaxgrad.depthwise_conv2d(
            jnp.ones((1, 3, 3, 1)), jnp.ones((1, 1, 1, 1)), (1, 1), "SAME", implementation=bad
        )


# ----------------------------------------------------------------------------------
# The kernels lower for CUDA (Triton), checked on the CPU
# ----------------------------------------------------------------------------------

LOWERING_CASES = [*CASES, LARGE]


@needs_kernels
@pytest.mark.parametrize(("case", "data_format", "dtype"), list(kernel_grid(len(LOWERING_CASES))))
def test_kernels_lower_for_cuda(case, data_format, dtype):
    # Builds each kernel's Triton program, as a GPU run would before compiling it:
    # an operation the Triton backend cannot lower fails here, without a GPU. The
    # forward and its backward launch every kernel once (the gradient ops' VJP
    # wiring, which launches the same kernels, is tested above), so one program
    # lowers each kernel once: the forward, the input gradient, the filter
    # gradient's partials and their sum.
    cfg = make_cfg(*LOWERING_CASES[case])
    (x, f, dy), _ = operands(cfg, data_format, dtype)
    forward = three_ops(cfg, data_format, implementation="pallas")["forward"]

    def forward_and_backward(x, f, dy):
        y, vjp = jax.vjp(forward, x, f)
        return y, vjp(dy)

    kernels = launched_kernels(lowered_text(forward_and_backward, x, f, dy, platform="cuda"))
    each_once = ["_forward_kernel", "_input_kernel", "_partials_kernel", "_sum_kernel"]
    assert sorted(kernels) == each_once


# Every depthwise kernel launched with ``_Launch`` fields set: ``launches_with(read_ahead=True)``.
launches_with = functools.partial(kernel_launches, _pallas)


# The launches a GPU run may time (benchmarks/tune.py, benchmarks/compare.py): each
# option the cuts leave off, on, and those they set, off.
LOWERED_LAUNCHES = [
    {},
    {"reuse_rows": True},
    {"read_ahead": True},
    {"taps": 32, "reuse_rows": True},
    {"walk_columns": True},
    {"walk_columns": True, "walk_warps": 1},
    {"walk_columns": True, "walk_warps": 1, "walk_grid_warps": 8192},
    {"aligned_reads": True},
    {
        "reuse_rows": False,
        "wide_strided_reads": False,
        "wide_strided_writes": False,
        "walk_columns": False,
    },
]


# A GPU reads past an array where interpret mode would clamp a lane into it: every
# access checked, over the reference tests' configurations and the launches.
@needs_kernels
@settings(max_examples=examples(5), deadline=None)
@given(
    configs(sides=(1, 20), channels=(1, 9)),
    st.sampled_from(["NHWC", "NCHW"]),
    st.integers(0, 2**31 - 1),
    st.sampled_from(LOWERED_LAUNCHES),
)
def test_kernels_access_only_lanes_inside_their_arrays(cfg, data_format, seed, fields):
    x, f, dy = random_operands(cfg, seed)
    with bounds_checked_kernels(), launches_with(**fields):
        y, dx, df = run_all_three(cfg, data_format, x, f, dy, implementation="pallas")
    np.testing.assert_allclose(y, ref_forward(x, f, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, ref_backprop_input(f, dy, cfg), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(df, ref_backprop_filter(x, dy, cfg), rtol=1e-10, atol=1e-10)


# Lowering builds each kernel's Triton program without running it: cheap enough to
# draw configurations at the sizes a GPU meets, where the tiles, walks and launches
# take the shapes that tiny arrays never give them.
@needs_kernels
@settings(max_examples=examples(20), deadline=None)
@given(
    configs(kernel=(1, 7), sides=(1, 140), channels=(1, 40)),
    st.sampled_from(["NHWC", "NCHW"]),
    st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
    st.sampled_from(LOWERED_LAUNCHES),
)
def test_kernels_lower_for_cuda_in_every_configuration(cfg, data_format, dtype, fields):
    layout = (lambda s: (s[0], s[3], s[1], s[2])) if data_format == "NCHW" else (lambda s: s)
    x, f, dy = (
        jax.ShapeDtypeStruct(shape, dtype)
        for shape in (layout(cfg["x_shape"]), cfg["f_shape"], layout(out_shape(cfg)))
    )
    forward = three_ops(cfg, data_format, implementation="pallas")["forward"]

    def forward_and_backward(x, f, dy):
        y, vjp = jax.vjp(forward, x, f)
        return y, vjp(dy)

    with launches_with(**fields):
        text = lowered_text(forward_and_backward, x, f, dy, platform="cuda")
    assert text.count(TRITON_CALL) == 4  # the forward, the input gradient, the partials, their sum


@needs_kernels
@pytest.mark.parametrize(("dtype", "strides"), [(jnp.bfloat16, (1, 1)), (jnp.float32, (2, 2))])
def test_column_walks_lower_for_cuda(dtype, strides, monkeypatch):
    # A walk's loop carries the columns it keeps (and the filter gradient's
    # sums), and its first and last steps are unrolled: all of it must lower to
    # Triton, in the forward and in the filter gradient's partials, at column
    # stride 1 and at 2 (two phases a step).
    cfg = make_cfg((2, 12, 20, 48), (3, 3, 48, 1), strides, (1, 1), "SAME")
    (x, f, dy), _ = operands(cfg, "NHWC", dtype)
    ops = three_ops(cfg, "NHWC", implementation="pallas")

    def forward_and_filter_gradient(x, f, dy):
        return ops["forward"](x, f), ops["backprop_filter"](x, dy)

    chosen = _pallas._launch
    monkeypatch.setattr(
        _pallas, "_launch", lambda *a: dataclasses.replace(chosen(*a), walk_columns=True)
    )
    jax.clear_caches()
    text = lowered_text(forward_and_filter_gradient, x, f, dy, platform="cuda")
    walks = ["_sum_kernel", "_walk_forward_kernel", "_walk_partials_kernel"]
    assert sorted(launched_kernels(text)) == walks
    jax.clear_caches()


# ----------------------------------------------------------------------------------
# The portable filter gradient's last sum on GPU platforms
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, axes",
    [
        ((3, 2, 17, 9, 4), (0, 2, 3)),  # runs cut short by the padding, at every level
        ((1, 9, 1, 64), (0, 2)),  # axes of one element
        ((5, 112, 3), (0, 1)),  # 112 = 8 x 14: a level of 8 runs, then one of 14
        ((7, 3), (0,)),  # the batch axis alone
    ],
)
def test_tree_sum_adds_up_every_partial(shape, axes):
    partials = np.random.default_rng(0).normal(size=shape)
    got = _xla._tree_sum(jnp.asarray(partials, jnp.float32), axes)
    want = partials.sum(axis=axes)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)
    # In float64 the tree is exact to rounding, and its order is the same every call.
    exact = _xla._tree_sum(jnp.asarray(partials), axes)
    np.testing.assert_allclose(np.asarray(exact), want, rtol=1e-12, atol=1e-12)
    assert np.asarray(_xla._tree_sum(jnp.asarray(partials), axes)).tobytes() == (
        np.asarray(exact).tobytes()
    )


@pytest.mark.parametrize("case", [*CASES, LARGE], ids=[*map(str, range(len(CASES))), "7x7"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_portable_filter_gradient_as_gpus_compute_it(case, data_format, monkeypatch):
    # The filter gradient GPU platforms compute (operands behind a barrier, the
    # partials added up in a tree), run here in its place: the blocked taps and a
    # large filter's loop over kernel rows both give the reference through it.
    monkeypatch.setattr(_xla, "_GPU_PLATFORMS", ("cpu", "cuda", "rocm"))
    jax.clear_caches()
    cfg = make_cfg(*case)
    (x, f, dy), exact = operands(cfg, data_format, jnp.float64, seed=3)
    ops = three_ops(cfg, data_format, implementation="xla")
    got = run_ops({"backprop_filter": ops["backprop_filter"]}, data_format, x, f, dy)
    want = ref_backprop_filter(exact[0], exact[2], cfg)
    np.testing.assert_allclose(got["backprop_filter"], want, rtol=1e-10, atol=1e-10)
    jax.clear_caches()


def test_filter_gradient_operands_are_read_from_memory_on_gpus_only():
    # On GPU platforms x and dy pass an optimization barrier first, so that XLA:GPU
    # does not compute their producers again in every partial that reads them;
    # the CPU's program has no such barrier. (The tree's own barriers take one
    # array each.)
    x = jnp.ones((2, 9, 9, 3), jnp.float32)

    def filter_gradient(x, dy):
        return jaxgrad.depthwise_conv2d_backprop_filter(
            jnp.sin(x), (3, 3, 3, 1), 2 * dy, (1, 1), "SAME", implementation="xla"
        )

    both = re.compile(r"stablehlo.optimization_barrier %[\w#]+, %[\w#]+ : tensor<2x9x9x3xf32>")
    for platform in ("cuda", "rocm", "cpu"):
        text = lowered_text(filter_gradient, x, x, platform=platform)
        assert bool(both.search(text)) == (platform != "cpu"), platform


def test_filter_gradient_as_gpus_compute_it_differentiates(monkeypatch):
    # Through the barrier, to the second order: the gradient of a loss of the
    # filter gradient is the CPU formulation's, to rounding.
    cfg = make_cfg(*CASES[0])
    (x, _, dy), _ = operands(cfg, "NHWC", jnp.float64, seed=5)
    bpf = three_ops(cfg, "NHWC", implementation="xla")["backprop_filter"]
    grad = jax.jit(jax.grad(lambda x, dy: jnp.sum(jnp.sin(bpf(x, dy))), argnums=(0, 1)))
    on_the_cpu = grad(x, dy)
    monkeypatch.setattr(_xla, "_GPU_PLATFORMS", ("cpu", "cuda", "rocm"))
    jax.clear_caches()
    as_on_gpus = grad(x, dy)
    jax.clear_caches()
    for got, want in zip(as_on_gpus, on_the_cpu, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------
# The portable forward and input gradient on GPU platforms: gathered windows
# ----------------------------------------------------------------------------------


def gpu_reads(cfg, data_format, dtype, seed):
    """The portable forward and input gradient as GPU platforms compute them (their
    windows gathered), run here, and as the CPU computes them; NHWC float64."""
    (x, f, dy), _ = operands(cfg, data_format, dtype, seed=seed)
    ops = three_ops(cfg, data_format, implementation="xla")
    ops = {name: ops[name] for name in ("forward", "backprop_input")}
    jax.clear_caches()
    on_the_cpu = run_ops(ops, data_format, x, f, dy)
    with mock.patch.object(_xla, "_GPU_PLATFORMS", ("cpu", "cuda", "rocm")):
        jax.clear_caches()
        as_on_gpus = run_ops(ops, data_format, x, f, dy)
    jax.clear_caches()
    return as_on_gpus, on_the_cpu


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_portable_windows_as_gpus_read_them(case, data_format):
    # Where XLA:CPU reads windows from a padded copy (the strided input gradient,
    # the NCHW half-precision forward and input gradient), GPUs gather them: the
    # same products in the same order, so the same bits.
    # A half type (float16 and bfloat16 by turns, each in both layouts) and float64.
    cfg = make_cfg(*CASES[case])
    half = (jnp.bfloat16, jnp.float16)[(case + (data_format == "NCHW")) % 2]
    for dtype in (half, jnp.float64):
        as_on_gpus, on_the_cpu = gpu_reads(cfg, data_format, dtype, seed=case)
        for name, want in on_the_cpu.items():
            assert as_on_gpus[name].tobytes() == want.tobytes(), (name, dtype)
    # And the float64 results are the reference's.
    _, exact = operands(cfg, data_format, jnp.float64, seed=case)
    want = references(cfg, *exact)
    for name, got in as_on_gpus.items():
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-10)


def test_portable_windows_are_gathered_for_a_gpu_only():
    # A strided input gradient and an NCHW bfloat16 forward: XLA:CPU's program
    # pads a copy, a GPU's gathers (the pad is in its StableHLO only on the CPU).
    x = jnp.ones((2, 3, 9, 9), jnp.bfloat16)
    f = jnp.ones((3, 3, 3, 1), jnp.bfloat16)
    kw = dict(data_format="NCHW", implementation="xla")

    def forward(x, f):
        return jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", **kw)

    dy = jnp.ones((2, 3, 5, 5), jnp.float32)

    def strided_input_gradient(f, dy):
        return jaxgrad.depthwise_conv2d_backprop_input(
            (2, 3, 9, 9), f.astype(jnp.float32), dy, (2, 2), "SAME", **kw
        )

    for fn, args in ((forward, (x, f)), (strided_input_gradient, (f, dy))):
        for platform in ("cuda", "rocm", "cpu"):
            text = lowered_text(fn, *args, platform=platform)
            assert bool(re.search(r"stablehlo.pad\b", text)) == (platform == "cpu"), platform


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_a_5x5_filter_reads_padded_copies_in_the_cpus_stride_1_gradients_only(strides):
    # On the CPU a 5x5 filter's stride-1 gradients read an isolated padded copy (a
    # barrier keeps it; the filter gradient loops over kernel rows); its forward
    # and its strided gradients read blocks, and a GPU's programs always do.
    cfg = make_cfg((2, 12, 12, 3), (5, 5, 3, 1), strides, (1, 1), "SAME")
    (x, f, dy), _ = operands(cfg, "NHWC", jnp.float32)
    args = {"forward": (x, f), "backprop_input": (f, dy), "backprop_filter": (x, dy)}
    marks = {  # what an isolated copy leaves in each op's program
        "forward": "stablehlo.optimization_barrier",
        "backprop_input": "stablehlo.optimization_barrier",
        "backprop_filter": "stablehlo.while",
    }
    for name, fn in three_ops(cfg, "NHWC", implementation="xla").items():
        for platform in ("cuda", "cpu"):
            padded = platform == "cpu" and strides == (1, 1) and name != "forward"
            text = lowered_text(fn, *args[name], platform=platform)
            assert (marks[name] in text) == padded, (name, platform)


@pytest.mark.parametrize("kernel", [3, 7])  # blocked taps; the loop over kernel rows
def test_portable_filter_gradient_leaves_no_reduction_to_a_gpu(kernel):
    # XLA:GPU autotunes a reduction's tiling per process, and with it the order of the
    # sum: a program for a GPU adds the partials up in elementwise adds alone. The
    # CPU keeps XLA's reduction (its program is unchanged).
    x = jnp.ones((2, 9, 9, 3), jnp.float32)

    def filter_gradient(x, dy):
        return jaxgrad.depthwise_conv2d_backprop_filter(
            x, (kernel, kernel, 3, 1), dy, (1, 1), "SAME", implementation="xla"
        )

    for platform in ("cuda", "rocm", "cpu"):
        text = lowered_text(filter_gradient, x, x, platform=platform)
        assert ("stablehlo.reduce" in text) == (platform == "cpu"), platform


# ----------------------------------------------------------------------------------
# The portable implementation on TPUs: XLA's own convolution
# ----------------------------------------------------------------------------------


def as_on_tpus():
    """Computes the portable implementation here as TPU platforms do."""
    return mock.patch.object(_xla, "_TPU_PLATFORMS", ("cpu", "tpu"))


def multiplier_one(case):
    x_shape, (fh, fw, c, _), *rest = case
    return (x_shape, (fh, fw, c, 1), *rest)


# Every stride, dilation and padding of CASES, with the multiplier of 1 a
# convolution covers on TPUs (_convolution.covers).
TPU_CASES = [*map(multiplier_one, CASES), LARGE]


@pytest.mark.parametrize("case", TPU_CASES, ids=[*map(str, range(len(CASES))), "7x7"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_portable_ops_as_tpus_compute_them(case, data_format):
    # float64: the reference's values. bfloat16: its float32 sums rounded once, as
    # accurate as the CPU's formulation, up to the last bit.
    cfg = make_cfg(*case)
    assert _convolution.covers(configured(cfg, data_format))
    for dtype in (jnp.float64, jnp.bfloat16):
        (x, f, dy), exact = operands(cfg, data_format, dtype, seed=1)
        want = references(cfg, *exact)
        ops = three_ops(cfg, data_format, implementation="xla")
        with as_on_tpus():
            jax.clear_caches()
            on_tpus = run_ops(ops, data_format, x, f, dy)
        jax.clear_caches()
        if dtype == jnp.bfloat16:
            on_the_cpu = run_ops(ops, data_format, x, f, dy)
        for name, got in on_tpus.items():
            if dtype == jnp.float64:
                np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-10)
            else:
                cpu_error = relative_error(on_the_cpu[name], want[name])
                assert relative_error(got, want[name]) <= 1.25 * cpu_error + 1e-6, name


def test_portable_ops_are_a_convolution_on_tpus_only():
    x, f = jnp.ones((2, 9, 9, 3), jnp.bfloat16), jnp.ones((3, 3, 3, 1), jnp.bfloat16)

    def loss(x, f):
        y = jaxgrad.depthwise_conv2d(x, f, (1, 1), "SAME", implementation="xla")
        return (y.astype(jnp.float32) ** 2).sum()

    step = jax.grad(loss, argnums=(0, 1))
    for platform in ("tpu", "cuda", "rocm", "cpu"):
        text = lowered_text(step, x, f, platform=platform)
        # The forward and its two transposes.
        assert text.count("stablehlo.convolution") == 3 * (platform == "tpu"), platform
    # Where XLA:TPU compiled a convolution's filter gradient for minutes (one
    # channel, a multiplier of 2), and an empty batch: the portable program.
    uncovered = [(x[..., :1], f[:, :, :1]), (x, jnp.ones((3, 3, 3, 2), x.dtype)), (x[:0], f)]
    for args in uncovered:
        assert "stablehlo.convolution" not in lowered_text(step, *args, platform="tpu")
