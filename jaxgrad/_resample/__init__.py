"""Resample, its gradient and resize (DirectML's RESAMPLE and RESAMPLE_GRAD family).

- ``_ops``: the public ``resample`` and ``resample_grad``, their argument checks
  and their custom VJP: what the ops mean.
- ``_resize``: ``resize``, ONNX Resize's coordinate conventions on the same core.
- ``_plan``: each axis's sparse matrix as tables of taps, by pattern, shared by
  every implementation.
- ``_xla``: the arithmetic as jnp/lax operations, for every backend.
- ``_pallas``: the arithmetic as one Pallas kernel, for CUDA GPUs; ``_partition``
  keeps it free of collectives under sharding.
"""

from jaxgrad._resample._ops import resample as resample
from jaxgrad._resample._ops import resample_grad as resample_grad
from jaxgrad._resample._resize import resize as resize
