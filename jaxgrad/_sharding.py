"""Arrays whose type says how they are sharded: JAX's explicit sharding.

Under a mesh of explicit axes (``jax.make_mesh``'s default, entered with
``jax.set_mesh``) an array's sharding is part of its type, and every operation
must agree with its operands' shardings where XLA's partitioner would otherwise
move data on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax


def typed_spec(value: Any) -> Any:
    """The ``PartitionSpec`` that ``value``'s type shards it by, or ``None`` where its
    type does not shard it (automatic sharding, a replicated array, or a JAX
    without sharding in types)."""
    typeof = getattr(jax, "typeof", None)
    spec = getattr(getattr(typeof(value), "sharding", None), "spec", None) if typeof else None
    return spec if spec is not None and any(part is not None for part in spec) else None


def reshard(value: jax.Array, parts: Sequence[Any]) -> jax.Array:
    """``value`` resharded by the ``PartitionSpec`` of ``parts``, on the current mesh."""
    spec = jax.sharding.PartitionSpec(*parts)  # type: ignore[no-untyped-call]
    resharded: jax.Array = jax.sharding.reshard(value, spec)  # type: ignore[no-untyped-call]
    return resharded
