"""Sharding and batching for the depthwise kernels.

A ``pallas_call`` is opaque to XLA's partitioner, which would gather a sharded
operand onto every device before the kernel. So each kernel is wrapped in
``custom_partitioning``: with the batch or the channels sharded, every device
runs the kernel on its own shard, and the only collective is the filter
gradient's sum over a sharded batch (one all-reduce of float32 partials, rounded
once). Spatial axes are gathered: a window reaches across a spatial cut.

``custom_partitioning`` has no batching rule, so ``custom_vmap`` batches the
kernels through ``pallas_call``'s own rule.
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

from jaxgrad import _checks
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


def _partitioned(kernel: Kernel, operands: str, result: str) -> Any:
    """``kernel(a, b, conv, interpret=...)`` under ``custom_partitioning``.

    ``operands`` and ``result`` name the arrays' roles: ``x``/``y`` activations
    (input and output side), ``f`` the filter.
    """
    # The first activation among the operands decides how batch and channels split.
    lead = operands.index("x") if "x" in operands else operands.index("y")

    def specs(split: _Split, conv: Conv) -> list[Any]:
        return [split.filter() if o == "f" else split.activation(conv) for o in operands + result]

    def partition(conv: Conv, interpret: bool, mesh: Any, arg_shapes: Any, result_shape: Any):  # type: ignore[no-untyped-def]
        del result_shape
        split = _split(conv, mesh, arg_shapes[lead].sharding)
        local = split.local(conv, mesh)
        *arg_specs, out_spec = specs(split, conv)
        reduce_batch = result == "f" and split.batch

        def lower(a: jax.Array, b: jax.Array) -> jax.Array:
            if not reduce_batch:
                return kernel(a, b, local, interpret=interpret)
            # Each device's float32 sum, then one all-reduce, then one rounding.
            sums = kernel(a, b, local, interpret=interpret, dtype=_checks.compute_dtype(a.dtype))
            total: jax.Array = lax.psum(sums, split.batch)  # type: ignore[no-untyped-call]
            return total.astype(a.dtype)

        def shard(spec: Any) -> Any:
            return NamedSharding(mesh, spec)

        return mesh, lower, shard(out_spec), tuple(shard(s) for s in arg_specs)

    def infer(conv: Conv, interpret: bool, mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        del interpret, result_shape
        split = _split(conv, mesh, arg_shapes[lead].sharding)
        return NamedSharding(mesh, specs(split, conv)[-1])

    @functools.partial(custom_partitioning, static_argnums=(2, 3))
    def call(a: jax.Array, b: jax.Array, conv: Conv, interpret: bool) -> jax.Array:
        return kernel(a, b, conv, interpret=interpret)

    call.def_partition(  # type: ignore[no-untyped-call]
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=lambda conv, interpret, mesh, args, results: _rule(conv, operands, result),
    )
    return call


def _batched(call: Any, kernel: Kernel) -> Kernel:
    """``call`` under ``custom_vmap``: a vmapped kernel batches through ``pallas_call``."""

    def run(a: jax.Array, b: jax.Array, conv: Conv, *, interpret: bool) -> jax.Array:
        @jax.custom_batching.custom_vmap
        def once(a: jax.Array, b: jax.Array) -> jax.Array:
            return call(a, b, conv, interpret)  # type: ignore[no-any-return]

        @once.def_vmap
        def _(axis_size: int, in_batched: list[bool], a: jax.Array, b: jax.Array) -> Any:
            del axis_size
            axes = tuple(0 if batched else None for batched in in_batched)
            each = functools.partial(kernel, conv=conv, interpret=interpret)
            return jax.vmap(each, in_axes=axes)(a, b), True

        return once(a, b)  # type: ignore[no-any-return]

    return run


forward = _batched(_partitioned(_pallas.forward, "xf", "y"), _pallas.forward)
input_gradient = _batched(_partitioned(_pallas.input_gradient, "fy", "x"), _pallas.input_gradient)
filter_gradient = _batched(
    _partitioned(_pallas.filter_gradient, "xy", "f"), _pallas.filter_gradient
)
