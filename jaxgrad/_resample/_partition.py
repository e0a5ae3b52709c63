"""Sharding for resample, and batching for its kernel.

The axes outside the resampled ones (batch and channels, typically) may stay
sharded, and every device resamples its own shard with no collective. The
resampled axes, and any between them, are gathered: a tap reaches across a cut
there.

Under JAX's explicit sharding the op lays its operand out so
(``explicit_specs``), whichever implementation computes, and its result keeps
the operand's cuts where they divide; the kernel runs under ``shard_map``.
Under automatic sharding the kernel, a ``pallas_call`` opaque to XLA's
partitioner, is wrapped in ``custom_partitioning`` instead.
``custom_partitioning`` has no batching rule, so ``custom_vmap`` batches the
kernel through ``pallas_call``'s own rule.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrad import _sharding
from jaxgrad._resample import _pallas, _plan
from jaxgrad._resample._plan import Axis


def _spec(axes: tuple[Axis, ...], transpose: bool, sharding: Any) -> PartitionSpec:
    """The operand's sharding with the resampled axes made whole."""
    spec = tuple(getattr(sharding, "spec", ())) + (None,) * len(axes)
    whole = _plan.resampled_axes(axes, transpose)
    entries = [None if d in whole else spec[d] for d in range(len(axes))]
    return PartitionSpec(*entries)  # type: ignore[no-untyped-call]


def explicit_specs(axes: tuple[Axis, ...], transpose: bool, x: jax.Array) -> Any:
    """Under JAX's explicit sharding, the shardings that the operand and the
    result take: ``x``'s type with the resampled axes whole, then, for the
    result, ``x``'s cuts wherever they divide the result's lengths. ``None``
    under automatic sharding."""
    mesh = _sharding.explicit_mesh((x,))
    if mesh is None:
        return None
    typed = jax.typeof(x).sharding
    lengths = [axis.n_in if transpose else axis.n_out for axis in axes]
    parts = tuple(typed.spec) + (None,) * (len(axes) - len(typed.spec))
    result = PartitionSpec(*_sharding.cuts_that_divide(parts, lengths, mesh))  # type: ignore[no-untyped-call]
    return _spec(axes, transpose, typed), result


def _rule(axes: tuple[Axis, ...], transpose: bool, tables: int) -> tuple[str, dict[str, Any]]:
    """The Shardy rule: an axis outside the resampled ones is one factor of both
    operand and result; a resampled axis is one factor in each, kept whole, as
    are the tables."""
    whole = _plan.resampled_axes(axes, transpose)
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
    """``_pallas.apply`` under ``shard_map`` (explicit sharding), or
    ``custom_partitioning`` and ``custom_vmap``."""
    tables = _pallas.tables(axes, transpose, x.dtype)
    mesh = _sharding.explicit_mesh((x,))
    if mesh is not None:
        spec = _spec(axes, transpose, jax.typeof(x).sharding)
        whole = PartitionSpec()  # type: ignore[no-untyped-call]
        each = functools.partial(_pallas.apply, axes=axes, transpose=transpose, interpret=interpret)
        return _sharding.per_shard(each, mesh, (spec, (whole,) * len(tables)), spec, x, tables)

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
