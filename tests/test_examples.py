"""The runnable examples: what they print. (The training example runs in
tests/test_sharding.py, sharded and not.)"""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quickstart_prints_each_result_beside_its_inputs():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.strip().split("\n\n")
    assert len(blocks) >= 9
    for block in blocks:
        lines = block.splitlines()
        assert lines[1].lstrip().endswith("=") and "  result =" in lines, block
    # DirectML's RESAMPLE_GRAD1 example: dy [4, 5, 6] gives [[9, 6], [0, 0]].
    grad1 = next(b for b in blocks if "RESAMPLE_GRAD1" in b)
    assert "dy =\n    [[[[4. 5. 6.]]]]" in grad1
    assert "result =\n    [[[[9. 6.]\n       [0. 0.]]]]" in grad1
