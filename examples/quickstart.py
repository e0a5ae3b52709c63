"""jaxgrad in a minute: the DirectML reference pages' examples, computed by jaxgrad.

python examples/quickstart.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxgrad


def show(title: str, value: jax.Array, **inputs: jax.Array) -> None:
    """Prints the inputs a result came from, then the result."""
    print(f"{title}")
    for name, array in inputs.items():
        print(f"  {name} =\n{_indent(np.asarray(array))}")
    print(f"  result =\n{_indent(np.asarray(value))}\n")


def _indent(a: np.ndarray) -> str:
    return "\n".join("    " + line for line in str(a).splitlines())


def relu_examples() -> None:
    # DirectML ACTIVATION_RELU_GRAD: OutputGradient = (X > 0 ? dY : 0).
    x = jnp.array([[-2.0, 0.0], [3.0, 5.0]], jnp.float32)
    dy = jnp.array([[10.0, 20.0], [30.0, 40.0]], jnp.float32)
    show("relu_grad(x, dy), DirectML's ACTIVATION_RELU_GRAD", jaxgrad.relu_grad(x, dy), x=x, dy=dy)

    loss = jax.jit(jax.grad(lambda x: (jaxgrad.relu(x) ** 2).sum()))
    show("jax.jit(jax.grad(sum(relu(x)^2)))", loss(x), x=x)


def resample_examples() -> None:
    # DirectML RESAMPLE_GRAD1's example: nearest, height x0.5, width x1.5, rounding down.
    x = jnp.array([[[[1, 2], [3, 4]]]], jnp.float32)
    scales = (1, 1, 0.5, 1.5)
    show(
        "resample(x, (1, 1, 0.5, 1.5), rounding='down')",
        jaxgrad.resample(x, scales, rounding="down"),
        x=x,
    )
    dy = jnp.array([[[[4, 5, 6]]]], jnp.float32)
    dx = jaxgrad.resample_grad(dy, x.shape, scales, rounding="down")
    show(
        "resample_grad(dy, x.shape, scales, rounding='down'), DirectML's RESAMPLE_GRAD1", dx, dy=dy
    )
    # The RESAMPLE_GRAD form of the same example: half_up with output offset 0.
    dx = jaxgrad.resample_grad(dy, x.shape, scales, input_pixel_offsets=0.5, output_pixel_offsets=0)
    show("the same with half_up and offsets (0.5, 0): DirectML's RESAMPLE_GRAD form", dx, dy=dy)

    # And the same gradient from jax.grad through the forward op.
    def loss(x):
        return jnp.vdot(jaxgrad.resample(x, scales, rounding="down"), dy)

    show(
        "jax.grad of vdot(resample(x), dy): the same gradient",
        jax.jit(jax.grad(loss))(x),
        x=x,
        dy=dy,
    )
    # PyTorch's F.interpolate(x, size=6, mode="linear", align_corners=False):
    v = jnp.array([0.0, 1.0, 4.0])
    show("resize(v, (6,), mode='linear')", jaxgrad.resize(v, (6,), mode="linear"), v=v)


def depthwise_examples() -> None:
    # TensorFlow's DepthwiseConv2dNativeBackpropInput: a 3x3 all-ones filter, stride 2,
    # SAME, all-ones gradient: each input pixel counts the output windows that read it.
    f = jnp.ones((3, 3, 1, 1), jnp.float32)
    dy = jnp.ones((1, 3, 3, 1), jnp.float32)
    dx = jaxgrad.depthwise_conv2d_backprop_input((1, 5, 5, 1), f, dy, (2, 2), "SAME")
    show(
        "depthwise_conv2d_backprop_input((1, 5, 5, 1), f, dy, 3x3 stride 2 SAME)",
        dx[0, :, :, 0],
        f=f[:, :, 0, 0],
        dy=dy[0, :, :, 0],
    )
    # And jax.grad through the forward op gives the same, plus the filter gradient.
    x = jnp.arange(25, dtype=jnp.float32).reshape(1, 5, 5, 1)

    def loss(x, f):
        return jaxgrad.depthwise_conv2d(x, f, (2, 2), "SAME").sum()

    gx, gf = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, f)
    show(
        "jax.grad of sum(depthwise_conv2d(x, f, stride 2 SAME)) w.r.t. x",
        gx[0, :, :, 0],
        x=x[0, :, :, 0],
        f=f[:, :, 0, 0],
    )
    show("... and w.r.t. f (depthwise_conv2d_backprop_filter)", gf[:, :, 0, 0])


def main() -> None:
    relu_examples()
    resample_examples()
    depthwise_examples()


if __name__ == "__main__":
    main()
