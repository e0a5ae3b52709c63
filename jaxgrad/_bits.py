"""bfloat16 read as raw 16-bit words and widened to float32 after the read.

XLA:CPU moves a bfloat16 -> float32 convert up through the slices and gathers
that read its input, onto the whole array, and where a loop reads that array in
more places than XLA fuses a producer into (15), it writes the float32 copy out
first: twice the bytes of the input, written and then read back. Reading the
16-bit words instead and widening each read value with a shift keeps the reads at
two bytes per element; where a loop reads the words in more than 15 places, XLA
writes them out instead, a copy of half the size. The shift is exact: a bfloat16
is the top half of a float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def words(x: jax.Array) -> jax.Array:
    """The bit patterns of a 16-bit float array (bfloat16 or float16), as uint16."""
    return lax.bitcast_convert_type(x, jnp.uint16)


def widen(w: jax.Array) -> jax.Array:
    """bfloat16 bit patterns (uint16 or int16) as float32, exactly."""
    return lax.bitcast_convert_type(w.astype(jnp.int32) << 16, jnp.float32)
