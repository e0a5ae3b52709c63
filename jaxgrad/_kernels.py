"""What jaxgrad's Pallas kernels share: Pallas' Triton backend, and lane indices for
masked loads and stores that behave the same compiled and interpreted."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxgrad import _sharding


def _lowering_refused() -> bool:
    """Whether this JAX refuses to lower Pallas' Triton kernels.

    JAX 0.11 deprecates the Triton backend and warns each time a kernel is lowered;
    JAX's way to end a deprecation is to turn that warning into an error, then to
    remove the backend. There is no public API to ask which stage a JAX is at.
    """
    try:
        from jax._src import deprecations

        return bool(deprecations.is_accelerated("jax-pallas-triton"))
    except (ImportError, AttributeError, ValueError):  # not deprecated in this JAX
        return False


try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    AVAILABLE = all(hasattr(plgpu, name) for name in ("load", "store", "CompilerParams"))
    AVAILABLE = AVAILABLE and not _lowering_refused()
except ImportError:  # a JAX without Pallas' Triton backend
    AVAILABLE = False

__all__ = ["AVAILABLE", "lanes", "masked_index", "pl", "plgpu", "varying_as"]


# How a jax.ShapeDtypeStruct says it varies across manual axes: a ManualAxisType
# from JAX 0.10, a set of axis names ("vma") before.
_MANUAL_AXIS_TYPE = "manual_axis_type" in inspect.signature(jax.ShapeDtypeStruct).parameters


def varying_as(out_shape: Any, operands: Sequence[jax.Array]) -> Any:
    """``out_shape`` (a ``jax.ShapeDtypeStruct``, or a tuple of them) typed to vary
    across every manual axis of ``jax.shard_map`` along which an operand varies.

    Inside a ``shard_map`` that checks these types (its default), a
    ``pallas_call``'s results must say how they vary, as JAX's own ops' results
    do; a kernel computes its device's shard from its operands alone, so it
    varies as they do. Outside, ``out_shape`` is returned as it is.
    """
    axes = frozenset().union(*(_sharding.varying(a) for a in operands))
    if not axes:
        return out_shape
    if _MANUAL_AXIS_TYPE:
        manual = next(jax.typeof(a).manual_axis_type for a in operands if _sharding.varying(a))
        kind = {"manual_axis_type": type(manual)(varying=axes)}
    else:
        kind = {"vma": axes}

    def typed(struct: Any) -> Any:
        return jax.ShapeDtypeStruct(struct.shape, struct.dtype, **kind)  # type: ignore[no-untyped-call]

    return tuple(map(typed, out_shape)) if isinstance(out_shape, tuple) else typed(out_shape)


def lanes(block: Any, size: int) -> jax.Array:
    """The ``size`` consecutive indices of block ``block``."""
    indices: jax.Array = block * size + jnp.arange(size, dtype=jnp.int32)
    return indices


def masked_index(lanes: jax.Array, size: int, *, interpret: bool, store: bool = False) -> jax.Array:
    """``lanes`` as indices into an axis of ``size``, for a masked access.

    On the GPU a masked lane touches no memory, and indices left as an ``arange``
    plus an offset let Triton vectorize the access. Interpret mode gathers and
    scatters for real: a load's masked lanes are clamped into the array, and a
    store's point one past its end, where the scatter drops them (clamped, they
    would overwrite the lane that owns that element).
    """
    if not interpret:
        return lanes
    if store:
        return jnp.where(lanes < size, lanes, size)
    return jnp.clip(lanes, 0, size - 1)
