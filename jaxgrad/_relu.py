"""ReLU and its gradient: DirectML's ACTIVATION_RELU and ACTIVATION_RELU_GRAD."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jaxgrad import _checks


def relu(x: ArrayLike) -> jax.Array:
    """Rectified linear unit, with ``relu_grad`` as its backward pass.

      relu(x) = max(x, 0)

    NaN stays NaN. The backward pass is DirectML's ACTIVATION_RELU_GRAD: the
    incoming gradient passes where ``x > 0`` and is 0 elsewhere, so at ``x == 0``
    (and ``-0``) the gradient is 0. Only a boolean mask of ``x > 0`` is kept for the
    backward pass, a quarter of a float32 copy of ``x``.

    ``relu`` is a ``jax.custom_vjp`` function: reverse mode (``jax.grad``,
    ``jax.vjp``, ``jax.jacrev``) works to any order, forward mode (``jax.jvp``,
    ``jax.jacfwd``) raises.

    Args:
      x: array of any shape (0-d included) with dtype float16, bfloat16, float32 or
        float64.

    Returns:
      ``max(x, 0)``, with the shape and dtype of ``x``.

    Raises:
      TypeError: ``x`` is not an array, or its dtype is not floating.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxgrad
      >>> x = jnp.array([-1.0, 0.0, 2.0], dtype=jnp.float32)
      >>> jaxgrad.relu(x)
      Array([0., 0., 2.], dtype=float32)
      >>> jax.grad(lambda x: jaxgrad.relu(x).sum())(x)
      Array([0., 0., 1.], dtype=float32)

    References:
      DirectML, ``DML_ACTIVATION_RELU_OPERATOR_DESC``.
    """
    return _relu(_checks.floating_array("relu", "x", x))


def relu_grad(x: ArrayLike, dy: ArrayLike) -> jax.Array:
    """The gradient of ``relu``: ``dy`` where ``x > 0``, else 0.

      relu_grad(x, dy) = dy if x > 0 else 0      (elementwise)

    ``x`` equal to 0, -0 or NaN gives 0; a NaN in ``dy`` passes through where
    ``x > 0``. There is no broadcasting: as in DirectML, ``x`` and ``dy`` must have
    the same shape and dtype.

    ``relu_grad`` is differentiable: with respect to ``dy`` its VJP is
    ``relu_grad(x, c)``, with respect to ``x`` it is zero, so second-order
    gradients through ``relu`` work.

    Args:
      x: the input of the forward ``relu``; any shape, dtype float16, bfloat16,
        float32 or float64.
      dy: the gradient flowing into ``relu``'s output; same shape and dtype as ``x``.

    Returns:
      The gradient with respect to ``x``, with the shape and dtype of ``x``.

    Raises:
      TypeError: an argument is not an array, a dtype is not floating, or the two
        dtypes differ.
      ValueError: the shapes of ``x`` and ``dy`` differ.

    Examples:
      The example of DirectML's ACTIVATION_RELU_GRAD page:

      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.array([-2.0, 0.0, 3.0, 5.0], dtype=jnp.float32)
      >>> dy = jnp.array([10.0, 20.0, 30.0, 40.0], dtype=jnp.float32)
      >>> jaxgrad.relu_grad(x, dy)
      Array([ 0.,  0., 30., 40.], dtype=float32)

    References:
      DirectML, ``DML_ACTIVATION_RELU_GRAD_OPERATOR_DESC``.
    """
    x = _checks.floating_array("relu_grad", "x", x)
    dy = _checks.floating_array("relu_grad", "dy", dy)
    if x.dtype != dy.dtype:
        raise TypeError(f"relu_grad: dy must have the dtype of x ({x.dtype}), got {dy.dtype}")
    if x.shape != dy.shape:
        raise ValueError(f"relu_grad: dy must have the shape of x ({x.shape}), got {dy.shape}")
    return _masked(x > 0, dy)


def _masked(positive: jax.Array, dy: jax.Array) -> jax.Array:
    # Plain autodiff of this select is already the VJP relu_grad needs: the
    # cotangent for dy is relu_grad(x, c) and the mask, a comparison, gets none.
    return jnp.where(positive, dy, jnp.zeros((), dy.dtype))


@jax.custom_vjp
def _relu(x: jax.Array) -> jax.Array:
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def _relu_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _relu(x), x > 0


def _relu_bwd(positive: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (_masked(positive, g),)


_relu.defvjp(_relu_fwd, _relu_bwd)
