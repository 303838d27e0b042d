"""Adversarial inputs and faults, as a table: each case sets up what a user (or a crash) left behind, runs the entry
point, and checks the error text and that every file the user had is still there, byte for byte.

Issue 20 lists the cases (numbers in the case ids); `docs/troubleshooting.md` describes the same behaviour for users.
Training runs here use the `debug` preset on a small generated corpus (no `../shared` needed), in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import warm_launch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from modeling_xl.data.sources import StreamLayout
from modeling_xl.training import data_from_tokens, parse_args, run_pretraining

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


# ---------------------------------------------------------------- a tiny run, in-process

def corpus_text(n_words: int = 6000, seed: int = 0) -> str:
    """Deterministic pseudo-text: words drawn from a small vocabulary, in lines."""
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "then", "slept"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n_words // 8)]
    return "\n".join(lines) + "\n"


def char_tokenizer(text):
    vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(sorted(set(text)))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


def builder(args, rank, world, per_process):
    text = corpus_text()
    tokenizer = char_tokenizer(text)
    ids = tokenizer(text)["input_ids"]
    split = int(len(ids) * 0.9)
    return data_from_tokens(tokenizer, ids[:split], ids[split:],
                            StreamLayout(per_process * world, args.tgt_len, args.eval_tgt_len, world, rank),
                            info={"char_level": True, "dataset_name": "generated"})


def run_args(out, *extra) -> list[str]:
    return ["--preset", "debug", "--output_dir", str(out), "--max_train_steps", "4", "--eval_steps", "2",
            "--max_eval_segments", "3", "--disable_tqdm", *extra]


def pretrain(out, *extra):
    return run_pretraining(parse_args(run_args(out, *extra)), builder)


def snapshot(folder: Path) -> dict[str, str]:
    """{relative path: sha256 (or 'dir')} of everything under folder."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): ("dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A complete debug run with checkpoints at steps 2 and 4 (read-only to the cases: they copy it)."""
    out = tmp_path_factory.mktemp("adversarial") / "finished"
    pretrain(out, "--checkpointing_steps", "2")
    return out


# ---------------------------------------------------------------- the table

@dataclass
class Case:
    """`setup(tmp, finished_run) -> folder to watch`; `act(tmp, folder)` must raise `error` matching `message`;
    every file under the watched folder is unchanged afterwards (unless `changes` lists it)."""

    id: str
    setup: Callable[[Path, Path], Path]
    act: Callable[[Path, Path], object]
    message: str
    error: type = ValueError
    changes: tuple[str, ...] = ()


def copy_run(tmp: Path, finished: Path) -> Path:
    out = tmp / "run"
    shutil.copytree(finished, out)
    return out


def edit_state(step_folder: str, edit: Callable[[dict], object]):
    def setup(tmp, finished):
        out = copy_run(tmp, finished)
        path = out / "checkpoints" / step_folder / "training_state.json"
        state = json.loads(path.read_text())
        new = edit(state)
        path.write_text(new if isinstance(new, str) else json.dumps(state if new is None else new))
        return out
    return setup


def write_state_text(text: str):
    def setup(tmp, finished):
        out = copy_run(tmp, finished)
        (out / "checkpoints" / "step_0000004" / "training_state.json").write_text(text)
        return out
    return setup


def truncate(relative: str):
    def setup(tmp, finished):
        out = copy_run(tmp, finished)
        path = out / "checkpoints" / "step_0000004" / relative
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return out
    return setup


def resume(tmp, out):
    return pretrain(out, "--checkpointing_steps", "2", "--max_train_steps", "6", "--resume_from_checkpoint", "latest")


def user_folder(*names):
    def setup(tmp, finished):
        out = tmp / "mine"
        out.mkdir()
        for name in names:
            (out / name).write_text(f"the user's own {name}\n")
        return out
    return setup


def fresh_run(tmp, out, *extra):
    return pretrain(out, *extra)


def read_only_config(tmp, finished):
    out = copy_run(tmp, finished)
    (out / "config.json").chmod(0o444)
    return out


def folder_named_config(tmp, finished):
    out = copy_run(tmp, finished)
    (out / "README.md").unlink()
    (out / "README.md").mkdir()
    (out / "README.md" / "notes.txt").write_text("kept\n")
    return out


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LEGACY = REPO / "tests" / "fixtures" / "legacy_transfo_xl" / "case_c"
# a pickle that appends onto a string: data-only opcodes, but not a vocabulary
CRAFTED_PKL = b"\x80\x04\x8c\x01x\x8c\x01ya."


def earlier_conversion(tmp, finished):
    """tmp/legacy (with a crafted vocab.pkl) and tmp/out holding an earlier conversion with its tokenizer and card."""
    legacy = tmp / "legacy"
    shutil.copytree(LEGACY, legacy)
    load_script("convert_transfo_xl").convert(str(legacy), str(tmp / "out"))
    for name in ("tokenizer.json", "tokenizer_config.json", "README.md"):
        (tmp / "out" / name).write_text(f"the earlier conversion's {name}\n")
    (legacy / "vocab.pkl").write_bytes(CRAFTED_PKL)
    return tmp


def convert_over(tmp, watched):
    return load_script("convert_transfo_xl").convert(str(tmp / "legacy"), str(tmp / "out"), overwrite=True)


def yaml_file(text: bytes | str):
    def setup(tmp, finished):
        (tmp / "run.yaml").write_bytes(text.encode() if isinstance(text, str) else text)
        return tmp
    return setup


def parse_yaml(tmp, watched):
    return parse_args(["--config", str(tmp / "run.yaml"), "--output_dir", str(tmp / "out")])


def evaluate(*argv):
    def act(tmp, watched):
        script = load_script("evaluate_lm")
        return script.run(script.build_parser().parse_args([a.format(tmp=tmp, run=watched) for a in argv]))
    return act


def a_file_named_results(tmp, finished):
    out = copy_run(tmp, finished)
    (tmp / "results").write_text("a file\n")
    return tmp


def legacy_copy(drop: tuple[str, ...] = ()):
    def setup(tmp, finished):
        legacy = tmp / "legacy"
        shutil.copytree(LEGACY, legacy)
        config = json.loads((legacy / "config.json").read_text())
        (legacy / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in drop}))
        return legacy
    return setup


def load_legacy_config(tmp, legacy):
    from modeling_xl import TransformerXLConfig

    return TransformerXLConfig.from_pretrained(str(legacy))


def crafted_vocab(tmp, finished):
    (tmp / "vocab.pkl").write_bytes(CRAFTED_PKL)
    return tmp


def read_crafted_vocab(tmp, watched):
    from tokenization import tokenizer_from_vocab

    return tokenizer_from_vocab(tmp / "vocab.pkl")


def huge_config(field: str, value: int):
    """tmp/huge: the finished run's weights with one field of config.json set to `value`."""
    def setup(tmp, finished):
        folder = tmp / "huge"
        folder.mkdir()
        shutil.copy(finished / "model.safetensors", folder)
        config = json.loads((finished / "config.json").read_text())
        config[field] = value
        (folder / "config.json").write_text(json.dumps(config))
        return folder
    return setup


