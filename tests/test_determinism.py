"""Bitwise reproducibility across fresh processes: every op's forward and gradients,
computed in three new processes, must give the same bytes (a rerun of a training job
sees exactly this). In-process repeats are tested beside each op."""

from concurrent.futures import ThreadPoolExecutor

from helpers import run_script

from jaxgrad import _kernels


def test_every_op_gives_the_same_bytes_in_three_fresh_processes(tmp_path):
    # The three processes run side by side: they share nothing but the machine. Each
    # compiles every program itself, even given a persistent compilation cache
    # (the suite runs with one), which they leave empty, and under XLA's default
    # flags, not the suite's.
    cache = tmp_path / "xla-cache"
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache), "XLA_FLAGS": ""}

    def digests(_: int) -> list[str]:
        result = run_script("tests/determinism_check.py", env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    with ThreadPoolExecutor(3) as pool:
        first, *others = pool.map(digests, range(3))
    assert not cache.exists() or not any(cache.iterdir())
    names = [line.split(" ")[:-1] for line in first]
    # Every family; resample, resize and depthwise in both implementations (on the
    # CPU the default is the "xla" program), the kernels where this JAX runs them.
    implementations = {"xla", "pallas"} if _kernels.AVAILABLE else {"xla"}
    assert any(n[0] == "relu" for n in names)
    for family in ("resample", "resize", "depthwise"):
        assert {n[1] for n in names if n[0] == family} == implementations, family
    for other in others:
        assert other == first
