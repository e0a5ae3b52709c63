"""The runnable examples: what they print. (The training example runs in
tests/test_sharding.py, sharded and not.)"""

from helpers import run_script


def test_quickstart_prints_each_result_beside_its_inputs():
    result = run_script("examples/quickstart.py", timeout=300)
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
