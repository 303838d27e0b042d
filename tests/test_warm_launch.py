"""`warm_launch`, the tests' `accelerate launch` with warm workers: the environment its workers get is the one the
real launcher gives (but the port and what only the launcher's own process sets), a worker runs as `python script`
does, and a failed worker ends the launch."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import warm_launch

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
DUMP = textwrap.dedent("""
    import json, os
    with open(f"env-{os.environ['RANK']}.json", "w") as out:
        json.dump(dict(os.environ), out)
""")
FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
         "--fsdp_state_dict_type", "SHARDED_STATE_DICT", "--fsdp_activation_checkpointing", "true"]
# What only the real launch sets: the elastic agent's own settings (its error file and store, the signals it forwards
# (torch >= 2.10), NCCL's error handling), and what imports in the launcher's process put in its environment
# (scikit-learn and joblib set Intel OpenMP's KMP_* when imported, which accelerate 1.13's launcher does)
LAUNCHER_ONLY = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}


def _environments(folder: Path) -> dict:
    found = {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("env-*.json"))}
    for path in folder.glob("env-*.json"):
        path.unlink()
    return found


@pytest.mark.parametrize("launcher", [["--multi_gpu"], FSDP2], ids=["ddp", "fsdp2"])
def test_workers_get_the_environment_of_the_real_launcher(tmp_path, launcher):
    (tmp_path / "dump.py").write_text(DUMP)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    flags = [*launcher, "--mixed_precision", "no", "--dynamo_backend", "no"]
    real = subprocess.run([ACCELERATE, "launch", *flags, "--num_processes", "2", "--num_machines", "1",
                           "--main_process_port", str(warm_launch.free_port()), str(tmp_path / "dump.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert real.returncode == 0, real.stderr[-3000:]
    expected = _environments(tmp_path)
    warm = warm_launch.run(tmp_path / "dump.py", env=env, cwd=tmp_path, timeout=120, processes=2, launcher=flags)
    assert warm.returncode == 0, warm.stderr[-3000:]
    got = _environments(tmp_path)
    assert sorted(got) == sorted(expected) == ["env-0.json", "env-1.json"]
    ignored = (LAUNCHER_ONLY - env.keys()) | {"MASTER_PORT"}  # (this process may have imported scikit-learn)
    for name in expected:
        assert expected[name]["MASTER_PORT"] != got[name]["MASTER_PORT"]  # each launch its own free port
        assert {k: v for k, v in got[name].items() if k not in ignored} == {
            k: v for k, v in expected[name].items() if k not in ignored}
    assert expected["env-0.json"]["ACCELERATE_USE_FSDP" if launcher == FSDP2 else "ACCELERATE_MIXED_PRECISION"]


SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    print(json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                      "rank": os.environ.get("RANK")}), flush=True)
    action = sys.argv[1]
    if action == "message":
        sys.exit("stopped: a message")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "rank1_fails":
        if os.environ["RANK"] == "1":
            print("rank 1 fails", file=sys.stderr)
            sys.exit(3)
        time.sleep(600)
""")


def test_a_worker_runs_as_python_runs_a_script(tmp_path):
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "script.py").write_text(SCRIPT)
    ran = warm_launch.run(folder / "script.py", ["fine", 7], env=dict(os.environ), cwd=tmp_path, timeout=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout) == {"name": "__main__", "argv": [str(folder / "script.py"), "fine", "7"],
                                      "cwd": str(tmp_path), "path0": str(folder), "rank": None}
    message = warm_launch.run(folder / "script.py", ["message"], env=dict(os.environ), cwd=tmp_path, timeout=60)
    assert message.returncode == 1 and message.stderr.strip() == "stopped: a message"
    killed = warm_launch.run(folder / "script.py", ["kill"], env=dict(os.environ), cwd=tmp_path, timeout=60)
    assert killed.returncode == -9
    assert [p.name for p in tmp_path.iterdir()] == ["scripts"]  # nothing of the launcher's is left in the folder


def test_the_first_failed_worker_ends_the_launch(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1"}
    started = time.monotonic()
    result = warm_launch.run(tmp_path / "script.py", ["rank1_fails"], env=env, cwd=tmp_path, timeout=300,
                             processes=2)
    assert result.returncode == 3 and "rank 1 fails" in result.stderr
    assert time.monotonic() - started < warm_launch.GRACE + 30  # rank 0 (asleep for 600 s) was stopped
    assert [json.loads(line)["rank"] for line in result.stdout.splitlines()] == ["0", "1"]  # rank 0's output first
    with pytest.raises(subprocess.TimeoutExpired):
        warm_launch.run(tmp_path / "script.py", ["rank1_fails"], env={**env, "RANK": "0"}, cwd=tmp_path, timeout=3)
