"""Bitwise reproducibility across fresh processes: every op's forward and gradients,
computed in three new processes, must give the same bytes (a rerun of a training job
sees exactly this). In-process repeats are tested beside each op."""

from helpers import run_script


def digests() -> list[str]:
    result = run_script("tests/determinism_check.py")
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_every_op_gives_the_same_bytes_in_three_fresh_processes():
    first = digests()
    names = [line.split(" ")[:-1] for line in first]
    # Every family, and the depthwise ops in both implementations.
    assert any(n[0] == "relu" for n in names) and any(n[0] == "resize" for n in names)
    assert any(n[0] == "resample" for n in names)
    assert {n[1] for n in names if n[0] == "depthwise"} == {"None", "xla", "pallas"}
    for _ in range(2):
        assert digests() == first
