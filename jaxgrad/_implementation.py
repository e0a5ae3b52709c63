"""The seam between an op's meaning and its arithmetic: the ``implementation=`` keyword.

An op family validates its arguments, computes its static plan and wires its
custom VJP once; the arithmetic comes from one of its implementations:

- ``"xla"``: a composition of jnp/lax operations, portable to every backend.
- ``"pallas"``: Pallas kernels, compiled by Triton on CUDA GPUs (compute
  capability 8.0 and newer), and run in Pallas' interpret mode on the CPU (slow:
  for tests).
- ``None``: the kernels on CUDA GPUs of compute capability 8.0 and newer where
  they cover the case, ``"xla"`` everywhere else.

The choice between platforms is made when the program is lowered
(``lax.platform_dependent``), not when it is traced, so one jitted function runs
on whichever backend its arguments live on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax import lax

IMPLEMENTATIONS = ("xla", "pallas")


def check(op: str, value: Any) -> str | None:
    """Validates ``implementation=``: ``None``, ``"xla"`` or ``"pallas"``."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in IMPLEMENTATIONS:
        raise ValueError(f"{op}: implementation must be None, 'xla' or 'pallas', got {value!r}")
    return value


def _backend_platform() -> str:
    """The platform of the default backend: 'cpu', 'cuda', 'rocm', 'tpu', ..."""
    backend = jax.default_backend()
    if backend != "gpu":
        return backend
    version = jax.devices()[0].client.platform_version.lower()
    return "rocm" if "rocm" in version else "cuda"


# XLA compiles Triton kernels for CUDA GPUs of compute capability 8.0 (Ampere)
# and newer only; on older ones (V100, T4) it refuses them when it compiles.
KERNEL_CAPABILITY = (8, 0)


@functools.cache
def _cuda_capability() -> tuple[int, int] | None:
    """The lowest compute capability among this process's CUDA GPUs, as
    ``(major, minor)``; None where it has none."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:  # no CUDA backend
        devices = []
    return min((_capability(device) for device in devices), default=None)


def _capability(device: Any) -> tuple[int, int]:
    major, minor = str(device.compute_capability).split(".")
    return int(major), int(minor)


def _kernels_compile_here() -> bool:
    """Whether this process has CUDA GPUs, all of which XLA compiles the kernels
    for. Without them nothing can run the kernels, and ``None`` traces the
    portable arithmetic alone: no kernel traced for a GPU that cannot compile it,
    or for a platform that is not there, and a CPU program exactly as "xla"."""
    capability = _cuda_capability()
    return capability is not None and capability >= KERNEL_CAPABILITY


def run(
    op: str,
    implementation: str | None,
    args: tuple[jax.Array, ...],
    *,
    xla: Callable[..., Any],
    pallas: Callable[..., Any],
    pallas_available: bool,
    pallas_preferred: bool,
    pallas_refusal: str | None = None,
) -> Any:
    """Computes an op with the chosen implementation: its result, an array or a
    tuple of arrays, as ``xla`` and ``pallas`` return it.

    Args:
      op: the public op's name, for error messages.
      implementation: ``None``, ``"xla"`` or ``"pallas"`` (checked by ``check``).
      args: the arrays the arithmetic takes.
      xla: the portable arithmetic, ``xla(*args)``.
      pallas: the kernels, ``pallas(*args, interpret=...)``.
      pallas_available: whether this JAX has the Pallas backend the kernels need.
      pallas_preferred: whether ``None`` should pick the kernels on a CUDA GPU for
        this case (they cover it and are the faster choice there).
      pallas_refusal: why the kernels cannot compute this case, or None where they
        can: ``None`` then computes it with ``xla``, and ``"pallas"`` raises.
    """
    if implementation == "xla":
        return xla(*args)
    compiled = lambda *a: pallas(*a, interpret=False)  # noqa: E731
    if implementation is None:
        usable = pallas_available and pallas_refusal is None and _kernels_compile_here()
        if not (usable and pallas_preferred):
            return xla(*args)
        return lax.platform_dependent(*args, cuda=compiled, default=xla)
    if pallas_refusal is not None:
        raise ValueError(
            f"{op}: implementation='pallas' cannot compute this case: {pallas_refusal}; "
            "use implementation=None or 'xla'"
        )
    if not pallas_available:
        raise ValueError(
            f"{op}: implementation='pallas' needs Pallas' Triton backend, which this "
            f"JAX ({jax.__version__}) lacks or no longer lowers; use implementation=None "
            "or 'xla'"
        )
    platform = _backend_platform()
    if platform not in ("cpu", "cuda"):
        raise ValueError(
            f"{op}: implementation='pallas' runs on CUDA GPUs (compiled) and on the CPU "
            f"(interpreted), not on {platform!r}; use implementation=None or 'xla'"
        )
    capability = _cuda_capability()
    if platform == "cuda" and capability is not None and capability < KERNEL_CAPABILITY:
        raise ValueError(
            f"{op}: implementation='pallas' needs a CUDA GPU of compute capability 8.0 "
            f"(Ampere) or newer, for which XLA compiles Triton kernels, and this one's is "
            f"{capability[0]}.{capability[1]}; use implementation=None or 'xla'"
        )
    interpreted = lambda *a: pallas(*a, interpret=True)  # noqa: E731
    return lax.platform_dependent(*args, cpu=interpreted, cuda=compiled)
