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
    # Every family; resample, resize and depthwise in both implementations.
    assert any(n[0] == "relu" for n in names)
    for family in ("resample", "resize", "depthwise"):
        assert {n[1] for n in names if n[0] == family} == {"None", "xla", "pallas"}, family
    for _ in range(2):
        assert digests() == first
