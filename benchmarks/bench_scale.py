#!/usr/bin/env python
"""Scale benchmark: pretraining from a token cache on generated corpora of growing size, 2 processes.

    python benchmarks/bench_scale.py --sizes_gb 0.1 0.5 1 5 --work_dir /data/bench-scale

Per size (corpus from `benchmarks/make_corpus.py`, made once and kept in work_dir):
- cache build: `--token_cache_dir` entry built by one process and `--num_proc` workers, from the text files
  directly (`modeling_xl.data.text_file_build`); its meta.json gives the phases (plan / word counts / ids written),
  and the wall time, CPU seconds and load average around it are recorded. Up to `--datasets_build_max_gb` the
  generic build (corpus loaded through datasets, words counted in one process) runs on the same corpus too: its
  time beside, and whether its train.bin is byte-equal;
- SIGKILL during the build (once it has written its first files), then a rerun: the rebuilt train.bin must equal
  the clean one;
- training with 2 processes (`accelerate launch --multi_gpu --num_processes 2`, CPU/gloo unless a GPU is present) on
  the existing cache: time from launch to the first training step (beside the startup floor: the same launch that
  only imports the stack and starts the process group), peak RSS (VmHWM) and peak anonymous RSS per process
  (sampled every 0.1 s);
- SIGKILL of the training (the launcher and every training process) after its first checkpoint, then
  `--resume_from_checkpoint latest`: the losses after the checkpoint must equal the uninterrupted run's, step for step;
- the in-memory path (no cache) for sizes <= --baseline_max_gb: peak RSS per process, for comparison.
`--build_only` stops after the builds. Prints tables and writes `bench_scale.json` into work_dir.

`--main_command` measures instead what a user gets from the main command on a local corpus, with no cache flag (the
token cache is on by default in a fresh user cache folder, `MODELING_XL_CACHE=<work_dir>/user-cache`):
`accelerate launch --num_processes 2 scripts/pretrain.py --preset tiny --train_file ... --validation_file ...`, three
times per size: the first run (trains its tokenizer, builds the entry), the same command again, and a run that loads
the first run's saved tokenizer (`--tokenizer_name <first output_dir>`). Per run: seconds to the first training step
and the peak RSS (VmHWM) of every process of the run (the training processes, their tokenization workers, every
descendant of the launcher), sampled every 0.1 s.

    python benchmarks/bench_scale.py --main_command --sizes_gb 0.5 1 --work_dir /data/bench-scale --steps 6
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import machine_description, print_table  # noqa: E402

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
BUILD = """
import sys
from modeling_xl.data import cached_corpus
from modeling_xl.training import parse_args
from modeling_xl.training.data_sources import token_cache
if sys.argv[1] == "datasets":  # the generic build: corpus loaded through datasets, counted in one process
    cached_corpus.local_text_files = lambda corpus: None
