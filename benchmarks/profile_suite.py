"""Where the test suite's CPU goes: the suite in one pytest process (no xdist), each test file's time, and the CPU of
every Python process a test starts (scripts, `accelerate launch` and its workers, fresh-process loading checks).

A `sitecustomize` module put first on PYTHONPATH records, when each child Python process exits, its CPU time (user +
system) and the test that was running (`PYTEST_CURRENT_TEST`, which children inherit). A process killed by a signal
(the kill-and-resume tests' first runs) or started with an environment of its own records nothing; a worker that
`tests/warm_launch.py` forks records its own CPU since the fork (the forkserver's imports, once per pytest process,
may go unrecorded: it ends after pytest does). Pin the process to one core (`taskset -c 0`) to read the file times as
CPU seconds; docs/testing.md has the figures.

    taskset -c 0 python benchmarks/profile_suite.py                 # the whole suite
    python benchmarks/profile_suite.py tests/test_distributed.py    # any pytest arguments
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RECORDER = '''import atexit, json, os, resource, sys

def _record():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["PROFILE_SUITE_LOG"], "a") as log:
        log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": sys.argv[:3],
                              "cpu": usage.ru_utime + usage.ru_stime}) + "\\n")

if os.environ.get("PYTEST_CURRENT_TEST"):  # a process a test started (pytest itself starts with none)
    atexit.register(_record)
'''
DURATION = re.compile(r"^([\d.]+)s (?:setup|call|teardown)\s+([^\s:]+\.py)::(\S+)")


def profile(pytest_args: list[str]) -> dict:
    """Run pytest with `pytest_args` and return {"files": {file: seconds}, "children": {test: [processes, cpu]},
    "returncode": ...}."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "sitecustomize.py").write_text(RECORDER)
        log = Path(folder, "children.jsonl")
        env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},  # pytest itself records none
               "PROFILE_SUITE_LOG": str(log),
               "PYTHONPATH": os.pathsep.join([folder, str(REPO), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
                               *pytest_args], cwd=REPO, env=env, capture_output=True, text=True)
        files = collections.Counter()
        for line in proc.stdout.splitlines():
            if match := DURATION.match(line):
                files[match.group(2)] += float(match.group(1))
        children = collections.defaultdict(lambda: [0, 0.0])
        for line in log.read_text().splitlines() if log.exists() else []:
            record = json.loads(line)
            test = record["test"].rsplit(" (", 1)[0]
            children[test][0] += 1
            children[test][1] += record["cpu"]
    return {"files": dict(files), "children": dict(children), "returncode": proc.returncode,
            "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]}


def report(result: dict, top: int) -> None:
    total = sum(result["files"].values())
    print(result["summary"])
    print(f"\ntest files: {total:.0f} s in all")
    for name, seconds in sorted(result["files"].items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.1f} s  {100 * seconds / max(total, 1e-9):4.1f}%  {name}")
    processes = sum(n for n, _ in result["children"].values())
    cpu = sum(c for _, c in result["children"].values())
    share = 100 * cpu / max(total, 1e-9)
    print(f"\nchild Python processes: {processes}, {cpu:.0f} s of CPU ({share:.0f}% of the files' time)")
    for test, (n, seconds) in sorted(result["children"].items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{seconds:8.1f} s  {n:3d}  {test}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=25, help="rows of each list")
    parser.add_argument("--json", type=Path, help="also write the whole result here")
    args, pytest_args = parser.parse_known_args(argv)
    result = profile(pytest_args or ["tests"])
    report(result, args.top)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(main()["returncode"])
