"""Depthwise conv2d and its two backprops: TensorFlow's DepthwiseConv2dNative,
DepthwiseConv2dNativeBackpropInput and DepthwiseConv2dNativeBackpropFilter.

This module holds what the ops mean: the public functions, their argument checks
(through ``_plan``) and the custom VJPs that make the set closed under
``jax.grad``. The arithmetic comes from an implementation chosen per backend:
``_xla`` (jnp/lax, every backend) or ``_pallas`` (kernels for CUDA GPUs).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.typing import ArrayLike

from jaxgrad import _checks, _compiled, _implementation, _sharding
from jaxgrad._depthwise import _pallas, _partition, _xla
from jaxgrad._depthwise._plan import (
    Conv,
    check_out_backprop,
    check_rank,
    check_sizes,
    configure,
    same_dtype,
)

# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def depthwise_conv2d(
    input: ArrayLike,
    filter: ArrayLike,
    strides: Sequence[int],
    padding: str,
    *,
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
    explicit_paddings: Sequence[int] = (),
    implementation: str | None = None,
) -> jax.Array:
    """Depthwise 2-D convolution, with TensorFlow's two backprops as its gradient.

    With filter ``[fh, fw, C, M]`` (``M`` the depth multiplier), output channel
    ``k * M + q`` convolves input channel ``k`` with ``filter[:, :, k, q]``::

      out[b, i, j, k*M + q] = sum over (di, dj) of
          x[b, i*sh - top + di*dh, j*sw - left + dj*dw, k] * filter[di, dj, k, q]

    reads outside the input being 0 (shown for NHWC). Per spatial axis with input
    ``n``, filter ``k``, stride ``s``, dilation ``d`` and ``e = (k - 1) * d + 1``:
    VALID gives ``floor((n - e + s) / s)`` outputs; SAME gives ``ceil(n / s)`` with
    ``max(0, (out - 1) * s + e - n)`` padding, half before and the odd pixel
    after; EXPLICIT gives ``floor((n + before + after - e + s) / s)``.

    The backward pass is ``depthwise_conv2d_backprop_input`` and
    ``depthwise_conv2d_backprop_filter``. A ``jax.custom_vjp`` function: reverse
    mode works to any order, forward mode raises. float16 and bfloat16 accumulate
    in float32 and round once.

    Args:
      input: 4-D ``[N, H, W, C]`` (NHWC) or ``[N, C, H, W]`` (NCHW), floating.
      filter: ``[fh, fw, C, M]``, the dtype of ``input``.
      strides: the window's stride, 4 ints in ``data_format`` order with batch and
        channel entries 1 (TensorFlow's form), or 2 ints (height, width). Unequal
        height and width strides are supported.
      padding: ``"SAME"`` (output ``ceil(n / s)``, the odd padding pixel at the
        bottom/right), ``"VALID"`` (no padding) or ``"EXPLICIT"``.
      data_format: ``"NHWC"`` or ``"NCHW"``.
      dilations: the filter's dilation, in the same two forms as ``strides``.
        Dilations together with strides are supported.
      explicit_paddings: with ``padding="EXPLICIT"``, 8 non-negative ints: a
        (before, after) pair per dimension in ``data_format`` order, zero for batch
        and channels.
      implementation: which arithmetic computes the op, as in
        ``jax.nn.dot_product_attention``: ``None`` (default) picks per backend, Pallas
        kernels on CUDA GPUs of compute capability 8.0 and newer for float16, bfloat16
        and float32 and the jnp/lax composition elsewhere; ``"xla"`` is the jnp/lax
        composition on every backend; ``"pallas"`` is the kernels, compiled on a CUDA
        GPU and interpreted on the CPU (slow: for tests). All give the same results up
        to float rounding, each bitwise reproducible.

    Returns:
      ``[N, out_h, out_w, C * M]`` (NHWC) or ``[N, C * M, out_h, out_w]`` (NCHW),
      the dtype of ``input``.

    Raises:
      TypeError: an argument is not an array, not floating, or the dtypes differ;
        a length other than the batch is symbolic (``jax.export``).
      ValueError: a rank is not 4; the channels of input and filter differ; an
        output size is negative; a bad padding, data_format, strides,
        dilations, explicit_paddings or implementation; ``"pallas"`` asked for
        where it cannot run (a backend other than CPU and CUDA, a JAX without
        Pallas' Triton backend, or a symbolic batch).

    Examples:
      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.arange(16, dtype=jnp.float32).reshape(1, 4, 4, 1)
      >>> f = jnp.ones((3, 3, 1, 1), jnp.float32)
      >>> jaxgrad.depthwise_conv2d(x, f, (1, 1), "VALID")[0, :, :, 0]
      Array([[45., 54.],
             [81., 90.]], dtype=float32)

    References:
      TensorFlow, ``tf.raw_ops.DepthwiseConv2dNative``.
    """
    op = "depthwise_conv2d"
    x = _checks.floating_array(op, "input", input)
    f = same_dtype(op, x, "filter", filter)
    check_rank(op, "input", x.shape)
    check_rank(op, "filter", f.shape, batched=False)
    conv = configure(
        op, x.shape, f.shape, strides, padding, data_format, dilations, explicit_paddings
    )
    return _compiled_conv(x, f, conv, _implementation.check(op, implementation))  # type: ignore[no-any-return]


def depthwise_conv2d_backprop_input(
    input_sizes: Sequence[int],
    filter: ArrayLike,
    out_backprop: ArrayLike,
    strides: Sequence[int],
    padding: str,
    *,
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
    explicit_paddings: Sequence[int] = (),
    implementation: str | None = None,
) -> jax.Array:
    """The gradient of ``depthwise_conv2d`` with respect to its input.

    The exact adjoint of the forward sum in ``x``: each output gradient flows back
    through every tap to the input pixel that tap read, and contributions to
    padding are dropped::

      dx[b, p, r, k] = sum over (i, j, di, dj, q) with p = i*sh - top + di*dh and
          r = j*sw - left + dj*dw of out_backprop[b, i, j, k*M + q] * filter[di, dj, k, q]

    Each residue class of input pixels modulo the stride is computed as a
    fixed-order sum over the taps that reach it (no scatter), so the result is
    bitwise reproducible. Differentiable: the VJP with respect
    to ``filter`` is ``depthwise_conv2d_backprop_filter(c, filter.shape,
    out_backprop)`` and with respect to ``out_backprop`` is
    ``depthwise_conv2d(c, filter)``.

    Args:
      input_sizes: the forward input's shape, 4 non-negative ints in
        ``data_format`` order.
      filter: ``[fh, fw, C, M]``, floating.
      out_backprop: the gradient of the forward output, ``[N, out_h, out_w, C*M]``
        (NHWC) or ``[N, C*M, out_h, out_w]`` (NCHW), the dtype of ``filter``.
      strides: the window's stride, 4 ints in ``data_format`` order with batch and
        channel entries 1 (TensorFlow's form), or 2 ints (height, width). Unequal
        height and width strides are supported.
      padding: ``"SAME"`` (output ``ceil(n / s)``, the odd padding pixel at the
        bottom/right), ``"VALID"`` (no padding) or ``"EXPLICIT"``.
      data_format: ``"NHWC"`` or ``"NCHW"``.
      dilations: the filter's dilation, in the same two forms as ``strides``.
        Dilations together with strides are supported.
      explicit_paddings: with ``padding="EXPLICIT"``, 8 non-negative ints: a
        (before, after) pair per dimension in ``data_format`` order, zero for batch
        and channels.
      implementation: which arithmetic computes the op, as in
        ``jax.nn.dot_product_attention``: ``None`` (default) picks per backend, Pallas
        kernels on CUDA GPUs of compute capability 8.0 and newer for float16, bfloat16
        and float32 and the jnp/lax composition elsewhere; ``"xla"`` is the jnp/lax
        composition on every backend; ``"pallas"`` is the kernels, compiled on a CUDA
        GPU and interpreted on the CPU (slow: for tests). All give the same results up
        to float rounding, each bitwise reproducible.

    Returns:
      The gradient with respect to the input, shape ``input_sizes``, the dtype of
      ``filter``.

    Raises:
      TypeError: an argument is not an array, not floating, or the dtypes differ;
        a length other than the batch is symbolic (``jax.export``).
      ValueError: as ``depthwise_conv2d``, and ``input_sizes`` that are not 4
        non-negative ints or disagree with the filter, or an ``out_backprop`` whose
        shape differs from the computed output shape.

    Examples:
      >>> import jax.numpy as jnp, jaxgrad
      >>> f = jnp.ones((3, 3, 1, 1), jnp.float32)
      >>> dy = jnp.ones((1, 2, 2, 1), jnp.float32)
      >>> jaxgrad.depthwise_conv2d_backprop_input((1, 4, 4, 1), f, dy, (1, 1), "VALID")[0, :, :, 0]
      Array([[1., 2., 2., 1.],
             [2., 4., 4., 2.],
             [2., 4., 4., 2.],
             [1., 2., 2., 1.]], dtype=float32)

    References:
      TensorFlow, ``tf.raw_ops.DepthwiseConv2dNativeBackpropInput``.
    """
    op = "depthwise_conv2d_backprop_input"
    f = _checks.floating_array(op, "filter", filter)
    dy = same_dtype(op, f, "out_backprop", out_backprop)
    sizes = check_sizes(op, "input_sizes", input_sizes, batched=True)
    check_rank(op, "filter", f.shape, batched=False)
    check_rank(op, "out_backprop", dy.shape)
    conv = configure(
        op, sizes, f.shape, strides, padding, data_format, dilations, explicit_paddings
    )
    check_out_backprop(op, conv, dy.shape)
    return _compiled_backprop_input(f, dy, conv, _implementation.check(op, implementation))  # type: ignore[no-any-return]


def depthwise_conv2d_backprop_filter(
    input: ArrayLike,
    filter_sizes: Sequence[int],
    out_backprop: ArrayLike,
    strides: Sequence[int],
    padding: str,
    *,
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
    explicit_paddings: Sequence[int] = (),
    implementation: str | None = None,
) -> jax.Array:
    """The gradient of ``depthwise_conv2d`` with respect to its filter.

    The exact adjoint of the forward sum in ``filter``::

      df[di, dj, k, q] = sum over (b, i, j) of
          x[b, i*sh - top + di*dh, j*sw - left + dj*dw, k] * out_backprop[b, i, j, k*M + q]

    with reads outside the input being 0. Each tap's sum runs over the batch and
    the output pixels in a fixed order, in float32 for half types. Differentiable:
    the VJP with respect to ``input`` is ``depthwise_conv2d_backprop_input(
    input.shape, c, out_backprop)`` and with respect to ``out_backprop`` is
    ``depthwise_conv2d(input, c)``.

    Args:
      input: the forward input, 4-D in ``data_format`` order, floating.
      filter_sizes: the filter's shape ``[fh, fw, C, M]``, 4 non-negative ints.
      out_backprop: the gradient of the forward output, the dtype of ``input``.
      strides: the window's stride, 4 ints in ``data_format`` order with batch and
        channel entries 1 (TensorFlow's form), or 2 ints (height, width). Unequal
        height and width strides are supported.
      padding: ``"SAME"`` (output ``ceil(n / s)``, the odd padding pixel at the
        bottom/right), ``"VALID"`` (no padding) or ``"EXPLICIT"``.
      data_format: ``"NHWC"`` or ``"NCHW"``.
      dilations: the filter's dilation, in the same two forms as ``strides``.
        Dilations together with strides are supported.
      explicit_paddings: with ``padding="EXPLICIT"``, 8 non-negative ints: a
        (before, after) pair per dimension in ``data_format`` order, zero for batch
        and channels.
      implementation: which arithmetic computes the op, as in
        ``jax.nn.dot_product_attention``: ``None`` (default) picks per backend, Pallas
        kernels on CUDA GPUs of compute capability 8.0 and newer for float16, bfloat16
        and float32 and the jnp/lax composition elsewhere; ``"xla"`` is the jnp/lax
        composition on every backend; ``"pallas"`` is the kernels, compiled on a CUDA
        GPU and interpreted on the CPU (slow: for tests). All give the same results up
        to float rounding, each bitwise reproducible.

    Returns:
      The gradient with respect to the filter, shape ``filter_sizes``, the dtype
      of ``input``.

    Raises:
      TypeError: an argument is not an array, not floating, or the dtypes differ;
        a length other than the batch is symbolic (``jax.export``).
      ValueError: as ``depthwise_conv2d``, and ``filter_sizes`` that are not 4
        non-negative ints or disagree with the input, or an ``out_backprop`` whose
        shape differs from the computed output shape.

    Examples:
      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.arange(16, dtype=jnp.float32).reshape(1, 4, 4, 1)
      >>> dy = jnp.ones((1, 2, 2, 1), jnp.float32)
      >>> jaxgrad.depthwise_conv2d_backprop_filter(x, (3, 3, 1, 1), dy, (1, 1), "VALID")[:, :, 0, 0]
      Array([[10., 14., 18.],
             [26., 30., 34.],
             [42., 46., 50.]], dtype=float32)

    References:
      TensorFlow, ``tf.raw_ops.DepthwiseConv2dNativeBackpropFilter``.
    """
    op = "depthwise_conv2d_backprop_filter"
    x = _checks.floating_array(op, "input", input)
    dy = same_dtype(op, x, "out_backprop", out_backprop)
    sizes = check_sizes(op, "filter_sizes", filter_sizes, batched=False)
    check_rank(op, "input", x.shape)
    check_rank(op, "out_backprop", dy.shape)
    conv = configure(
        op,
        x.shape,
        sizes,
        strides,
        padding,
        data_format,
        dilations,
        explicit_paddings,
        filter_name="filter_sizes",
    )
    check_out_backprop(op, conv, dy.shape)
    return _compiled_backprop_filter(x, dy, conv, _implementation.check(op, implementation))  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------
# The arithmetic, from the chosen implementation
# --------------------------------------------------------------------------------------


def _preferred(conv: Conv, dtype: jax.typing.DTypeLike) -> bool:
    """Whether ``implementation=None`` takes the kernels on a CUDA GPU: every
    configuration, in the dtypes training runs in (float64 stays on "xla")."""
    del conv  # the kernels cover every stride, dilation, padding, layout and multiplier
    return bool(jnp.dtype(dtype) != jnp.float64)


def _run(
    op: str,
    impl: str | None,
    conv: Conv,
    roles: tuple[str, str],
    xla: Callable[..., Any],
    pallas: Callable[..., Any],
    *args: jax.Array,
) -> Any:
    """``op``'s arithmetic on ``args``, from the implementation ``impl`` chooses.

    ``roles`` names the operands and the result (``"xf", "y"``: input and filter
    to output). Under explicit sharding they are laid out as
    ``_partition.explicit_specs`` says, whichever implementation computes.
    """
    operands, produced = roles
    specs = _partition.explicit_specs(conv, operands, produced, args)
    # The mesh some operand's type names: a filter made inside the function names none.
    mesh = _sharding.explicit_mesh(args)
    if specs is not None:
        arg_specs = specs[: len(operands)]
        args = tuple(_sharding.reshard(a, s, mesh) for a, s in zip(args, arg_specs, strict=True))
    if conv.computes_nothing:
        # Empty, or sums of no terms; no implementation sees a case with nothing to
        # compute (a window of the portable arithmetic would reach past the input).
        result = jnp.zeros(conv.shape_of(produced), args[0].dtype)
    else:
        result = _implementation.run(
            op,
            impl,
            args,
            xla=functools.partial(xla, conv=conv),
            pallas=functools.partial(pallas, conv=conv),
            pallas_available=_pallas.AVAILABLE,
            pallas_preferred=_preferred(conv, args[0].dtype),
            pallas_refusal=_pallas.refusal(conv),
        )
    if specs is None:
        return result
    return _sharding.reshard(result, specs[-1], mesh)


# --------------------------------------------------------------------------------------
# Custom VJPs: each op's backward is built from the other two, with the same
# implementation, so the set is closed under differentiation
# --------------------------------------------------------------------------------------


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["operands"], meta_fields=["wanted"]
)
@dataclasses.dataclass(frozen=True)
class _Saved:
    """What an op's backward needs: its two operands, and which of them are
    differentiated (a static field: no array)."""

    operands: tuple[jax.Array, jax.Array]
    wanted: tuple[bool, bool]


def _saved(a: Any, b: Any) -> _Saved:
    """The residuals of a forward rule whose operands come wrapped, as symbolic
    zeros give them, with whether they are perturbed."""
    return _Saved((a.value, b.value), (a.perturbed, b.perturbed))


def _no_cotangent(primal: jax.Array) -> SymbolicZero:
    """A zero cotangent for ``primal`` that costs nothing. Unlike ``None`` it keeps
    a backward's results one pytree whichever operands are differentiated, which
    JAX 0.7 requires of a backward it has traced before (it raised an
    AssertionError on a gradient of one operand after one of both)."""
    return SymbolicZero(jax.typeof(primal).to_tangent_aval())


def _cotangents(saved: _Saved, g: Any, *gradients: Callable[[], jax.Array]) -> tuple[Any, Any]:
    """Each differentiated operand's gradient, ``gradients[i]()``, laid out as the
    operand is; a free zero for the others, and for all where ``g`` is zero.

    Only the gradients asked for are traced: the first layer of a network reads
    data, and its backward computes the filter gradient alone; a Hessian-vector
    product in the input differentiates the input gradient in its cotangent
    alone, which takes a forward and no filter gradient. The ops run jitted
    (``_compiled.core``), so XLA would drop an unused gradient from the program
    anyway, but only after it was traced and lowered."""
    zero = isinstance(g, SymbolicZero)
    a, b = (
        _sharding.like(gradient(), operand) if wanted and not zero else _no_cotangent(operand)
        for operand, wanted, gradient in zip(saved.operands, saved.wanted, gradients, strict=True)
    )
    return a, b


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(x: jax.Array, f: jax.Array, conv: Conv, impl: str | None) -> jax.Array:
    return _run(  # type: ignore[no-any-return]
        "depthwise_conv2d", impl, conv, ("xf", "y"), _xla.forward, _partition.forward, x, f
    )


def _conv_fwd(x: Any, f: Any, conv: Conv, impl: str | None) -> tuple[jax.Array, _Saved]:
    saved = _saved(x, f)
    return _compiled_conv(*saved.operands, conv, impl), saved


def _conv_bwd(conv: Conv, impl: str | None, saved: _Saved, g: Any) -> tuple[Any, Any]:
    x, f = saved.operands
    return _cotangents(
        saved,
        g,
        lambda: _compiled_backprop_input(f, g, conv, impl),
        lambda: _compiled_backprop_filter(x, g, conv, impl),
    )


_conv.defvjp(_conv_fwd, _conv_bwd, symbolic_zeros=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _backprop_input(f: jax.Array, dy: jax.Array, conv: Conv, impl: str | None) -> jax.Array:
    return _run(  # type: ignore[no-any-return]
        "depthwise_conv2d_backprop_input",
        impl,
        conv,
        ("fy", "x"),
        _xla.input_gradient,
        _partition.input_gradient,
        f,
        dy,
    )


def _backprop_input_fwd(f: Any, dy: Any, conv: Conv, impl: str | None) -> tuple[jax.Array, _Saved]:
    saved = _saved(f, dy)
    return _compiled_backprop_input(*saved.operands, conv, impl), saved


def _backprop_input_bwd(conv: Conv, impl: str | None, saved: _Saved, c: Any) -> tuple[Any, Any]:
    f, dy = saved.operands
    return _cotangents(
        saved,
        c,
        lambda: _compiled_backprop_filter(c, dy, conv, impl),
        lambda: _compiled_conv(c, f, conv, impl),
    )


_backprop_input.defvjp(_backprop_input_fwd, _backprop_input_bwd, symbolic_zeros=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _backprop_filter(x: jax.Array, dy: jax.Array, conv: Conv, impl: str | None) -> jax.Array:
    return _run(  # type: ignore[no-any-return]
        "depthwise_conv2d_backprop_filter",
        impl,
        conv,
        ("xy", "f"),
        _xla.filter_gradient,
        _partition.filter_gradient,
        x,
        dy,
    )


def _backprop_filter_fwd(x: Any, dy: Any, conv: Conv, impl: str | None) -> tuple[jax.Array, _Saved]:
    saved = _saved(x, dy)
    return _compiled_backprop_filter(*saved.operands, conv, impl), saved


def _backprop_filter_bwd(conv: Conv, impl: str | None, saved: _Saved, c: Any) -> tuple[Any, Any]:
    x, dy = saved.operands
    return _cotangents(
        saved,
        c,
        lambda: _compiled_backprop_input(c, dy, conv, impl),
        lambda: _compiled_conv(x, c, conv, impl),
    )


_backprop_filter.defvjp(_backprop_filter_fwd, _backprop_filter_bwd, symbolic_zeros=True)

# What the public functions and the VJP rules above call (``_compiled.core``).
_compiled_conv = _compiled.core(_conv, static_argnums=(2, 3))
_compiled_backprop_input = _compiled.core(_backprop_input, static_argnums=(2, 3))
_compiled_backprop_filter = _compiled.core(_backprop_filter, static_argnums=(2, 3))
