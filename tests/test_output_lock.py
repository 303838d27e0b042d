"""One run per output folder: the lock `run_pretraining` holds for its lifetime, seen from other real processes
(issue 20 item 3): a live holder refuses a second run before it writes anything; a holder killed by SIGKILL leaves a
lock file that blocks nothing; a normal end removes the file."""

import errno
import os
import textwrap
import time
from pathlib import Path

import pytest
import warm_launch

from modeling_xl.runtime.run_folder import (
    LOCK_FILE,
    LOG_FILE,
    OutputDirLock,
    OutputDirLockedError,
    StepLog,
    read_log,
    replace_text,
)
from modeling_xl.training.arguments import parse_args
from modeling_xl.training.loop import run_pretraining

HOLDER = textwrap.dedent("""
    import sys, time
    from modeling_xl.runtime.run_folder import OutputDirLock
    lock = OutputDirLock(sys.argv[1]).acquire()  # kept referenced: the flock lives as long as its file
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def holder(tmp_path):
    """A second process holding the lock of tmp_path / "run" until killed (forked warm: `warm_launch`)."""
    out = tmp_path / "run"
    (tmp_path / "holder.py").write_text(HOLDER)
    said = tmp_path / "holder.out"
    process = warm_launch.start(tmp_path / "holder.py", [out], env=dict(os.environ), cwd=tmp_path, stdout=said,
                                stderr=tmp_path / "holder.err")
    deadline = time.monotonic() + 120
    while not (said.exists() and said.read_text().strip() == "locked"):
        assert process.is_alive() and time.monotonic() < deadline, (tmp_path / "holder.err").read_text()[-3000:]
        time.sleep(0.05)
    yield out, process
    if process.is_alive():
        process.kill()
    process.join()


def test_a_second_run_on_a_locked_output_dir_is_refused_before_it_writes(holder):
    out, process = holder
    before = sorted(p.name for p in out.iterdir())
    args = parse_args(["--preset", "debug", "--output_dir", str(out), "--max_train_steps", "2"])
    with pytest.raises(OutputDirLockedError, match=rf"output_dir='{out}' is in use by another run \(process "
                                                    rf"{process.pid}"):
        run_pretraining(args, data_builder=lambda *a: pytest.fail("data built while another run holds the folder"))
    assert sorted(p.name for p in out.iterdir()) == before == [LOCK_FILE]


def test_a_lock_left_by_a_killed_run_blocks_nothing(holder):
    out, process = holder
    process.kill()  # SIGKILL
    process.join()
    assert (out / LOCK_FILE).exists()  # the dead run's file stays; its flock went with the process
    lock = OutputDirLock(out).acquire()
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()
    assert not (out / LOCK_FILE).exists()  # a normal end removes the file


def test_the_lock_is_free_again_after_a_normal_end(tmp_path):
    with OutputDirLock(tmp_path):
        with pytest.raises(OutputDirLockedError):
            OutputDirLock(tmp_path).acquire()  # a second open file description: flock conflicts within a process too
    OutputDirLock(tmp_path).acquire().release()


def test_fine_tuning_on_a_locked_output_dir_is_refused_before_it_writes(holder, tmp_path):
    from modeling_xl.finetuning import FinetuneArguments, run_finetuning

    out, process = holder
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("sentence\tlabel\ngood\t1\n")
    args = FinetuneArguments(model_name_or_path=str(tmp_path), output_dir=str(out),
                             train_file=str(tmp_path / "train.tsv"), validation_file=str(tmp_path / "dev.tsv"),
                             disable_tqdm=True)
    with pytest.raises(OutputDirLockedError, match=rf"output_dir='{out}' is in use by another run \(process "
                                                    rf"{process.pid}"):
        run_finetuning(args)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]


def test_folders_the_lock_made_go_again_when_nothing_was_written(tmp_path):
    new = tmp_path / "a" / "b"
    OutputDirLock(new).acquire().release()  # a run that failed before writing anything
    assert not (tmp_path / "a").exists()
    with OutputDirLock(new):
        (new / "model.safetensors").write_text("x")
    assert (new / "model.safetensors").is_file()  # what a run wrote stays
    existing = tmp_path / "mine"
    existing.mkdir()
    OutputDirLock(existing).acquire().release()
    assert existing.is_dir()  # the user's own (empty) folder stays


def test_a_step_log_cut_back_on_resume_stays_whole_when_the_write_fails(tmp_path, monkeypatch):
    records = [{"step": step, "loss": 5.0 - step} for step in (1, 2, 3)]
    (tmp_path / LOG_FILE).write_text("".join(f'{{"step": {r["step"]}, "loss": {r["loss"]}}}\n' for r in records))
    before = (tmp_path / LOG_FILE).read_text()
    write_text = Path.write_text

    def disk_full(path, text, *args, **kwargs):  # half the text reaches the disk, then the disk is full
        write_text(path, text[:len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError, match="No space left"):
        StepLog(tmp_path, enabled=True, resume_step=1)
    assert (tmp_path / LOG_FILE).read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == [LOG_FILE]
    monkeypatch.undo()
    StepLog(tmp_path, enabled=True, resume_step=1)
    assert read_log(tmp_path / LOG_FILE) == records[:1]


def test_a_replaced_file_keeps_its_link_its_permissions_and_a_refusal_to_be_written(tmp_path):
    target = tmp_path / "cards" / "mine.md"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o640)
    (tmp_path / "README.md").symlink_to(target)
    replace_text(tmp_path / "README.md", "new")
    assert (tmp_path / "README.md").is_symlink() and target.read_text() == "new"  # the link's target replaced
    assert target.stat().st_mode & 0o777 == 0o640
    replace_text(tmp_path / "new" / "folder" / "results.json", "{}")  # a missing folder is made, as a card's save does
    assert (tmp_path / "new" / "folder" / "results.json").read_text() == "{}"
    if os.geteuid() != 0:  # root may write a read-only file
        os.chmod(target, 0o444)
        with pytest.raises(PermissionError, match="not writable"):
            replace_text(target, "newer")
        assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["mine.md"]  # no temporary file left


def test_a_step_log_record_a_kill_cut_is_left_out_on_resume(tmp_path):
    (tmp_path / LOG_FILE).write_text('{"step": 1, "loss": 4.0}\n{"step": 2, "loss": 3.0}\n{"step": 3, "lo')
    assert read_log(tmp_path / LOG_FILE) == [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0}]
    log = StepLog(tmp_path, enabled=True, resume_step=2)
    log.write({"step": 3, "loss": 2.5})
    assert read_log(tmp_path / LOG_FILE) == [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0},
                                             {"step": 3, "loss": 2.5}]
