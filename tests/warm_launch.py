"""`accelerate launch` for the tests, with workers forked from a warm interpreter instead of started cold.

Every cold Python process a test starts imports torch, transformers and this package before its first step (~9 s of
CPU on this project's 2-core machine, docs/testing.md); a two-process launch pays it three times (the launcher and
two workers). Here a multiprocessing forkserver imports them once per test process (`PRELOAD`), and each worker is a
fork of it: the same imports, already done.

What a worker gets is what `accelerate launch` gives it: the launcher's own argument parser, its validation (the
default config file included) and `prepare_multi_gpu_env` build the environment from the same launcher flags, and
each worker gets the ranks, world size and rendezvous address that torch's elastic agent sets. The script then runs
as `python script.py argv` runs it (`runpy`, `__name__ == "__main__"`, its folder first on `sys.path`, the exit
functions at the end). As with the agent, the first worker that fails ends the launch; the agent stops the others at
once (SIGTERM), here they get `GRACE` seconds to end on their own (ranks often fail on the same check, each saying
why), then are killed. `TORCH_LOGS`, which torch reads when imported, is read again in the worker.

Not covered here, and kept as cold processes elsewhere: the launcher's process itself (`tests/test_training_runs.py::
test_real_script_with_two_processes_finishes_and_writes_one_folder` and `tests/test_distributed.py::
test_launcher_fallbacks_seen_through_the_real_launcher` start the real `accelerate launch`), environment variables
read only when a module is imported (torch's `ATEN_CPU_CAPABILITY`: the tests of kernel sets start cold processes),
and loading in a process that cannot import this package (the remote-code tests).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

# imported once by the forkserver (with this process's sys.path: pytest puts tests/ on it): what the launched scripts
# import, and this module, the workers' entry point
PRELOAD = ["torch", "transformers", "accelerate", "datasets", "modeling_xl", "modeling_xl.training",
           "modeling_xl.finetuning", "warm_launch"]
DDP = ("--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no")  # the tests' plain two-process launch
GRACE = 5.0  # seconds the other workers get once one has failed (a failure often ends every rank at once)


def free_port() -> int:
    """A TCP port free right now, for a launcher's rendezvous (a fixed one fails while anything else holds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def start_processes(function, args: tuple, nprocs: int) -> None:
    """`torch.multiprocessing.spawn(function, args, nprocs)` with the processes forked from the warm forkserver
    (`function` and its module are imported there: a test module's function imports that module)."""
    import torch.multiprocessing

    _context()
    torch.multiprocessing.start_processes(function, args=args, nprocs=nprocs, start_method="forkserver")


def _worker(script: str, argv: list[str], env: dict, cwd: str, stdout: str, stderr: str) -> None:
    """One worker: `python script argv` with `env` in `cwd`, its output in the two files."""
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # what a cold process reads at its start
    if "TORCH_LOGS" in env:  # read when torch is imported, as a cold process would with this environment
        torch._logging._internal._init_logs()
    sys.argv = [script, *argv]
    sys.path[0] = str(Path(script).resolve().parent)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # as an interpreter ending normally does (a forked process skips them)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def launcher_environment(launcher: list[str], processes: int, port: int, script: str, env: dict) -> dict:
    """The environment `accelerate launch <launcher> --num_processes <processes> ... script` gives its workers,
    from the launcher's own parser, validation and `prepare_multi_gpu_env`, with `env` as its own environment."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    with mock.patch.dict(os.environ, env, clear=True):
        args = launch_command_parser().parse_args([*launcher, "--num_processes", str(processes),
                                                   "--num_machines", "1", "--main_process_port", str(port), script])
        args = _validate_launch_command(args)[0]
        if not (args.multi_gpu or args.use_fsdp):
            raise ValueError(f"launcher={launcher!r} does not start a multi-process launch; expected --multi_gpu or "
                             "--use_fsdp (the only launchers emulated here)")
        return prepare_multi_gpu_env(args)


def _rank_environment(base: dict, rank: int, processes: int, port: int) -> dict:
    """What torch's elastic agent adds for worker `rank` of one machine, but its own settings (its error file, its
    store: here rank 0 holds the rendezvous store, the signals it forwards, NCCL's error handling)."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "ROLE_NAME": "default", "WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes),
            "ROLE_WORLD_SIZE": str(processes), "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0"}


def run(script, argv=(), *, env: dict, cwd, timeout: float, processes: int = 1,
        launcher=DDP) -> subprocess.CompletedProcess:
    """`python script argv` (processes 1) or `accelerate launch <launcher> --num_processes <processes> script argv`,
    its workers forked from the warm forkserver. Returns what `subprocess.run(..., capture_output=True, text=True)`
    would: the return code (0, or the first failed worker's; negative: killed by that signal), and the workers'
    output, rank 0's first. Raises `subprocess.TimeoutExpired` after `timeout` seconds (every worker killed)."""
    script, cwd = str(script), str(cwd)
    argv = [str(a) for a in argv]
    if processes == 1:
        environments = [dict(env)]
    else:
        port = free_port()
        base = launcher_environment(list(launcher), processes, port, script, env)
        environments = [_rank_environment(base, rank, processes, port) for rank in range(processes)]
    logs = Path(tempfile.mkdtemp(prefix="warm_launch_"))  # the workers' output, outside the folder the test reads
    workers = [start(script, argv, env=environment, cwd=cwd, stdout=logs / f"{rank}.out", stderr=logs / f"{rank}.err")
               for rank, environment in enumerate(environments)]
    try:
        code = _wait(workers, timeout, [script, *argv])
        outputs = [(Path(logs, f"{rank}.out").read_text(errors="replace"),
                    Path(logs, f"{rank}.err").read_text(errors="replace")) for rank in range(len(workers))]
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            worker.join()
        shutil.rmtree(logs)
    return subprocess.CompletedProcess([script, *argv], code, "".join(out for out, _ in outputs),
                                       "".join(err for _, err in outputs))


def start(script, argv=(), *, env: dict, cwd, stdout, stderr) -> multiprocessing.Process:
    """`python script argv` started from the warm forkserver, its output going to the files `stdout` and `stderr`;
    the process object (`pid`, `is_alive()`, `kill()`, `join()`, `exitcode`: negative when a signal ended it)."""
    for path in (stdout, stderr):  # there even if the process ends before it opens them
        Path(path).write_bytes(b"")
    worker = _context().Process(target=_worker, args=(str(script), [str(a) for a in argv], dict(env), str(cwd),
                                                       str(stdout), str(stderr)))
    worker.start()
    return worker


def _wait(workers, timeout: float, command) -> int:
    """The launch's return code once every worker has ended; the first failure ends the others after GRACE."""
    deadline = time.monotonic() + timeout
    failed_at, code = None, 0
    while any(worker.is_alive() for worker in workers):
        now = time.monotonic()
        if now > deadline:
            for worker in workers:
                worker.kill()
            raise subprocess.TimeoutExpired(command, timeout)
        if code == 0:
            code = next((w.exitcode for w in workers if w.exitcode not in (None, 0)), 0)
            failed_at = now if code else None
        if failed_at is not None and now - failed_at > GRACE:
            for worker in workers:
                worker.kill()
        time.sleep(0.05)
    return code or next((w.exitcode for w in workers if w.exitcode), 0)
