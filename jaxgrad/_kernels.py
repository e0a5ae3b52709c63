"""What jaxgrad's Pallas kernels share: Pallas' Triton backend, lane indices for
masked loads and stores that behave the same compiled and interpreted, and runs of
columns read from aligned vectors."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

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

__all__ = [
    "AVAILABLE",
    "aligned_run",
    "fewer_loads_aligned",
    "fori_loop",
    "lanes",
    "masked_index",
    "pl",
    "plgpu",
    "row_aligned",
    "shift_groups",
    "thread_columns",
    "varying_as",
]


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


def fori_loop(lower: Any, upper: Any, body: Callable[[jax.Array, Any], Any], init: Any) -> Any:
    """``lax.fori_loop(lower, upper, body, init)`` with an int32 index, for a kernel.

    A loop over static bounds hands its body a weakly typed index, and arithmetic
    on it with Python ints stays weakly typed. Pallas' Triton lowering gives a weakly
    typed constant in a ``select`` the predicate's type, a bool, and
    ``jnp.remainder`` selects its divisor: ``index % n`` then fails to lower for a
    GPU, where interpret mode runs it. An int32 index lowers, and is what the
    kernels' other indices are, whether or not 64-bit types are enabled.
    """

    def typed_body(index: jax.Array, carry: Any) -> Any:
        return body(jnp.asarray(index, jnp.int32), carry)

    return lax.fori_loop(lower, upper, typed_body, init)


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


# ------------------------------------------------------------------------------------
# Runs of columns that start off a vector's alignment
# ------------------------------------------------------------------------------------
#
# Triton loads a run of consecutive elements in vectors (of up to 16 bytes a thread)
# only where the run starts on a vector's alignment: a window one column to the
# left, say, is loaded an element at a time. A tile gives each thread a group of
# ``g`` consecutive columns (``thread_columns``), so such a run can be read from the
# aligned column under it in vectors, and each group moved into place in the
# thread's registers, taking in the few columns of the neighbouring group that it
# reads an element at a time (``aligned_run``).


def thread_columns(elements: int, columns: int, warps: int, dtype: Any) -> int:
    """The consecutive columns one thread holds of a tile of ``elements`` whose
    minor axis in memory has ``columns``, in ``dtype``, on ``warps`` warps, as
    Triton lays it out: a vector of 16 bytes, or the tile's share of a thread
    where that is less."""
    per_thread = elements // (32 * warps)
    return max(1, min(16 // int(jnp.dtype(dtype).itemsize), per_thread, columns))


def row_aligned(group: int, row_length: int) -> int:
    """The columns of a thread's ``group`` (a power of two) that start on a
    vector's alignment in every row of an array whose minor axis holds
    ``row_length`` elements. Row ``r`` starts at element ``r * row_length``, so
    Triton, which proves a vector's alignment from the factors of its offset,
    finds a row start aligned only to the powers of two dividing the length: in
    rows of an odd length it loads every run an element at a time, read from
    aligned columns or not."""
    return math.gcd(group, row_length)


def fewer_loads_aligned(shift: int, group: int) -> bool:
    """Whether a run ``shift`` columns past an aligned column takes fewer loads a
    group of ``group`` read from that column (``aligned_run``: the aligned vector,
    and one element for each column the group takes from its neighbour) than read
    as it is (vectors only as wide as its start's alignment)."""
    q = shift % group
    return 1 + min(q, group - q) < group // math.gcd(q, group)


def aligned_run(
    read: Callable[[jax.Array], jax.Array], block: Any, size: int, shift: int, group: int, axis: int
) -> jax.Array:
    """``read(lanes(block, size) + shift)``, a tile whose ``axis`` runs along those
    columns, read from aligned vectors: from the aligned column ``q`` columns
    before the run's start, each group of ``group`` columns moved ``q`` columns
    left, taking in the first ``q`` columns of the next group (or from the one
    ``group - q`` columns after it, moved right, taking in the previous group's
    last columns, where that is fewer). ``read`` masks columns outside the array,
    wherever they are read. The same values as the plain read, in fewer loads
    where ``fewer_loads_aligned``."""
    q = shift % group
    left = q <= group // 2
    start = shift - q if left else shift - q + group  # a multiple of the group

    def columns_last(tile: jax.Array) -> jax.Array:
        return jnp.moveaxis(tile, axis, -1)

    aligned = columns_last(read(lanes(block, size) + start))
    groups = aligned.reshape(*aligned.shape[:-1], size // group, group)
    firsts = lanes(block, size // group) * group + start  # each group's first column
    for k in range(q if left else group - q):
        # Left: the next group's kth column; right: the previous group's kth last.
        taken = columns_last(read(firsts + (group + k if left else -1 - k)))
        groups = shift_groups(groups, taken, left=left)
    return jnp.moveaxis(groups.reshape(aligned.shape), -1, axis)


def shift_groups(groups: jax.Array, taken: jax.Array, *, left: bool) -> jax.Array:
    """Each group ``groups[..., :]`` moved one column: left, each column taking the
    next one's value and the last ``taken``; or right, each the previous one's and
    the first ``taken``. Triton has no shift of a tile's elements; this builds one
    from splits and joins of the last axis, which it does in a thread's registers
    where the thread holds the whole group."""
    g = groups.shape[-1]
    if g == 1:
        return taken[..., None]
    halves = jnp.split(groups.reshape(*groups.shape[:-1], g // 2, 2), 2, axis=-1)
    even, odd = (half.reshape(*groups.shape[:-1], g // 2) for half in halves)
    if left:  # column 2i takes 2i + 1, column 2i + 1 takes 2i + 2
        pair = [odd, shift_groups(even, taken, left=True)]
    else:  # column 2i takes 2i - 1, column 2i + 1 takes 2i
        pair = [shift_groups(odd, taken, left=False), even]
    return jnp.stack(pair, axis=-1).reshape(groups.shape)
