"""relu forward + backward on a 64 MiB float32 tensor: jaxgrad vs jax.nn.relu vs the roofline.

    python benchmarks/relu.py

Each implementation computes the forward output and the input gradient for a given
cotangent in one jitted call (jax.vjp), so both move the same bytes: read x and g,
write y and dx, 4 x 64 MiB.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from _harness import Table, finish, interleaved_ms, nbytes, parser, roofline

import jaxgrad


def forward_backward(relu):
    def fn(x, g):
        y, vjp = jax.vjp(relu, x)
        return y, vjp(g)[0]

    return jax.jit(fn)


def main() -> None:
    args = parser(__doc__).parse_args()
    rng = np.random.default_rng(0)
    shape = (16 * 1024 * 1024,)  # 64 MiB of float32
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    g = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    # Forward and backward read x and g and write y and dx.
    floor, floor_args = roofline(nbytes(x, g), nbytes(x, g))
    ms = interleaved_ms(
        {
            "roofline": partial(floor, *floor_args),
            "jax.nn.relu": partial(forward_backward(jax.nn.relu), x, g),
            "jaxgrad": partial(forward_backward(jaxgrad.relu), x, g),
        },
        repeats=args.repeats,
    )
    roof, peer, ours = ms["roofline"], ms["jax.nn.relu"], ms["jaxgrad"]

    table = Table("relu forward + backward, 64 MiB float32", ["jax.nn.relu"])
    case = "relu fwd+bwd [16M] f32"
    table.add(case, "roofline", roof, roof)
    table.add(case, "jax.nn.relu", peer, roof, **{"jax.nn.relu": peer})
    table.add(case, "jaxgrad.relu", ours, roof, **{"jax.nn.relu": peer})
    finish(table, args)


if __name__ == "__main__":
    main()
