"""Sharding and batching for the resample kernel.

A ``pallas_call`` is opaque to XLA's partitioner, which would gather a sharded
operand onto every device before the kernel. So the kernel is wrapped in
``custom_partitioning``: the axes outside the resampled ones (batch and channels,
typically) may stay sharded, and every device resamples its own shard with no
collective. The resampled axes, and any between them, are gathered: a tap
reaches across a cut there.

``custom_partitioning`` has no batching rule, so ``custom_vmap`` batches the
kernel through ``pallas_call``'s own rule.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrad._resample import _pallas
from jaxgrad._resample._plan import Axis


def _spec(axes: tuple[Axis, ...], transpose: bool, sharding: Any) -> PartitionSpec:
    """The operand's sharding with the resampled axes made whole."""
    spec = tuple(getattr(sharding, "spec", ())) + (None,) * len(axes)
    whole = _pallas.resampled_axes(axes, transpose)
    entries = [None if d in whole else spec[d] for d in range(len(axes))]
    return PartitionSpec(*entries)  # type: ignore[no-untyped-call]


def _rule(axes: tuple[Axis, ...], transpose: bool, tables: int) -> tuple[str, dict[str, Any]]:
    """The Shardy rule: an axis outside the resampled ones is one factor of both
    operand and result; a resampled axis is one factor in each, kept whole, as
    are the tables."""
    whole = _pallas.resampled_axes(axes, transpose)
    operand = " ".join(f"x{d}" for d in range(len(axes)))
    result = " ".join(f"y{d}" if d in whole else f"x{d}" for d in range(len(axes)))
    table_factors = [(f"t{i}_0", f"t{i}_1") for i in range(tables)]
    operands = ", ".join([operand, *(" ".join(pair) for pair in table_factors)])
    # Shardy numbers the factors in order of first use and wants them so listed.
    kept = (
        *(f"x{d}" for d in whole),
        *(factor for pair in table_factors for factor in pair),
        *(f"y{d}" for d in whole),
    )
    return f"{operands} -> {result}", {"need_replication_factors": kept}


@functools.partial(custom_partitioning, static_argnums=(2, 3, 4))
def _call(
    x: jax.Array,
    tables: tuple[jax.Array, ...],
    axes: tuple[Axis, ...],
    transpose: bool,
    interpret: bool,
) -> jax.Array:
    return _pallas.apply(x, tables, axes, transpose, interpret=interpret)


def _partition(
    axes: tuple[Axis, ...],
    transpose: bool,
    interpret: bool,
    mesh: Any,
    arg_shapes: Any,
    result_shape: Any,
) -> Any:
    del result_shape
    x_shape, table_shapes = arg_shapes
    sharding = NamedSharding(mesh, _spec(axes, transpose, x_shape.sharding))
    whole = NamedSharding(mesh, PartitionSpec())  # type: ignore[no-untyped-call]

    def lower(x: jax.Array, tables: tuple[jax.Array, ...]) -> jax.Array:
        return _pallas.apply(x, tables, axes, transpose, interpret=interpret)

    return mesh, lower, sharding, (sharding, (whole,) * len(table_shapes))


def _infer(
    axes: tuple[Axis, ...],
    transpose: bool,
    interpret: bool,
    mesh: Any,
    arg_shapes: Any,
    result_shape: Any,
) -> Any:
    del interpret, result_shape
    return NamedSharding(mesh, _spec(axes, transpose, arg_shapes[0].sharding))


_call.def_partition(  # type: ignore[no-untyped-call]
    partition=_partition,
    infer_sharding_from_operands=_infer,
    sharding_rule=lambda axes, transpose, interpret, mesh, args, results: _rule(
        axes, transpose, len(args) - 1
    ),
)


def apply(x: jax.Array, axes: tuple[Axis, ...], transpose: bool, *, interpret: bool) -> jax.Array:
    """``_pallas.apply`` under ``custom_partitioning`` and ``custom_vmap``."""
    tables = _pallas.tables(axes, transpose, x.dtype)

    @jax.custom_batching.custom_vmap
    def once(x: jax.Array, tables: tuple[jax.Array, ...]) -> jax.Array:
        return _call(x, tables, axes, transpose, interpret)  # type: ignore[no-any-return]

    @once.def_vmap
    def _(axis_size: int, in_batched: list[Any], x: jax.Array, tables: Any) -> Any:
        del axis_size
        each = functools.partial(_pallas.apply, axes=axes, transpose=transpose, interpret=interpret)
        x_batched, tables_batched = in_batched
        in_axes = (
            0 if x_batched else None,
            jax.tree.map(lambda b: 0 if b else None, tables_batched),
        )
        return jax.vmap(each, in_axes=in_axes)(x, tables), True

    return once(x, tables)  # type: ignore[no-any-return]