def huge_legacy(tmp, finished):
    legacy = legacy_copy()(tmp, finished)
    config = json.loads((legacy / "config.json").read_text())
    (legacy / "config.json").write_text(json.dumps({**config, "n_layer": 10**9}))
    return tmp


def load_model(tmp, folder):
    from modeling_xl import TransformerXLForCausalLM

    return TransformerXLForCausalLM.from_pretrained(str(folder))


TOO_LARGE = r"describes a model of about [\d,]+ parameters; its weights would take about .* more than the .* available " \
            r"on this machine; expected a config that fits, or MODELING_XL_MAX_MEMORY=<size>\|unlimited"

def model_call(**make):
    """Call a fresh debug causal LM (seeded) with inputs built by `make` (name -> function of (model, ids, mems))."""
    def act(tmp, watched):
        import torch

        from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

        torch.manual_seed(0)
        model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug")).eval()
        ids = torch.randint(0, 97, (2, 5))
        mems = model(ids).mems
        return model(**{name: build(model, ids, mems) for name, build in make.items()})
    return act


def nothing(tmp, finished):
    return tmp / "nothing"


PREVIOUS = r"resume from the previous checkpoint instead: --resume_from_checkpoint \S*step_0000002"

CASES = [
    # 2: the model a run starts from, and a user's files in a folder without a run
    Case("2-output-dir-is-the-starting-model", copy_run,
         lambda tmp, out: fresh_run(tmp, out, "--model_name_or_path", str(out), "--overwrite_output_dir"),
         r"output_dir=.* is the folder of model_name_or_path=.*final save would write over it"),
    Case("2-output-dir-is-the-config-folder", copy_run,
         lambda tmp, out: fresh_run(tmp, out, "--config_name", str(out), "--overwrite_output_dir"),
         r"output_dir=.* is the folder of config_name="),
    Case("2-user-files-without-a-run", user_folder("README.md", "config.json", "tokenizer.json"), fresh_run,
         r"holds config\.json, tokenizer\.json, README\.md but no earlier run.*--overwrite_output_dir to replace"),
    # 4: files the final save cannot replace, found before training
    Case("4-read-only-config", read_only_config, lambda tmp, out: fresh_run(tmp, out, "--overwrite_output_dir"),
         r"config\.json \(read-only\) cannot be replaced by the final save.*found before training"),
    Case("4-a-folder-where-the-card-goes", folder_named_config,
         lambda tmp, out: fresh_run(tmp, out, "--overwrite_output_dir"),
         r"README\.md \(a folder\) cannot be replaced by the final save"),
    # 5: every field of the state file
    Case("5-negative-step", edit_state("step_0000004", lambda s: s.update(step=-5)), resume,
         r"training_state\.json has step=-5; expected an integer >= 0.*" + PREVIOUS),
    Case("5-step-other-than-the-folder", edit_state("step_0000004", lambda s: s.update(step=3)), resume,
         r"has step=3, but the folder is named for step 4"),
    Case("5-string-tokens-seen", edit_state("step_0000004", lambda s: s.update(tokens_seen="many")), resume,
         r"has tokens_seen='many'; expected an integer >= 0"),
    Case("5-eval-history-not-a-list", edit_state("step_0000004", lambda s: s.update(eval_history={"a": 1})), resume,
         r"has eval_history=\{'a': 1\}; expected a list"),
    Case("5-eval-history-from-the-future",
         edit_state("step_0000004", lambda s: s["eval_history"].append({"step": 99, "eval_loss": 1.0})), resume,
         r"eval_history entries at steps \[99\] after its step=4"),
    Case("5-data-position-disagrees", edit_state("step_0000004", lambda s: s.update(
        data_position={"segments_consumed": 1})), resume, r"data_position\.segments_consumed=1 for step=4"),
    Case("5-negative-elapsed", edit_state("step_0000004", lambda s: s.update(elapsed_seconds=-1)), resume,
         r"elapsed_seconds=-1; expected a number >= 0"),
    Case("5-bool-batch-size", edit_state("step_0000004", lambda s: s.update(train_batch_size=True)), resume,
         r"train_batch_size=True; expected a positive integer"),
    # 8: malformed or truncated checkpoint files
    Case("8-state-file-is-a-list", write_state_text("[]"), resume,
         r"training_state\.json holds \[\] \(list\); expected a JSON object.*" + PREVIOUS),
    Case("8-state-file-is-null", write_state_text("null"), resume, r"holds null \(NoneType\); expected a JSON object"),
    Case("8-state-file-truncated", write_state_text('{"step": 4, "tok'), resume,
         r"training_state\.json cannot be read \(.*\); expected the JSON object.*" + PREVIOUS),
    Case("8-truncated-model-weights", truncate("model.safetensors"), resume,
         r"step_0000004.*: model\.safetensors is damaged \(.*\); expected a complete checkpoint.*" + PREVIOUS),
    Case("8-truncated-memories", truncate("memories_rank0.safetensors"), resume,
         r"memories_rank0\.safetensors is damaged.*" + PREVIOUS),
    Case("8-truncated-optimizer", truncate("optimizer.bin"), resume, r"optimizer\.bin is damaged.*" + PREVIOUS),
    Case("8-truncated-scheduler", truncate("scheduler.bin"), resume, r"scheduler\.bin is damaged.*" + PREVIOUS),
    # 1: a failed conversion leaves the earlier one (weights, tokenizer, card) and no temporary folder
    Case("1-conversion-with-a-crafted-vocab-pkl", earlier_conversion, convert_over,
         r"vocab\.pkl is not a legacy Transformer-XL vocab\.pkl this safe parser can read"),
    # 9: the --config file
    Case("9-yaml-syntax-error", yaml_file("preset: tiny\nlearning_rate: [1e-3\n"), parse_yaml,
         r"config=.*run\.yaml' is not valid YAML at line 3, column 1"),
    Case("9-yaml-not-utf8", yaml_file(b"preset: tiny\nhub_model_id: caf\xe9\n"), parse_yaml,
         r"config=.*run\.yaml' is not UTF-8 text \(byte 30, line 2: invalid continuation byte"),
    Case("9-config-key-inside-the-yaml", yaml_file("preset: debug\nconfig: other.yaml\n"), parse_yaml,
         r"has a 'config' key \('other\.yaml'\); expected the arguments themselves"),
    # 10: evaluate_lm.py and legacy folders
    Case("10-evaluate-output-dir-is-a-file", a_file_named_results,
         evaluate("{tmp}/run", "--output_dir", "{tmp}/results"),
         r"output_dir=.*results' is a file; expected a folder"),
    Case("10-evaluate-a-legacy-folder", legacy_copy(), evaluate("{run}"),
         r"is a legacy transformers-4\.x Transformer-XL folder.*scripts/convert_transfo_xl\.py"),
    Case("10-legacy-config-without-d-model", legacy_copy(drop=("d_model",)), load_legacy_config,
         r"legacy Transformer-XL config\.json has no d_model; expected every architecture field"),
    Case("10-crafted-vocab-pkl", crafted_vocab, read_crafted_vocab,
         r"vocab\.pkl is not a legacy Transformer-XL vocab\.pkl this safe parser can read \(.*'str' object"),
    # 6: a config too large for the machine is refused by its estimate, before anything is built
    *[Case(f"6-from-pretrained-huge-{field}", huge_config(field, value), load_model, TOO_LARGE)
      for field, value in (("n_layer", 10**9), ("d_model", 2 * 10**9), ("vocab_size", 10**12), ("d_inner", 10**12),
                           ("n_head", 10**9))],
    Case("6-convert-huge-legacy-config", huge_legacy,
         lambda tmp, watched: load_script("convert_transfo_xl").convert(str(tmp / "legacy"), str(tmp / "out")),
         r"n_layer=1000000000.*describes a model of about"),
    Case("6-pretrain-config-name-huge", huge_config("n_layer", 10**9),
         lambda tmp, folder: pretrain(tmp / "out", "--config_name", str(folder)),
         r"training it \(weights, gradients, Adam's two moments\) would take about"),
    # 11: the model's inputs, checked at its boundary
    Case("11-inputs-embeds-of-the-wrong-width", nothing,
         model_call(inputs_embeds=lambda m, ids, mems: __import__("torch").randn(2, 5, 7)),
         r"inputs_embeds has shape \(2, 5, 7\); expected \[batch, seq_len, d_model=16\]"),
    Case("11-inputs-embeds-of-another-dtype", nothing,
         model_call(inputs_embeds=lambda m, ids, mems: __import__("torch").randn(2, 5, 16).double()),
         r"inputs_embeds has dtype torch\.float64; expected the model's dtype torch\.float32"),
    Case("11-float-labels", nothing,
         model_call(input_ids=lambda m, ids, mems: ids, labels=lambda m, ids, mems: ids.float()),
         r"labels has dtype torch\.float32; expected integer token ids"),
    Case("11-mems-of-none", nothing,
         model_call(input_ids=lambda m, ids, mems: ids, mems=lambda m, ids, mems: [None, None]),
         r"mems\[0\] is NoneType; expected a tensor \[batch, mem_len, d_model\] per layer.*or mems=None"),
    Case("11-integer-mems", nothing,
         model_call(input_ids=lambda m, ids, mems: ids, mems=lambda m, ids, mems: [x.long() for x in mems]),
         r"mems\[0\] has dtype torch\.int64; expected floating-point hidden states"),
    Case("11-mems-longer-than-mem-len", nothing,
         model_call(input_ids=lambda m, ids, mems: ids,
                    mems=lambda m, ids, mems: [__import__("torch").cat([x, x], 1) for x in mems]),
         r"mems\[0\] holds 10 positions; expected at most mem_len=8"),
    Case("11-attention-mask-not-0-or-1", nothing,
         model_call(input_ids=lambda m, ids, mems: ids,
                    attention_mask=lambda m, ids, mems: __import__("torch").full((2, 5), 2)),
         r"attention_mask holds \[2\.0\]; expected 1 for real tokens and 0 for padding"),
    # already handled before issue 20: kept here so that they stay handled
    Case("earlier-run-without-resume-or-overwrite", copy_run, fresh_run,
         r"already holds an earlier run \(checkpoints, train_log\.jsonl\)"),
    Case("resume-past-the-last-step", copy_run,
         lambda tmp, out: pretrain(out, "--max_train_steps", "3", "--resume_from_checkpoint", "latest"),
         r"is at step 4, past this run's max_train_steps=3"),
    Case("resume-with-another-batch-layout", copy_run,
         lambda tmp, out: pretrain(out, "--max_train_steps", "6", "--train_batch_size", "8",
                                   "--resume_from_checkpoint", "latest"),
         r"was written with train_batch_size=4, this run has train_batch_size=8"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_named_and_nothing_is_lost(case, tmp_path, finished_run):
    if case.id == "4-read-only-config" and os.geteuid() == 0:
        pytest.skip("root writes read-only files: the final save would succeed (the folder case covers root)")
    watched = case.setup(tmp_path, finished_run)
    before = snapshot(watched)
    with pytest.raises(case.error, match=case.message):
        case.act(tmp_path, watched)
    after = snapshot(watched)
    assert {k: v for k, v in after.items() if k not in case.changes} == \
        {k: v for k, v in before.items() if k not in case.changes}


def test_model_size_limit_can_be_set_or_lifted(monkeypatch):
    from modeling_xl import TransformerXLConfig
    from modeling_xl.size_estimate import ModelTooLargeError, check_model_fits

    huge = TransformerXLConfig.from_preset("debug", n_layer=10**9)
    monkeypatch.setenv("MODELING_XL_MAX_MEMORY", "unlimited")
    assert check_model_fits(huge) > 10**12  # estimated, allowed, nothing built
    monkeypatch.setenv("MODELING_XL_MAX_MEMORY", "10KB")
    with pytest.raises(ModelTooLargeError, match=r"more than the 10,000 bytes available on this machine"):
        check_model_fits(TransformerXLConfig.from_preset("debug"))
    monkeypatch.setenv("MODELING_XL_MAX_MEMORY", "lots")
    with pytest.raises(ValueError, match=r"MODELING_XL_MAX_MEMORY='lots' is invalid; expected a size"):
        check_model_fits(TransformerXLConfig.from_preset("debug"))


# ---------------------------------------------------------------- 13: a short run of a preset does not diverge

class _Stop(Exception):
    pass


def first_tiny_losses(output_dir: Path, steps: int, seed: int = 42, max_grad_norm: float = 0.0,
                      count: int = 30) -> dict[str, float]:
    """The first `count` training losses of `--preset tiny --max_train_steps steps` (builtin corpus, word tokenizer)
    with `--max_grad_norm max_grad_norm`; returns the largest rise above the lowest loss so far and the last loss."""
    from unittest import mock

    from modeling_xl.training import loop

    step_fn, losses = loop.train_step, []

    def counted(*args, **kwargs):
        losses.append(step_fn(*args, **kwargs))
        if len(losses) == count:
            raise _Stop
        return losses[-1]

    args = parse_args(["--preset", "tiny", "--max_train_steps", str(steps), "--output_dir", str(output_dir),
                       "--max_eval_segments", "2", "--disable_tqdm", "--max_grad_norm", str(max_grad_norm),
                       "--seed", str(seed)])
    with mock.patch.object(loop, "train_step", counted), pytest.raises(_Stop):
        run_pretraining(args)
    lowest = [min(losses[: i + 1]) for i in range(len(losses))]
    return {"max_rise": max(loss - low for loss, low in zip(losses, lowest)), "last": losses[-1], "losses": losses}


@pytest.mark.training_outcome
@pytest.mark.long_training
@pytest.mark.parametrize("steps", [400, 1500])
def test_first_steps_of_the_tiny_preset_without_clipping_do_not_spike(tmp_path, steps):
    """`--preset tiny --max_train_steps 400` (warmup scaled to 13 steps) climbed from 7.4 to 24.4 at steps 10-16, and
    the main command (1,500 steps) from 7.1 to 14.7 at steps 15-29, both with clipping at 0.25 (issue 20 item 13,
    issue 23 item 3). The recipe clips again (at 1.0: lower held-out perplexity on three corpora, issue 35 item 5,
    docs/pretraining.md), and `--max_grad_norm 0` is the documented way to avoid the spike: the first 30 steps of the
    real run (builtin corpus, word tokenizer) with it: the loss never rises more than 3.8 above its lowest so far, and
    ends below 7.6. Over 10 draws (seeds 42-46 x 2 CPU kernel sets) the largest rise was 0.39-0.63 at 1,500 steps and
    0.33-2.37 at 400 (the 1.5 asserted until issue 50 failed for seed 44); with clipping it was 5.3 (1.0, the
    recipe's) and 7.6 (0.25) at 1,500 steps, 8.6 and 17.0 at 400: 3.8 lies midway (docs/testing.md)."""
    result = first_tiny_losses(tmp_path / "run", steps)
    curve = [round(x, 2) for x in result["losses"]]
    assert result["max_rise"] < 3.8, curve
    assert result["last"] < 7.6, curve


# ---------------------------------------------------------------- 7: a stalled rank ends the run in bounded time

STALL_DRIVER = textwrap.dedent('''
    """Two-process pretraining on the generated corpus; rank 1 hangs at its third step (it sleeps and never joins
    the step's all-reduce; a SIGSTOPped rank is the same stall, but the launcher's SIGTERM then waits its 30 s grace
    before the SIGKILL)."""
    import sys, time
    sys.path.insert(0, sys.argv.pop(1))
    import test_adversarial as t
    from modeling_xl.training import loop, parse_args, run_pretraining

    step_fn = loop.train_step

    def stalling(accelerator, *args, step, **kwargs):
        if step == 2 and accelerator.process_index == 1:
            time.sleep(3600)
        return step_fn(accelerator, *args, step=step, **kwargs)

    loop.train_step = stalling
    run_pretraining(parse_args(sys.argv[1:]), t.builder)
''')


def test_a_stalled_rank_ends_the_run_after_ddp_timeout(tmp_path):
    """One rank stops inside a step: the other's collective times out after `--ddp_timeout` and ends the launch (the
    launcher then stops the stalled rank), well before the default timeout of 30 minutes."""
    (tmp_path / "driver.py").write_text(STALL_DRIVER)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    result = warm_launch.run(tmp_path / "driver.py",
                             [REPO / "tests", *run_args(tmp_path / "out", "--max_train_steps", "8", "--ddp_timeout", "10")],
                             env=env, cwd=tmp_path, timeout=240, processes=2)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "timed out" in result.stderr.lower() or "timeout" in result.stderr.lower(), result.stderr[-3000:]
    assert elapsed < 200, elapsed


def test_float64_memory_continues_a_float32_model_as_documented():
    """The documented conversion (not an error): memory of another floating dtype is cast to the model's."""
    import torch

    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

    model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug")).eval()
    ids = torch.randint(0, 97, (2, 5))
    mems = model(ids).mems
    as_is, doubled = model(ids, mems=mems), model(ids, mems=[m.double() for m in mems])
    torch.testing.assert_close(doubled.logits, as_is.logits)
    assert doubled.mems[0].dtype == torch.float32
