"""`.ci/run` itself: its exit trap (stop the background floor install, remove the copy) keeps the script's status.

Under `set -e` a failing command inside an EXIT trap ends the trap with that command's status: a `kill` of the install
that has already finished turned a run whose every pass passed into exit 1 (CI, 2026-11-29). The trap is read from the
script, so the test follows any edit to it.
"""

import re
import subprocess

from conftest import REPO


def _trap_line():
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if re.match(r"trap .* EXIT$", line)]
    assert len(lines) == 1, f"expected one EXIT trap in .ci/run, found {lines}"
    return lines[0]


def _run(tmp_path, last_command):
    clone_root = tmp_path / "clone"
    (clone_root / "copy").mkdir(parents=True)
    script = "\n".join(
        [
            "set -euo pipefail",
            f"CLONE_ROOT={clone_root}",
            _trap_line(),
            "(true) & FLOOR_INSTALL=$!",
            'wait "$FLOOR_INSTALL"',  # the install has ended: the trap's kill finds nothing
            last_command,
        ]
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    return result.returncode, clone_root.exists()


def test_a_passing_run_exits_0_and_removes_the_copy(tmp_path):
    assert _run(tmp_path, "echo passes") == (0, False)


def test_a_failing_pass_keeps_its_status(tmp_path):
    assert _run(tmp_path, "exit 3") == (3, False)
