"""End-to-end training runs on the `debug` preset and a generated 30k-character play
(tests/generated_corpora.py).

Runs go through `run_pretraining` with a character-level tokenizer built here (data_builder), so they test the
training loop itself: 2 processes over gloo vs 1 process, resume after SIGKILL, gradient accumulation, the NaN guard,
publishing, and loading the final folder in a fresh process.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import warm_launch
from generated_corpora import play_text

pytestmark = pytest.mark.slow  # several launches of 1 and 2 processes: `.ci/run` leaves them out of its second pass

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))

DRIVER = textwrap.dedent('''
    """Test driver: run_pretraining on a character-level slice of a corpus; optional hooks for the tests."""
    import json, os, signal, sys
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from modeling_xl.data.sources import StreamLayout
    from modeling_xl.training import data_from_tokens, loop, parse_args, run_pretraining


    def char_tokenizer(text):
        vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(sorted(set(text)))}}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        tokenizer.decoder = decoders.Fuse()
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<unk>")


    def builder(args, rank, world, per_process):
        text = Path(os.environ["CORPUS"]).read_text()
        tokenizer = char_tokenizer(text)
        ids = tokenizer(text)["input_ids"]
        split = int(len(ids) * 0.9)
        data = data_from_tokens(tokenizer, ids[:split], ids[split:],
                                StreamLayout(per_process * world, args.tgt_len, args.eval_tgt_len, world, rank),
                                info={"char_level": True, "dataset_name": "play"})
        if os.environ.get("RECORD_ROWS"):  # what this rank reads at each step
            original, seen = data.train.batch, {}

            def batch(step):
                out = original(step)
                seen[step] = [out["input_ids"].tolist(), out["next_token_labels"].tolist()]
                Path(os.environ["RECORD_ROWS"], f"rank{rank}.json").write_text(json.dumps(seen))
                return out

            data.train.batch = batch
        return data


    if os.environ.get("KILL_AFTER_CHECKPOINT"):  # SIGKILL right after the first checkpoint is complete
        save = loop.save_checkpoint

        def save_then_die(*a, **k):
            folder = save(*a, **k)
            os.kill(os.getpid(), signal.SIGKILL)

        loop.save_checkpoint = save_then_die

    print(json.dumps(run_pretraining(parse_args(sys.argv[1:]), builder)))
''')

COMMON = ["--preset", "debug", "--train_batch_size", "4", "--tgt_len", "8", "--mem_len", "8", "--eval_tgt_len", "8",
          "--eval_mem_len", "16", "--max_train_steps", "12", "--eval_steps", "4", "--max_eval_segments", "20",
          "--learning_rate", "3e-3", "--disable_tqdm", "--seed", "7"]
DROPOUT = ["--dropout", "0.1"]  # the resume test needs dropout: exact resume must restore the RNG too


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("training_runs")
    (root / "corpus.txt").write_text(play_text(30_000)[:30_000])
    (root / "driver.py").write_text(DRIVER)
    return root


def run_driver(workdir, out, extra=(), processes=1, env_extra=None, check=True):
    """The driver as `python driver.py` (processes 1) or under `accelerate launch --multi_gpu`, forked warm
    (`warm_launch`; the real launcher and script: `test_real_script_with_two_processes_finishes_and_writes_one_folder`).
    """
    env = {**os.environ, "CORPUS": str(workdir / "corpus.txt"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           **(env_extra or {})}
    if processes > 1:
        env["ACCELERATE_USE_CPU"] = "1"
    result = warm_launch.run(workdir / "driver.py", [*COMMON, "--output_dir", str(out), *extra], env=env, cwd=workdir,
                             timeout=180, processes=processes)
    if check and result.returncode != 0:
        raise AssertionError(f"run failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def losses(out) -> dict[int, float]:
    records = [json.loads(line) for line in Path(out, "train_log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def reference(workdir):
    """One uninterrupted single-process run without dropout (1 vs 2 processes draw different dropout masks)."""
    out = workdir / "reference"
    rows = workdir / "rows1"
    rows.mkdir()
    run_driver(workdir, out, env_extra={"RECORD_ROWS": str(rows)})
    return out


@pytest.fixture(scope="module")
def reference_with_dropout(workdir):
    """One uninterrupted single-process run with dropout, checkpointing at step 6."""
    out = workdir / "reference_dropout"
    run_driver(workdir, out, ["--checkpointing_steps", "6", *DROPOUT])
    return out


def test_two_processes_give_the_single_process_loss_curve(workdir, reference):
    out, rows = workdir / "two", workdir / "rows2"
    rows.mkdir()
    run_driver(workdir, out, processes=2, env_extra={"RECORD_ROWS": str(rows)})
    single, double = losses(reference), losses(out)
    assert sorted(double) == list(range(1, 13))
    for step in single:
        assert double[step] == pytest.approx(single[step], rel=1e-5), step
    # each rank read its fixed half of the streams, and its rows continue from step to step
    whole = {int(k): v for k, v in json.loads((workdir / "rows1" / "rank0.json").read_text()).items()}
    for rank in range(2):
        seen = {int(k): v for k, v in json.loads((rows / f"rank{rank}.json").read_text()).items()}
        assert sorted(seen) == list(range(12))
        for step, (inputs, labels) in seen.items():
            assert inputs == whole[step][0][2 * rank: 2 * rank + 2]
            assert labels == whole[step][1][2 * rank: 2 * rank + 2]
        for step in range(11):  # each rank's rows continue from one step to the next
            assert [row[0] for row in seen[step + 1][0]] == [row[-1] for row in seen[step][1]]


def test_rows_continue_across_steps(workdir, reference):
    whole = {int(k): [torch.tensor(x) for x in v]
             for k, v in json.loads((workdir / "rows1" / "rank0.json").read_text()).items()}
    inputs = torch.cat([whole[t][0] for t in range(12)], dim=1)  # [4 rows, 12 steps x 8 tokens]
    labels = torch.cat([whole[t][1] for t in range(12)], dim=1)
    # each row is one contiguous piece of text: its targets are its inputs shifted by one, across step borders
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    assert len({tuple(row) for row in inputs.tolist()}) == 4


def test_resume_after_sigkill_gives_the_same_losses(workdir, reference_with_dropout):
    reference = reference_with_dropout
    out = workdir / "killed"
    killed = run_driver(workdir, out, ["--checkpointing_steps", "6", *DROPOUT],
                        env_extra={"KILL_AFTER_CHECKPOINT": "1"}, check=False)
    assert killed.returncode == -9  # SIGKILL
    assert sorted(losses(out)) == list(range(1, 7))
    assert (out / "checkpoints" / "step_0000006" / "training_state.json").is_file()
    run_driver(workdir, out, ["--checkpointing_steps", "6", "--resume_from_checkpoint", "latest", *DROPOUT])
    resumed, uninterrupted = losses(out), losses(reference)
    assert sorted(resumed) == list(range(1, 13))
    for step in range(1, 13):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-6, abs=1e-6), step
    assert json.loads((out / "eval_results.json").read_text())["perplexity"] == pytest.approx(
        json.loads((reference / "eval_results.json").read_text())["perplexity"], rel=1e-6)


def test_resume_with_another_process_count_is_refused_by_every_process(workdir, reference_with_dropout):
    out = workdir / "two_resume_one"
    shutil.copytree(reference_with_dropout / "checkpoints", out / "checkpoints")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    result = run_driver(workdir, out, ["--checkpointing_steps", "6", "--resume_from_checkpoint", "latest", *DROPOUT],
                        processes=2, check=False)
    assert result.returncode != 0
    # both ranks stop on the layout check, before Accelerate's load_state (rank 1 has no memories file to read)
    assert result.stderr.count("was written with train_batch_size=4 over 1 process(es) x 1 chunk(s) of 4 streams, this "
                               "run has train_batch_size=4 over 2 process(es) x 1 chunk(s) of 2 streams") == 2, \
        result.stderr[-3000:]
    assert "memories_rank1" not in result.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # nothing written


def test_final_folder_loads_in_a_fresh_process_and_generates(reference):
    files = {p.name for p in reference.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_transformer_xl.py", "tokenizer.json", "README.md",
            "training_config.yaml", "training_config.json", "loss_curve.png", "eval_results.json"} <= files
    card = (reference / "README.md").read_text()
    assert "model-index" in card and "Bits per character" in card and "loss_curve.png" in card
    script = textwrap.dedent(f'''
        import sys
        sys.path = [p for p in sys.path if p not in ("", "{REPO}")]  # only the folder's own code may be used
        sys.modules["modeling_xl"] = sys.modules["tokenization"] = None  # (the project may be installed editable)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained("{reference}", trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained("{reference}", trust_remote_code=True)
        ids = tok("ROMEO:", return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        print("GENERATED", out.shape[1] - ids.shape[1], repr(tok.decode(out[0])))
    ''')
    result = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=120, cwd="/",
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    generated = [line for line in result.stdout.splitlines() if line.startswith("GENERATED")]
    assert generated and generated[0].split()[1] == "12", result.stdout


def test_real_script_with_two_processes_finishes_and_writes_one_folder(workdir):
    """scripts/pretrain.py itself (datasets pipeline, char tokenizer) under `accelerate launch`, 2 processes."""
    out = workdir / "script_two"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    command = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(warm_launch.free_port()),
               str(REPO / "scripts" / "pretrain.py"), "--preset", "debug", "--train_file", str(workdir / "corpus.txt"),
               "--tokenizer_type", "char", "--max_train_steps", "6", "--checkpointing_steps", "3", "--disable_tqdm",
               "--output_dir", str(out)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150, cwd=workdir)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("validation:") == 2  # both processes report the same reduced metrics
    assert len(set(line for line in result.stdout.splitlines() if line.startswith("validation:"))) == 1
    state = json.loads((out / "checkpoints" / "step_0000006" / "training_state.json").read_text())
    assert state["num_processes"] == 2 and state["step"] == 6 and state["max_train_steps"] == 6
    assert (out / "checkpoints" / "step_0000006" / "memories_rank1.safetensors").is_file()
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    # a character tokenizer has no end token: generation must not stop at its id 0 (a character), the config default
    from modeling_xl import TransformerXLConfig

    assert TransformerXLConfig.from_pretrained(out).eos_token_id is None
    assert json.loads((out / "generation_config.json").read_text()).get("eos_token_id") is None