token_cache(parse_args(sys.argv[2:]))
"""


def data_args(corpus: Path, cache: Path | None, num_proc: int) -> list[str]:
    args = ["--train_file", str(corpus / "train.txt"), "--validation_file", str(corpus / "valid.txt"),
            "--tokenizer_vocab_size", "8000", "--preprocessing_num_workers", str(num_proc)]
    return args + (["--token_cache_dir", str(cache)] if cache is not None else [])


def environment(work: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": str(work / "hf-datasets"),
            "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_USE_CPU": os.environ.get("ACCELERATE_USE_CPU", "1"),
            "OMP_NUM_THREADS": "1"}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def entry_of(cache: Path) -> Path:
    return next(p for p in cache.iterdir() if p.is_dir() and not p.name.endswith(".partial"))


def build_cache(corpus: Path, cache: Path, work: Path, num_proc: int, method: str = "text") -> dict:
    """One cache build in a fresh process; its phases come from the entry's meta.json. CPU seconds are the build
    process's and its workers' (user + system), and the load average is read before and after."""
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", BUILD, method, *data_args(corpus, cache, num_proc), "--disable_tqdm"],
                   env=environment(work), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    meta = json.loads((entry_of(cache) / "meta.json").read_text())
    return {"wall_seconds": time.perf_counter() - started, **meta["build"], "tokens": meta["splits"],
            "cpu_seconds": (after.ru_utime - child.ru_utime) + (after.ru_stime - child.ru_stime),
            "load_average": [load_before, os.getloadavg()[0]]}


def killed_build(corpus: Path, cache: Path, work: Path, num_proc: int, clean_hash: str) -> dict:
    """SIGKILL once the build has written its first files (word counts under way: the scratch files of the text-file
    build, or the datasets build's part files), then rerun; the new train.bin must equal the clean one."""
    shutil.rmtree(cache, ignore_errors=True)
    process = subprocess.Popen([sys.executable, "-c", BUILD, "text", *data_args(corpus, cache, num_proc),
                                "--disable_tqdm"], env=environment(work), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    while process.poll() is None and len(list(cache.glob("*.partial/scratch/piece*"))
                                         + list(cache.glob("*.partial/train.bin.part*"))) < 2:
        time.sleep(0.01)
    killed = process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    left = sorted(p.name for p in cache.iterdir()) if cache.exists() else []
    build_cache(corpus, cache, work, num_proc)
    rebuilt = sha256(entry_of(cache) / "train.bin")
    return {"killed_during_build": killed, "left_after_kill": left, "rebuilt_equals_clean": rebuilt == clean_hash}


def train_command(corpus: Path, cache: Path | None, out: Path, steps: int, resume: bool, num_proc: int) -> list[str]:
    return [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", str(REPO / "scripts" / "pretrain.py"), *data_args(corpus, cache, num_proc),
            "--preset", "debug", "--train_batch_size", "8", "--tgt_len", "32", "--mem_len", "32", "--eval_tgt_len",
            "32", "--max_train_steps", str(steps), "--eval_steps", str(steps), "--max_eval_segments", "2",
            "--checkpointing_steps", str(steps // 3), "--output_dir", str(out), "--disable_tqdm", "--seed", "3",
            *(["--resume_from_checkpoint", "latest"] if resume else ["--overwrite_output_dir"])]


def losses(out: Path) -> dict[int, float]:
    log = out / "train_log.jsonl"
    if not log.is_file():
        return {}
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def workers(process: psutil.Process) -> list[psutil.Process]:
    """The training processes: children of the launcher (not their own tokenization workers)."""
    try:
        return [c for c in process.children() if "pretrain.py" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


STARTUP = """
import modeling_xl.training.loop, modeling_xl.data.pretraining
from accelerate import Accelerator
Accelerator().wait_for_everyone()
"""


def startup_floor(work: Path) -> float:
    """Seconds for the same 2-process launch to import the training stack and start the process group, then exit:
    what every run pays before it can read data (the rest of the time to the first step is this project's)."""
    script = work / "startup.py"
    script.write_text(STARTUP)
    started = time.perf_counter()
    subprocess.run([ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no", str(script)], env=environment(work),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def every_descendant(process: psutil.Process) -> list[psutil.Process]:
    """Every process the launcher started, at any depth (training processes and their build workers)."""
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def train(command: list[str], out: Path, work: Path, kill_after_step: int | None = None, env: dict | None = None,
          sample=workers) -> dict:
    """Run (or kill after `kill_after_step` is logged and a checkpoint exists); sample memory of the processes
    `sample(launcher)` lists; time the first step."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env or environment(work), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True, text=True)
    launcher, first_step, peaks = psutil.Process(process.pid), None, {}
    while process.poll() is None:
        for worker in sample(launcher):
            hwm, anon = status_kib(worker.pid, "VmHWM"), status_kib(worker.pid, "RssAnon")
            old = peaks.get(worker.pid, (0, 0))
            peaks[worker.pid] = (max(old[0], hwm), max(old[1], anon))
        seen = losses(out)
        if first_step is None and seen:
            first_step = time.perf_counter() - started
        if kill_after_step is not None and max(seen, default=0) >= kill_after_step and list(out.glob("checkpoints/*")):
            # the launcher starts each training process in a session of its own (torch elastic), so killing the
            # launcher's process group would leave them running: kill every descendant, then wait until none is left
            everyone = launcher.children(recursive=True)
            os.killpg(process.pid, signal.SIGKILL)
            for child in everyone:
                try:
                    child.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            process.wait()
            psutil.wait_procs(everyone, timeout=60)
            break
        time.sleep(0.1)
    error = process.stderr.read() if process.returncode not in (0, -signal.SIGKILL) else ""
    if error:
        raise RuntimeError(f"training failed ({process.returncode}): {error[-3000:]}")
    return {"seconds_to_first_step": first_step, "wall_seconds": time.perf_counter() - started,
            "peak_rss_mb": [round(h / 1024) for h, _ in peaks.values()],
            "peak_anon_rss_mb": [round(a / 1024) for _, a in peaks.values()]}


def bench_size(size: float, work: Path, args) -> dict:
    corpus = work / f"corpus-{size:g}gb"
    if not (corpus / "valid.txt").is_file():
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_corpus.py"), "--size_gb", str(size),
                        "--output_dir", str(corpus), "--valid_fraction", "0.0005"], check=True)
    cache = work / f"cache-{size:g}gb"
    for stale in (cache, work / "run-a", work / "run-b", work / "run-c"):  # an earlier size's log and checkpoints
        shutil.rmtree(stale, ignore_errors=True)
    result = {"size_gb": size, "bytes": (corpus / "train.txt").stat().st_size,
              "build": build_cache(corpus, cache, work, args.num_proc)}
    clean_hash = sha256(entry_of(cache) / "train.bin")
    if size <= args.datasets_build_max_gb:  # the generic build on the same corpus: its time and the same ids
        other = work / f"cache-datasets-{size:g}gb"
        shutil.rmtree(other, ignore_errors=True)
        shutil.rmtree(work / "hf-datasets", ignore_errors=True)  # its corpus load is timed, not read from a cache
        result["datasets_build"] = build_cache(corpus, other, work, args.num_proc, method="datasets")
        result["datasets_build"]["train_bin_equal"] = sha256(entry_of(other) / "train.bin") == clean_hash
        shutil.rmtree(other, ignore_errors=True)
    if args.build_only:
        shutil.rmtree(cache, ignore_errors=True)
        return result
    steps = args.steps
    run = train(train_command(corpus, cache, work / "run-a", steps, False, args.num_proc), work / "run-a", work)
    result["train"] = {**run, "startup_floor_seconds": startup_floor(work)}
    if size <= args.kill_test_max_gb:
        result["killed_build"] = killed_build(corpus, work / f"cache-killed-{size:g}gb", work, args.num_proc,
                                              clean_hash)
        shutil.rmtree(work / f"cache-killed-{size:g}gb", ignore_errors=True)
        checkpoint = steps // 3
        train(train_command(corpus, cache, work / "run-b", steps, False, args.num_proc), work / "run-b", work,
              kill_after_step=checkpoint + 2)
        killed_at = max(losses(work / "run-b"), default=0)
        time.sleep(2)  # nothing may write to the log after the kill
        if max(losses(work / "run-b"), default=0) != killed_at or killed_at >= steps:
            raise RuntimeError(f"the killed run went on logging after the kill (step {killed_at} at the kill, "
                               f"{max(losses(work / 'run-b'), default=0)} later, of {steps}): the kill test is void")
        train(train_command(corpus, cache, work / "run-b", steps, True, args.num_proc), work / "run-b", work)
        a, b = losses(work / "run-a"), losses(work / "run-b")
        result["killed_training"] = {"killed_after_step": killed_at, "steps_compared": len(a),
                                     "identical_losses": a == b and len(a) == steps}
    if size <= args.baseline_max_gb:
        result["in_memory_train"] = train(train_command(corpus, None, work / "run-c", steps, False, args.num_proc),
                                          work / "run-c", work)
    shutil.rmtree(cache, ignore_errors=True)
    return result


def main_command(corpus: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """The main command on a local corpus as docs/data.md gives it, 2 processes, no cache flag."""
    return [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", str(REPO / "scripts" / "pretrain.py"), "--preset", "tiny",
            "--train_file", str(corpus / "train.txt"), "--validation_file", str(corpus / "valid.txt"),
            "--output_dir", str(out), "--max_train_steps", str(steps), "--eval_steps", str(steps),
            "--max_eval_segments", "2", "--disable_tqdm", "--overwrite_output_dir", *extra]


def bench_main_command(size: float, work: Path, args) -> dict:
    """Three runs of the main command on one corpus (module docstring), in a fresh user cache folder."""
    corpus = work / f"corpus-{size:g}gb"
    if not (corpus / "valid.txt").is_file():
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_corpus.py"), "--size_gb", str(size),
                        "--output_dir", str(corpus), "--valid_fraction", "0.0005"], check=True)
    user_cache = work / "user-cache"
    shutil.rmtree(user_cache, ignore_errors=True)
    env = {**environment(work), "MODELING_XL_CACHE": str(user_cache)}
    first, again = work / "main-first", work / "main-again"
    shutil.rmtree(first, ignore_errors=True)
    runs = {}
    for name, out, extra in (("first run", first, ()), ("same command again", again, ()),
                             ("--tokenizer_name <first run>", work / "main-saved", ("--tokenizer_name", str(first)))):
        shutil.rmtree(out, ignore_errors=True)  # an earlier size's log would read as this run's first step
        runs[name] = train(main_command(corpus, out, args.steps, *extra), out, work, env=env, sample=every_descendant)
    entries = [p.name for p in (user_cache / "token_cache").iterdir() if (p / "COMPLETE").is_file()]
    return {"size_gb": size, "bytes": (corpus / "train.txt").stat().st_size, "main_command": runs,
            "cache_entries": entries}


def main_command_rows(r: dict) -> list[list[str]]:
    return [[f"{r['size_gb']:g} GB", name, f"{run['seconds_to_first_step']:.1f}", str(len(run["peak_rss_mb"])),
             str(max(run["peak_rss_mb"])), "/".join(map(str, sorted(run["peak_rss_mb"], reverse=True)[:4]))]
            for name, run in r["main_command"].items()]


def build_row(r: dict) -> list[str]:
    build, generic = r["build"], r.get("datasets_build")
    return [f"{r['size_gb']:g} GB", f"{sum(build['tokens'].values()) / 1e6:.1f}M",
            f"{build['build_seconds']:.1f} ({build['load_seconds']:.1f} / {build['tokenizer_seconds']:.1f} / "
            f"{build['tokenize_seconds']:.1f})", f"{build['build_tokens_per_second'] / 1e6:.2f}M",
            f"{build['cpu_seconds']:.0f}", "-".join(f"{x:.1f}" for x in build["load_average"]),
            "-" if generic is None
            else f"{generic['build_seconds']:.1f} ({generic['build_tokens_per_second'] / 1e6:.2f}M"
            f"{'' if generic['train_bin_equal'] else ', ids DIFFER'})"]


def train_row(r: dict) -> list[str]:
    run = r["train"]
    return [f"{r['size_gb']:g} GB", f"{run['seconds_to_first_step']:.1f} ({run['startup_floor_seconds']:.1f})",
            "/".join(map(str, run["peak_rss_mb"])), "/".join(map(str, run["peak_anon_rss_mb"])),
            "/".join(map(str, r.get("in_memory_train", {}).get("peak_rss_mb", []))) or "-",
            str(r.get("killed_build", {}).get("rebuilt_equals_clean", "-")),
            str(r.get("killed_training", {}).get("identical_losses", "-"))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes_gb", type=float, nargs="+", default=[0.5, 1.0, 5.0])
    parser.add_argument("--work_dir", required=True, help="corpora, caches and runs (several times the largest size)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count() or 1, help="tokenization processes")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run (checkpoint every steps/3)")
    parser.add_argument("--kill_test_max_gb", type=float, default=1.0, help="kill tests only up to this size")
    parser.add_argument("--baseline_max_gb", type=float, default=0.1, help="in-memory runs only up to this size")
    parser.add_argument("--datasets_build_max_gb", type=float, default=0.1,
                        help="also time the generic build (corpus loaded through datasets) up to this size")
    parser.add_argument("--build_only", action="store_true", help="only the cache builds (no training runs)")
    parser.add_argument("--main_command", action="store_true", help="the main command with no cache flag, three "
                        "runs per size (module docstring)")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if args.main_command:
        results = [bench_main_command(size, work, args) for size in args.sizes_gb]
        print_table(["corpus", "run", "first step s", "processes", "peak RSS MB (largest)", "largest four"],
                    [row for r in results for row in main_command_rows(r)])
        (work / "bench_main_command.json").write_text(json.dumps({"machine": machine_description(),
                                                                  "args": vars(args), "results": results}, indent=2))
        return
    results = []
    for size in args.sizes_gb:
        results.append(bench_size(size, work, args))
        print(json.dumps(results[-1]), flush=True)
    print_table(["corpus", "tokens", "build s (load / count / write)", "build tokens/s", "CPU s", "load avg",
                 "generic build s (tokens/s)"], [build_row(r) for r in results])
    trained = [r for r in results if "train" in r]
    if trained:
        print_table(["corpus", "first step s (startup floor)", "peak RSS MB", "anon MB", "in-memory RSS MB",
                     "kill build ok", "kill train ok"], [train_row(r) for r in trained])
    (work / "bench_scale.json").write_text(json.dumps({"machine": machine_description(), "args": vars(args),
                                                       "results": results}, indent=2))


if __name__ == "__main__":
    main()
