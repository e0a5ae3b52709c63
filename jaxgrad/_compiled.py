"""The ops' compiled cores: each op family's arithmetic, jitted once per static
configuration, and traced once per configuration whoever calls it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax


def core(fun: Callable[..., Any], static_argnums: Sequence[int]) -> Callable[..., Any]:
    """``jax.jit(fun, static_argnums=static_argnums)``, called under its caller's
    abstract mesh, set explicitly.

    The public functions call it, so that an eager call runs one cached program
    instead of dispatching op by op (under an outer ``jax.jit`` it is inlined like
    any nested jit), and so do the VJP rules: each op's backward calls the other
    ops of its set, whose backwards call it again, so a derivative of order ``n``
    would trace the arithmetic about ``3**n`` times (depthwise; ``2**n`` for
    resample); a jit traces each configuration once and reuses it.

    JAX keys its cache of traces by the abstract mesh of the context too, which
    is unset at the top of a trace and set (to the same mesh, an empty one where
    there is none) where JAX replays a traced equation, as differentiating a
    jitted call does. A custom VJP's forward rule then missed the trace of the
    primal it stands for, and a first-order gradient traced the forward's
    arithmetic twice. Set to the mesh it already means, the context gives both
    calls one key; the programs are the same.
    """
    jitted = jax.jit(fun, static_argnums=tuple(static_argnums))
    if not hasattr(jax.sharding, "use_abstract_mesh"):  # a JAX without mesh contexts
        return jitted

    @functools.wraps(fun)
    def call(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(jax.sharding.get_abstract_mesh()):
            return jitted(*args)

    return call
