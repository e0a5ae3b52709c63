"""Sharding for the depthwise ops, and batching for their kernels.

With the batch or the channels sharded, every device convolves its own shard,
and the only collective is the filter gradient's sum over a sharded batch (one
all-reduce of float32 partials, rounded once). Spatial axes are gathered: a
window reaches across a spatial cut.

Under JAX's explicit sharding the ops lay their operands out so
(``explicit_specs``), whichever implementation computes, and their results keep
the input's spatial cuts where they divide; the kernels run under
``shard_map``. Under automatic sharding a kernel, a ``pallas_call`` opaque
to XLA's partitioner (which would gather a sharded operand onto every device),
is wrapped in ``custom_partitioning`` instead. ``custom_partitioning`` has no
batching rule, so ``custom_vmap`` batches the kernels through ``pallas_call``'s
own rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrad import _checks, _sharding
from jaxgrad._depthwise import _pallas
from jaxgrad._depthwise._plan import Conv

Kernel = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class _Split:
    """The mesh axes that cut the batch and the channels; () for none."""

    batch: tuple[str, ...]
    channels: tuple[str, ...]

    def activation(self, conv: Conv) -> Any:
        batch, channels = self.batch or None, self.channels or None
        return P(batch, channels, None, None) if conv.nchw else P(batch, None, None, channels)

    def filter(self) -> Any:
        return P(None, None, self.channels or None, None)

    def local(self, conv: Conv, mesh: Any) -> Conv:
        return dataclasses.replace(
            conv,
            batch=conv.batch // _size(mesh, self.batch),
            channels=conv.channels // _size(mesh, self.channels),
        )


def P(*axes: Any) -> Any:  # PartitionSpec under its usual short name, typed
    return PartitionSpec(*axes)  # type: ignore[no-untyped-call]


def _size(mesh: Any, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _split(conv: Conv, mesh: Any, sharding: Any) -> _Split:
    """How an activation's sharding cuts batch and channels; a cut that does not
    divide its axis evenly is dropped (that axis is gathered instead)."""
    spec = tuple(getattr(sharding, "spec", ())) + (None,) * 4
    batch, channels = _axes(spec[0]), _axes(spec[1 if conv.nchw else 3])
    if conv.batch % _size(mesh, batch):
        batch = ()
    if conv.channels % _size(mesh, channels):
        channels = ()
    return _Split(batch, channels)


def _rule(conv: Conv, operands: str, result: str) -> tuple[str, dict[str, Any]]:
    """The Shardy rule: batch ``n`` and channels ``c`` may be sharded; every
    spatial factor and the multiplier stay whole."""
    x = "n c h w" if conv.nchw else "n h w c"
    y = "n (c m) p q" if conv.nchw else "n p q (c m)"
    if conv.multiplier == 1:
        y = y.replace("(c m)", "c")
    names = {"x": x, "y": y, "f": "i j c m"}
    rule = ", ".join(names[o] for o in operands) + " -> " + names[result]
    # Shardy numbers the factors in order of first use and wants them so listed.
    factors = list(dict.fromkeys(re.findall(r"\w+", rule)))
    whole = tuple(f for f in factors if f in "hwpqijm")
    extra: dict[str, Any] = {"need_replication_factors": whole}
    if "n" not in names[result]:
        extra["reduction_factors"] = ("n",)
    return rule, extra


def _lead(operands: str) -> int:
    """The operand whose cuts of batch and channels the others follow: the first
    activation among them."""
    return operands.index("x") if "x" in operands else operands.index("y")


def _spec(split: _Split, conv: Conv, role: str) -> Any:
    return split.filter() if role == "f" else split.activation(conv)


def _specs(split: _Split, conv: Conv, roles: str) -> list[Any]:
    return [_spec(split, conv, role) for role in roles]


def _typed_split(conv: Conv, operands: str, args: tuple[jax.Array, ...]) -> Any:
    """Under explicit sharding, its mesh and how the first activation's type cuts
    batch and channels; ``None`` under automatic sharding."""
    mesh = _sharding.explicit_mesh(args)
    if mesh is None:
        return None
    return mesh, _split(conv, mesh, jax.typeof(args[_lead(operands)]).sharding)


def explicit_specs(conv: Conv, operands: str, result: str, args: tuple[jax.Array, ...]) -> Any:
    """Under JAX's explicit sharding, the shardings the operands and the result
    take (``PartitionSpec``s, in the order of ``operands + result``); ``None``
    under automatic sharding.

    Batch and channels keep the cuts of the first activation's type where they
    divide the axis, and the filter is cut as the channels are. The operands'
    spatial axes are whole (a window reaches across a spatial cut), and both
    implementations compute on arrays so laid out; an activation result then
    takes back the first activation's spatial cuts where they divide its own
    spatial lengths, as ``lax.conv_general_dilated``'s result does.
    """
    typed = _typed_split(conv, operands, args)
    if typed is None:
        return None
    mesh, split = typed
    lead = tuple(jax.typeof(args[_lead(operands)]).sharding.spec) + (None,) * 4
    spatial = (2, 3) if conv.nchw else (1, 2)

    spec = _spec(split, conv, result)
    if result != "f":
        parts = [lead[d] if d in spatial else part for d, part in enumerate(spec)]
        spec = P(*_sharding.cuts_that_divide(parts, conv.shape_of(result), mesh))
    return [*_specs(split, conv, operands), spec]


def _per_device(
    kernel: Kernel, conv: Conv, split: _Split, mesh: Any, result: str, interpret: bool
) -> Kernel:
    """The kernel on one device's shards of arrays cut by ``split``."""
    local = split.local(conv, mesh)
    if result != "f" or not split.batch:
        return lambda *args: kernel(*args, local, interpret=interpret)

    def summed(*args: jax.Array) -> Any:
        # The filter gradient: each device's float32 sum, then one all-reduce,
        # then one rounding (to the input's dtype, the first operand's).
        dtype = args[0].dtype
        own = kernel(*args, local, interpret=interpret, dtype=_checks.compute_dtype(dtype))
        return lax.psum(own, split.batch).astype(dtype)  # type: ignore[no-untyped-call]

    return summed


