"""jaxgrad in a minute: the DirectML reference pages' examples, computed by jaxgrad.

python examples/quickstart.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxgrad


def show(title: str, value: jax.Array) -> None:
    print(f"{title}:\n{np.asarray(value)}\n")


def relu_examples() -> None:
    # DirectML ACTIVATION_RELU_GRAD: OutputGradient = (X > 0 ? dY : 0).
    x = jnp.array([[-2.0, 0.0], [3.0, 5.0]], jnp.float32)
    dy = jnp.array([[10.0, 20.0], [30.0, 40.0]], jnp.float32)
    show("relu_grad(x, dy), DirectML's ACTIVATION_RELU_GRAD", jaxgrad.relu_grad(x, dy))

    loss = jax.jit(jax.grad(lambda x: (jaxgrad.relu(x) ** 2).sum()))
    show("jax.jit(jax.grad(sum(relu(x)^2)))", loss(x))


def main() -> None:
    relu_examples()


if __name__ == "__main__":
    main()
