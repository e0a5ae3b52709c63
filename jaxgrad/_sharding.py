"""Arrays whose type says how they are sharded: JAX's explicit sharding, and the
manual axes of ``jax.shard_map``.

Under a mesh of explicit axes (``jax.make_mesh``'s default) an array's sharding
is part of its type, and every operation must agree with its operands' shardings
where XLA's partitioner would otherwise move data on its own. The mesh is the
one the types name, with or without ``jax.set_mesh``. Inside ``jax.shard_map``
the type says along which manual axes an array varies from device to device
(``varying``), and a custom VJP's cotangents must say the same as its primals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax


def _typed_sharding(value: Any) -> Any:
    """The sharding in ``value``'s type, if it has one."""
    return getattr(jax.typeof(value), "sharding", None)


def _spec(value: Any) -> Any:
    """The ``PartitionSpec`` of ``value``'s type, if it has one."""
    return getattr(_typed_sharding(value), "spec", None)


def _shards(spec: Any) -> bool:
    return spec is not None and any(part is not None for part in spec)


def typed_spec(value: Any) -> Any:
    """The ``PartitionSpec`` that ``value``'s type shards it by, or ``None`` where its
    type does not shard it (automatic sharding, or a replicated array)."""
    spec = _spec(value)
    return spec if _shards(spec) else None


def explicit_mesh(args: Sequence[Any]) -> Any:
    """The mesh of explicit axes that ``args`` live on: the one their types name,
    else the one ``jax.set_mesh`` entered; ``None`` under automatic sharding."""
    meshes = [getattr(_typed_sharding(a), "mesh", None) for a in args]
    meshes.append(jax.sharding.get_abstract_mesh())
    for mesh in meshes:
        if jax.sharding.AxisType.Explicit in getattr(mesh, "axis_types", ()):
            return mesh
    return None


def cuts_that_divide(parts: Sequence[Any], shape: Sequence[int], mesh: Any) -> tuple[Any, ...]:
    """``parts`` (a ``PartitionSpec``'s entries) with each cut dropped where its mesh
    axes do not divide the length of its axis in ``shape``."""

    def size(part: Any) -> int:
        axes = (part,) if isinstance(part, str) else tuple(part)
        return math.prod(mesh.shape[a] for a in axes)

    return tuple(
        part if part is None or length % size(part) == 0 else None
        for part, length in zip(parts, shape, strict=True)
    )


def reshard(value: jax.Array, parts: Sequence[Any], mesh: Any = None) -> jax.Array:
    """``value`` resharded by the ``PartitionSpec`` of ``parts`` on ``mesh``: by
    default the explicit mesh ``value``'s type names, else the one ``jax.set_mesh``
    entered. The mesh is named, not left to the context, because arrays whose
    types name an explicit mesh need no ``jax.set_mesh`` (``jax.make_mesh`` makes
    explicit axes by default), and neither must jaxgrad's ops on them."""
    mesh = explicit_mesh([value]) if mesh is None else mesh
    spec = jax.sharding.PartitionSpec(*parts)  # type: ignore[no-untyped-call]
    target = spec if mesh is None else jax.sharding.NamedSharding(mesh, spec)
    resharded: jax.Array = jax.sharding.reshard(value, target)  # type: ignore[no-untyped-call]
    return resharded


def varying(value: Any) -> frozenset[str]:
    """The manual mesh axes (inside ``jax.shard_map``) along which ``value``'s type
    says it varies from device to device; empty elsewhere."""
    aval = jax.typeof(value)
    manual = getattr(aval, "manual_axis_type", None)  # JAX 0.10 and later
    return frozenset(getattr(manual, "varying", None) or getattr(aval, "vma", None) or ())


def _as_varying(value: jax.Array, axes: frozenset[str]) -> jax.Array:
    """``value`` typed as varying along ``axes`` too (a cast: no data moves)."""
    names = tuple(sorted(axes))
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        cast: jax.Array = pcast(value, names, to="varying")
    else:  # JAX 0.7, which has pvary only
        cast = jax.lax.pvary(value, names)  # type: ignore[attr-defined]
    return cast


def vary_as(value: jax.Array, *references: jax.Array) -> jax.Array:
    """``value`` typed to vary along every manual axis along which a reference
    varies (a loop's carry that the loop's body computes from them, say)."""
    missing = frozenset().union(*map(varying, references)) - varying(value)
    return _as_varying(value, missing) if missing else value


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Layout:
    """An array's sharding type, kept by a custom VJP for a cotangent, which must
    have its primal's type. A static pytree: it keeps no array alive."""

    spec: Any
    mesh: Any  # the explicit mesh the primal lives on; None under automatic sharding
    varying: frozenset[str] = frozenset()  # its manual axes that vary, in shard_map

    @classmethod
    def of(cls, value: jax.Array) -> Layout:
        return cls(_spec(value), explicit_mesh([value]), varying(value))

    def apply(self, value: jax.Array) -> jax.Array:
        """``value`` resharded to this layout where explicit sharding gives it another.

        Inside ``jax.shard_map``, a cotangent that varies along a manual axis its
        primal does not vary along (the filter gradient of one shard of the batch,
        for a filter every device shares) is summed over that axis, as JAX's own
        gradients are: the primal was used on every device.
        """
        extra = varying(value) - self.varying
        if extra:
            value = jax.lax.psum(value, tuple(sorted(extra)))  # type: ignore[no-untyped-call]
        missing = self.varying - varying(value)
        if missing:
            value = _as_varying(value, missing)
        if not _shards(self.spec) and typed_spec(value) is None:
            return value
        return value if _spec(value) == self.spec else reshard(value, self.spec, self.mesh)


def like(value: jax.Array, reference: jax.Array) -> jax.Array:
    """``value`` with ``reference``'s sharding type (see ``Layout``)."""
    return Layout.of(reference).apply(value)


def per_shard(
    fn: Callable[..., jax.Array],
    mesh: Any,
    in_specs: Sequence[Any],
    out_spec: Any,
    *args: Any,
) -> jax.Array:
    """``fn`` on each device's shards of ``args`` (arrays, or pytrees of them), cut
    as ``in_specs`` say.

    ``fn``'s collectives say what they do (a ``psum`` adds the devices' values),
    and a ``pallas_call`` declares no replication of its result, so the
    replication of the result is not checked.
    """
    mapped = jax.shard_map(
        fn, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_spec, check_vma=False
    )
    result: jax.Array = mapped(*args)
    return result
