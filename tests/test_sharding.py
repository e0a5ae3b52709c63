"""Every op sharded over 8 CPU devices equals the unsharded result, with no collective
beyond the filter gradient's all-reduce, in the ops' default implementation and their
Pallas kernels; and the training example runs sharded.

JAX fixes its device count at start-up, so each check runs in a subprocess.
"""

import jax.numpy as jnp
import pytest
from helpers import ROOT, as_jax_defaults, needs_kernels, run_script


@pytest.mark.parametrize(
    ("check", "implementation"),
    [
        # One process runs the batch, channel and spatial cuts (their start-up and
        # unsharded results shared).
        ("batch,channel,spatial", "default"),
        ("train_step", "default"),
        # JAX's explicit sharding (sharding in types): batch, channels, spatial
        # and mixed cuts, for the default and the kernels.
        ("explicit", "default"),
        pytest.param("explicit", "pallas", marks=needs_kernels),
        # The depthwise and resample kernels (interpreted on the CPU devices), each on
        # its shard.
        pytest.param("batch,channel,spatial", "pallas", marks=needs_kernels),
    ],
)
def test_sharded(check, implementation):
    args = [] if implementation == "default" else [implementation]
    result = run_script("tests/sharded_checks.py", check, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    for part in check.split(","):  # every check ran to its end
        assert f"ok {part.replace('_', ' ')}" in result.stdout, part


def test_train_example_smoke(tmp_path):
    result = run_script(
        "examples/train.py",
        "--steps",
        "60",
        "--batch-size",
        "8",
        "--image-size",
        "16",
        "--cpu-devices",
        "8",
        "--no-progress",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 x cpu" in result.stdout
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert (tmp_path / "samples.png").stat().st_size > 0


def test_train_example_fails_when_the_loss_does_not_halve(tmp_path, monkeypatch, capsys):
    """A run whose loss does not fall by half says so and exits 1. The script's
    verdict is what is tested, so the model's step stands still here (the real
    step trains in the tests above) and the script runs in this process."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import train
    import unet

    def standing_still(params, opt, noisy, clean):
        return params, opt, jnp.ones((), jnp.float32)

    monkeypatch.setattr(unet, "train_step", standing_still)
    monkeypatch.setattr(unet, "apply", lambda params, noisy: noisy)
    args = ["--steps", "20", "--batch-size", "2", "--image-size", "8", "--no-progress"]
    with as_jax_defaults():
        assert train.main([*args, "--out", str(tmp_path)]) == 1
    assert "FAILED: the loss did not fall by half (1.0000 -> 1.0000)" in capsys.readouterr().out
    assert (tmp_path / "loss.png").stat().st_size > 0
