"""Depthwise conv2d and its two backprops (TensorFlow's DepthwiseConv2dNative family).

- ``_ops``: the public functions and their custom VJPs: what the ops mean.
- ``_plan``: argument checks, output sizes and padding, shared by every implementation.
- ``_xla``: the arithmetic as jnp/lax operations, for every backend.
- ``_convolution``: ``_xla``'s arithmetic on TPUs, as XLA's grouped convolution.
- ``_pallas``: the arithmetic as Pallas kernels, for CUDA GPUs.
"""

from jaxgrad._depthwise._ops import depthwise_conv2d as depthwise_conv2d
from jaxgrad._depthwise._ops import (
    depthwise_conv2d_backprop_filter as depthwise_conv2d_backprop_filter,
)
from jaxgrad._depthwise._ops import (
    depthwise_conv2d_backprop_input as depthwise_conv2d_backprop_input,
)
