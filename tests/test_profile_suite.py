"""benchmarks/profile_suite.py: each test file's time and the CPU of the Python processes its tests start."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import profile_suite  # noqa: E402

SUITE = '''
import subprocess, sys

def test_starts_two():
    for _ in range(2):
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_starts_none():
    assert sum(range(10)) == 45
'''


def test_each_child_process_is_counted_against_the_test_that_started_it(tmp_path):
    (tmp_path / "test_toy.py").write_text(SUITE)
    result = profile_suite.profile([str(tmp_path / "test_toy.py")])
    assert result["returncode"] == 0, result["summary"]
    assert "2 passed" in result["summary"]
    (name, seconds), = result["files"].items()  # as pytest names it (relative to its root)
    assert name.endswith("test_toy.py")
    (test, (processes, cpu)), = result["children"].items()  # the test that starts none has no row
    assert test.endswith("test_toy.py::test_starts_two") and processes == 2
    assert 0 < cpu < seconds