def _partitioned(kernel: Kernel, operands: str, result: str) -> Any:
    """``kernel(*args, conv, interpret)`` under ``custom_partitioning``: XLA's
    partitioner (automatic sharding) runs it on each device's shards."""
    lead = _lead(operands)

    def shardings(split: _Split, conv: Conv, mesh: Any, roles: str) -> list[Any]:
        return [NamedSharding(mesh, spec) for spec in _specs(split, conv, roles)]

    def out_sharding(split: _Split, conv: Conv, mesh: Any) -> Any:
        return NamedSharding(mesh, _spec(split, conv, result))

    def partition(conv: Conv, interpret: bool, mesh: Any, arg_shapes: Any, result_shape: Any):  # type: ignore[no-untyped-def]
        del result_shape
        split = _split(conv, mesh, arg_shapes[lead].sharding)
        arg_shardings = tuple(shardings(split, conv, mesh, operands))
        lower = _per_device(kernel, conv, split, mesh, result, interpret)
        return mesh, lower, out_sharding(split, conv, mesh), arg_shardings

    def infer(conv: Conv, interpret: bool, mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        del interpret, result_shape
        split = _split(conv, mesh, arg_shapes[lead].sharding)
        return out_sharding(split, conv, mesh)

    static = (len(operands), len(operands) + 1)

    @functools.partial(custom_partitioning, static_argnums=static)
    def call(*args: Any) -> Any:
        *arrays, conv, interpret = args
        return kernel(*arrays, conv, interpret=interpret)

    call.def_partition(  # type: ignore[no-untyped-call]
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=lambda conv, interpret, mesh, args, outs: _rule(conv, operands, result),
    )
    return call


def _wrapped(kernel: Kernel, operands: str, result: str) -> Kernel:
    """``kernel`` for every way JAX may call it.

    - Explicit sharding: ``shard_map`` over the arrays' types, laid out by
      ``explicit_specs`` (the op has resharded them so).
    - Automatic sharding: ``custom_partitioning``.
    - ``vmap``: ``custom_partitioning`` has no batching rule, so ``custom_vmap``
      batches the kernel through ``pallas_call``'s own rule.
    """
    call = _partitioned(kernel, operands, result)

    def run(*args: jax.Array, conv: Conv, interpret: bool) -> Any:
        typed = _typed_split(conv, operands, args)
        if typed is not None:
            mesh, split = typed
            per_device = _per_device(kernel, conv, split, mesh, result, interpret)
            in_specs = _specs(split, conv, operands)
            out_spec = _spec(split, conv, result)
            return _sharding.per_shard(per_device, mesh, in_specs, out_spec, *args)

        @jax.custom_batching.custom_vmap
        def once(*args: jax.Array) -> Any:
            return call(*args, conv, interpret)

        @once.def_vmap
        def _(axis_size: int, in_batched: list[bool], *args: jax.Array) -> Any:
            del axis_size
            axes = tuple(0 if batched else None for batched in in_batched)
            each = functools.partial(kernel, conv=conv, interpret=interpret)
            return jax.vmap(each, in_axes=axes)(*args), True

        return once(*args)

    return run


forward = _wrapped(_pallas.forward, "xf", "y")
input_gradient = _wrapped(_pallas.input_gradient, "fy", "x")
filter_gradient = _wrapped(_pallas.filter_gradient, "xy", "f")
