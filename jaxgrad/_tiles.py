"""An op's output cut into blocks, each computed on its own and joined back in place.

Resample and depthwise both cut their output along some axes: a large interior
whose reads are plain slices, and thin edges that gather. XLA:CPU fuses the
blocks into the concatenations that join them, except along the minor
dimension, so the order of the joins matters; the caller chooses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp


def tile(
    block: Callable[[dict[int, range]], jax.Array],
    cuts: Sequence[tuple[int, Sequence[range]]],
) -> jax.Array:
    """``block(chosen)`` for every combination of one run per cut axis, concatenated
    back in place. ``chosen`` maps each axis to its run; ``cuts`` lists the
    ``(axis, runs)`` pairs, the outermost concatenation first."""

    def join(chosen: dict[int, range], rest: Sequence[tuple[int, Sequence[range]]]) -> jax.Array:
        if not rest:
            return block(chosen)
        (axis, runs), inner = rest[0], rest[1:]
        return jnp.concatenate([join({**chosen, axis: run}, inner) for run in runs], axis=axis)

    return join({}, cuts)
