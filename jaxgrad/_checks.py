"""Argument validation shared by every op.

Shapes and parameters are static in JAX, so every check here runs at trace time on
Python values and raises before anything is compiled. Messages follow one pattern:
``"<op>: <argument> <what was expected>, got <what was received>"``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

FLOAT_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)
_FLOAT_NAMES = "float16, bfloat16, float32 or float64"


def as_array(op: str, name: str, value: Any) -> jax.Array:
    """Returns ``value`` as a JAX array; anything that is not array-like is a ``TypeError``."""
    if not isinstance(value, jax.Array | np.ndarray | np.generic | bool | int | float):
        raise TypeError(f"{op}: {name} must be an array, got {type(value).__name__}")
    return jnp.asarray(value)


def check_floating(op: str, name: str, x: jax.Array) -> None:
    """Raises ``TypeError`` unless ``x`` has one of the four floating dtypes."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must have dtype {_FLOAT_NAMES}, got {x.dtype}")


def floating_array(op: str, name: str, value: Any) -> jax.Array:
    """``as_array`` followed by ``check_floating``."""
    x = as_array(op, name, value)
    check_floating(op, name, x)
    return x


def check_concrete_shape(
    op: str, name: str, shape: Sequence[Any], *, symbolic_batch: bool = False
) -> None:
    """Raises ``TypeError`` if ``shape`` has a symbolic length (``jax.export``'s
    shape polymorphism): an op that plans its sums from the lengths needs them.
    With ``symbolic_batch``, the first length (an op's batch) may be symbolic."""
    planned = shape[1:] if symbolic_batch else shape
    if any(is_symbolic(n) for n in planned):
        which = "lengths other than the batch" if symbolic_batch else "lengths"
        raise TypeError(
            f"{op}: {name} must have a concrete shape, got {tuple(shape)}: the op plans "
            f"its sums from the {which}, which jax.export's symbolic dimensions leave "
            "unknown; export with concrete ones"
        )


def is_symbolic(n: Any) -> bool:
    """Whether the length ``n`` is symbolic (``jax.export``'s shape polymorphism)."""
    return bool(export.is_symbolic_dim(n))


def compute_dtype(dtype: Any) -> Any:
    """The dtype arithmetic runs in: half types are computed and accumulated in float32."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def choice(op: str, name: str, value: Any, valid: Sequence[str]) -> str:
    """Checks that ``value`` is one of the strings in ``valid``."""
    if not isinstance(value, str) or value not in valid:
        options = ", ".join(repr(v) for v in valid)
        raise ValueError(f"{op}: {name} must be one of {options}, got {value!r}")
    return value


def check_static(op: str, name: str, value: Any) -> None:
    """Raises ``TypeError`` if ``value``, or an entry of it, is traced.

    Shapes and parameters fix the shape of the program, so they must be known when
    it is traced: under ``jax.jit`` they cannot be arguments of the jitted function.
    """
    entries = value if isinstance(value, Sequence) and not isinstance(value, str) else (value,)
    if any(isinstance(v, jax.core.Tracer) for v in (value, *entries)):
        raise TypeError(
            f"{op}: {name} must be static (concrete Python values, such as numbers or "
            f"x.shape), got a traced value under a JAX transformation; pass it through a "
            f"closure or functools.partial, or mark it with jax.jit's static_argnums"
        )


def is_scalar(value: Any) -> bool:
    """A single number: a Python, NumPy or JAX scalar, or a 0-d array (not a bool)."""
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, int | float | np.integer | np.floating):
        return True
    return isinstance(value, np.ndarray | jax.Array) and value.ndim == 0


def int_tuple(op: str, name: str, value: Any, *, symbolic_first: bool = False) -> tuple[int, ...]:
    """A sequence of Python or NumPy integers as a tuple of ints; with
    ``symbolic_first``, the first may be a symbolic length (a batch)."""
    check_static(op, name, value)
    if isinstance(value, str) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{op}: {name} must be a sequence of ints, got {value!r}")
    values = list(value)
    first = values[:1] if symbolic_first and values and is_symbolic(values[0]) else []
    try:
        return (*first, *(operator.index(v) for v in values[len(first) :]))
    except TypeError:
        raise TypeError(f"{op}: {name} must be a sequence of ints, got {value!r}") from None


def float_per_axis(op: str, name: str, value: Any, rank: int) -> tuple[float, ...]:
    """A scalar or one number per axis, as ``rank`` finite Python floats."""
    check_static(op, name, value)
    if isinstance(value, bool | str):
        raise TypeError(f"{op}: {name} must be a number or a sequence of numbers, got {value!r}")
    if is_scalar(value):
        values: tuple[float, ...] = (float(value),) * rank
    else:
        try:
            values = tuple(float(v) for v in value)
        except TypeError:
            raise TypeError(
                f"{op}: {name} must be a number or a sequence of numbers, got {value!r}"
            ) from None
        if len(values) != rank:
            raise ValueError(
                f"{op}: {name} must have one entry per axis of the input ({rank}), "
                f"got {len(values)}"
            )
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{op}: {name} must be finite, got {values}")
    return values
