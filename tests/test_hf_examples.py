"""transformers' own example scripts (`run_qa.py`, `run_ner.py`, `run_swag.py`) on folders saved by
`scripts/pretrain.py`, through `trust_remote_code` (the scripts never import this package).

The pinned scripts live in ../shared/hf_examples (Apache-2.0, not copied here); its `prepare.sh` makes offline copies
in a temporary folder (version check removed, Hub metrics swapped for local ones). Skipped with the reason when that
folder or the data (../shared/data: SQuAD, UD English-EWT, ARC-Easy) is absent.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

HF_EXAMPLES = Path(os.environ.get("MODELING_XL_HF_EXAMPLES", REPO.parent / "shared" / "hf_examples"))
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "WANDB_DISABLED": "true"}
STEPS = ["--do_train", "--do_eval", "--max_steps", "3", "--per_device_train_batch_size", "4",
         "--per_device_eval_batch_size", "8", "--max_seq_length", "64", "--report_to", "none", "--save_strategy", "no"]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    if not (HF_EXAMPLES / "prepare.sh").exists():
        pytest.skip(f"needs transformers' pinned example scripts at {HF_EXAMPLES} (../shared/hf_examples beside the "
                    "checkout, or MODELING_XL_HF_EXAMPLES)")
    dest = tmp_path_factory.mktemp("hf_scripts")
    proc = subprocess.run(["bash", str(HF_EXAMPLES / "prepare.sh"), str(dest)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dest


def pretrained(folder: Path, *extra: str) -> Path:
    """A debug-size model saved by scripts/pretrain.py (4 steps on the built-in corpus)."""
    command = [sys.executable, str(REPO / "scripts" / "pretrain.py"), "--preset", "debug", "--output_dir", str(folder),
               "--max_train_steps", "4", "--eval_steps", "2", "--max_eval_segments", "2", "--disable_tqdm", *extra]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def causal_folder(tmp_path_factory) -> Path:
    return pretrained(tmp_path_factory.mktemp("lm") / "clm")


@pytest.fixture(scope="module")
def plm_folder(tmp_path_factory) -> Path:
    return pretrained(tmp_path_factory.mktemp("lm") / "plm", "--objective", "plm", "--tgt_len", "16",
                      "--eval_tgt_len", "16")


def run_example(script: Path, workdir: Path, *args: str) -> dict:
    """Run one example script; its all_results.json."""
    out = workdir / "out"
    proc = subprocess.run([sys.executable, str(script), *args, "--output_dir", str(out), *STEPS], cwd=workdir,
                          capture_output=True, text=True, timeout=600, env={**os.environ, **OFFLINE})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "all_results.json").read_text())


def jsonl_rows(path: Path, limit: int) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) == limit:
                break
    return rows


def squad_files(shared_data: Path, workdir: Path) -> list[str]:
    """run_qa.py's {"data": [...]} files: a validation split of whole articles (by title) and training rows."""
    rows = jsonl_rows(shared_data / "squad" / "train.jsonl", 400)
    held_out = rows[-1]["title"]
    for name, part in (("train", [r for r in rows if r["title"] != held_out][:120]),
                       ("dev", [r for r in rows if r["title"] == held_out][:30])):
        (workdir / f"{name}.json").write_text(json.dumps({"data": part}))
    return ["--train_file", str(workdir / "train.json"), "--validation_file", str(workdir / "dev.json"),
            "--doc_stride", "16"]


@pytest.mark.parametrize("backbone", ["causal", "plm"])
def test_run_qa_on_a_pretrained_folder(backbone, scripts, shared_data, causal_folder, plm_folder, tmp_path):
    folder = causal_folder if backbone == "causal" else plm_folder
    results = run_example(scripts / "question-answering" / "run_qa.py", tmp_path, "--model_name_or_path", str(folder),
                          "--trust_remote_code", *squad_files(shared_data, tmp_path))
    assert 0.0 <= results["eval_exact_match"] <= 100.0 and 0.0 <= results["eval_f1"] <= 100.0
    assert results["eval_samples"] >= 30  # every question read (longer contexts give several windows)
    predictions = json.loads((tmp_path / "out" / "eval_predictions.json").read_text())
    assert len(predictions) == 30


def test_run_ner_on_a_pretrained_folder(scripts, shared_data, causal_folder, tmp_path):
    train = jsonl_rows(shared_data / "ud_ewt" / "train.jsonl", 200)
    tags = {tag for row in train for tag in row["upos_tags"]}  # run_ner.py takes its label list from train
    dev = [r for r in jsonl_rows(shared_data / "ud_ewt" / "dev.jsonl", 200) if set(r["upos_tags"]) <= tags][:40]
    for split, rows in (("train", train), ("dev", dev)):
        (tmp_path / f"{split}.json").write_text("\n".join(json.dumps(r) for r in rows))
    results = run_example(scripts / "token-classification" / "run_ner.py", tmp_path, "--model_name_or_path",
                          str(causal_folder), "--trust_remote_code", "--train_file", str(tmp_path / "train.json"),
                          "--validation_file", str(tmp_path / "dev.json"), "--text_column_name", "tokens",
                          "--label_column_name", "upos_tags")
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and "eval_f1" in results


def test_run_swag_on_a_pretrained_folder(scripts, shared_data, causal_folder, tmp_path):
    """ARC-Easy in SWAG's columns (the shared converter keeps the 4-choice questions run_swag.py expects)."""
    proc = subprocess.run([sys.executable, str(HF_EXAMPLES / "arc_to_swag.py"), str(shared_data / "arc_easy"),
                           str(tmp_path), "train", "validation"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for split, limit in (("train", 120), ("validation", 40)):
        rows = (tmp_path / f"{split}.json").read_text().splitlines()[:limit]
        (tmp_path / f"{split}_small.json").write_text("\n".join(rows))
    results = run_example(scripts / "multiple-choice" / "run_swag.py", tmp_path, "--model_name_or_path",
                          str(causal_folder), "--trust_remote_code", "--train_file", str(tmp_path / "train_small.json"),
                          "--validation_file", str(tmp_path / "validation_small.json"))
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["eval_samples"] == 40
