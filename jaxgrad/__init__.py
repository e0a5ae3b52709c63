"""jaxgrad: differentiable JAX ops whose backward passes are DirectML's and TensorFlow's
documented gradient operators, exact, deterministic and fast.

Only the names below are public; the underscored modules are private and may change.
"""

from jaxgrad._depthwise import depthwise_conv2d as depthwise_conv2d
from jaxgrad._depthwise import (
    depthwise_conv2d_backprop_filter as depthwise_conv2d_backprop_filter,
)
from jaxgrad._depthwise import (
    depthwise_conv2d_backprop_input as depthwise_conv2d_backprop_input,
)
from jaxgrad._relu import relu as relu
from jaxgrad._relu import relu_grad as relu_grad
from jaxgrad._resample import resample as resample
from jaxgrad._resample import resample_grad as resample_grad
from jaxgrad._resample import resize as resize

__version__ = "0.1.0"

__all__ = [
    "depthwise_conv2d",
    "depthwise_conv2d_backprop_filter",
    "depthwise_conv2d_backprop_input",
    "relu",
    "relu_grad",
    "resample",
    "resample_grad",
    "resize",
]
