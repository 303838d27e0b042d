"""lm-evaluation-harness with memory (`modeling_xl.harness`, `scripts/evaluate_harness.py`): local tasks written by
the tests, run offline through lm_eval. Rolling perplexity equals `scripts/evaluate_lm.py`'s on the same text (several
segments, memory carried); multiple choice equals lm_eval's `hf` model when the memory is empty, and when it holds
the whole context; generation continues a context read into the memory; the settings come from the folder's
pretraining run. Skipped where lm-eval is not installed (`pip install "modeling-xl[harness]"`), except the script's
message saying so."""

import importlib.util
import json
import math
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from generated_corpora import wikitext_lines

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

REPO = Path(__file__).resolve().parents[1]
needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                   reason="lm-eval is not installed (pip install \"modeling-xl[harness]\")")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small causal LM with a word-level tokenizer trained on generated WikiText-like lines, and the evaluation
    settings a pretraining run records."""
    from tokenization import train_word_level_tokenizer

    root = tmp_path_factory.mktemp("harness")
    tokenizer = train_word_level_tokenizer([line for line in wikitext_lines(400) if line.strip()])
    torch.manual_seed(0)
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[40, 120], mem_len=8,
                                            init_std=0.3)  # weights large enough that the context matters
    TransformerXLForCausalLM(config).save_pretrained(root / "lm")
    tokenizer.save_pretrained(root / "lm")
    (root / "lm" / "training_config.json").write_text(json.dumps(
        {"eval_tgt_len": 16, "eval_mem_len": 24, "eval_clamp_len": -1, "eval_same_length": False}))
    return root / "lm"


def documents() -> list[str]:
    """Two one-line documents: one of several segments (about 110 tokens), one short."""
    lines = [line.strip() for line in wikitext_lines(200, seed=3) if len(line.split()) > 20]
    return [" ".join(lines[:2]), lines[2][:80].rsplit(" ", 1)[0]]


def write_tasks(root: Path) -> Path:
    """A perplexity task (`loglikelihood_rolling` over `docs.jsonl`) and a multiple-choice task (`mc.jsonl`)."""
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents()))
    words = [line.split() for line in wikitext_lines(60, seed=4) if len(line.split()) > 12]
    questions = [{"question": " ".join(w[:8]), "choices": [" ".join(w[8:10]), w[11], " ".join(w[3:6])],
                  "label": i % 3} for i, w in enumerate(words[:4])]
    questions.append({"question": " ".join(words[5][:30]), "choices": [words[6][0], " ".join(words[6][1:3])],
                      "label": 1})  # a context longer than a segment (16): read into the memory
    (tasks / "mc.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    for name, body in (("ppl", """\
            output_type: loglikelihood_rolling
            doc_to_text: ""
            doc_to_target: "{{text}}"
            metric_list:
              - metric: word_perplexity
            """), ("mc", """\
            output_type: multiple_choice
            doc_to_text: "{{question}}"
            doc_to_target: label
            doc_to_choice: choices
            metric_list:
              - metric: acc
            """)):
        data = tasks / ("docs.jsonl" if name == "ppl" else "mc.jsonl")
        (tasks / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            task: xl_{name}
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {data}
            test_split: test
            """) + textwrap.dedent(body))
    return tasks


def evaluate(model: str, model_args: str, tasks: Path, names: list[str]) -> dict:
    import modeling_xl.harness  # noqa: F401  (registers transformer-xl)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tasks), include_defaults=False)  # not lm_eval's own thousands of tasks
    return simple_evaluate(model=model, model_args=model_args, tasks=names, log_samples=True, batch_size=2,
                           device="cpu", task_manager=manager)


def sample_scores(results: dict, task: str) -> list:
    """Each sample's log-likelihood(s), in document order."""
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return [[float(r[0][0]) if isinstance(r[0], (list, tuple)) else float(r[0]) for r in s["resps"]] for s in samples]


@needs_lm_eval
def test_rolling_perplexity_equals_evaluate_lm_on_the_same_text(tmp_path, folder, one_thread):
    """Each document read 16 tokens at a time with memory 24 (several segments): its log-likelihood is
    `scripts/evaluate_lm.py`'s total NLL over the same tokens (the stream `<eos>` + document + `<eos>`, every token
    but the first scored), and the word perplexity lm_eval reports follows from them."""
    tasks = write_tasks(tmp_path)
    results = evaluate("transformer-xl", f"pretrained={folder}", tasks, ["xl_ppl"])
    ours = [scores[0] for scores in sample_scores(results, "xl_ppl")]
    script = load_script("evaluate_lm")
    nlls = []
    for i, document in enumerate(documents()):
        data = tmp_path / f"doc{i}.txt"
        data.write_text(f"\n{document}\n")  # the empty line is the `<eos>` lm_eval starts from
        assert script.main([str(folder), "--dataset_name", str(data), "--split", "train", "--tgt_len", "16",
                            "--mem_len", "24", "--output_dir", str(tmp_path / f"eval{i}")]) == 0
        evaluation = json.loads((tmp_path / f"eval{i}" / "lm_evaluation.json").read_text())["evaluation"]
        nlls.append(evaluation["loss"] * evaluation["tokens"])
    assert evaluation["tokens"] > 16 or nlls  # the short one fits a segment; the long one needs several
    assert [-s for s in ours] == pytest.approx(nlls, rel=1e-5)
    words = sum(len(d.split()) for d in documents())
    assert results["results"]["xl_ppl"]["word_perplexity,none"] == pytest.approx(math.exp(sum(nlls) / words),
                                                                                 rel=1e-5)


@needs_lm_eval
def test_multiple_choice_equals_the_hf_model_when_the_memory_is_empty(tmp_path, folder, one_thread):
    """Contexts shorter than a segment: the same log-likelihoods as lm_eval's `hf` model (whose windows of 2048
    tokens hold every request whole; `add_bos_token=False`: context and continuation without the tokenizer's
    `<eos>`, as ours are split). The last context is longer than a segment: read into a memory that holds all of it,
    it gives `hf`'s numbers too; with a memory of 4 tokens it does not (less context)."""
    tasks = write_tasks(tmp_path)
    hf = evaluate("hf", f"pretrained={folder},trust_remote_code=True,add_bos_token=False", tasks, ["xl_mc"])
    ours = evaluate("transformer-xl", f"pretrained={folder},mem_len=64", tasks, ["xl_mc"])
    short = evaluate("transformer-xl", f"pretrained={folder},mem_len=4", tasks, ["xl_mc"])
    want, got, less = (sample_scores(results, "xl_mc") for results in (hf, ours, short))
    for expected, actual in zip(want, got):
        assert actual == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert ours["results"]["xl_mc"]["acc,none"] == hf["results"]["xl_mc"]["acc,none"]
    for expected, shorter in zip(want[:4], less[:4]):
        assert shorter == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert less[4] != pytest.approx(want[4], rel=1e-3)


@needs_lm_eval
def test_generate_until_continues_a_context_read_into_the_memory(folder, one_thread):
    """A context of 40 tokens (three segments of 16) read into a memory that holds it all: `generate_until` gives the
    tokens `generate` gives on the whole context at once, cut before the `until` string."""
    from modeling_xl.harness import TransformerXLLM

    lm = TransformerXLLM(pretrained=str(folder), mem_len=64)
    words = " ".join(line.strip() for line in wikitext_lines(40, seed=5) if line.strip()).split()
    context = " ".join(words[:40])
    ids = torch.tensor([lm.tok_encode(context, add_special_tokens=False)])
    assert ids.size(1) > 2 * lm.settings["tgt_len"]
    with torch.no_grad():
        lm.model.config.mem_len = 64
        whole = lm.model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)
    text = lm.tokenizer.decode(whole[0, ids.size(1):])
    request = SimpleNamespace(args=(context, {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}))
    assert lm.generate_until([request]) == [text.split("<eos>")[0]]
    stop = text.split()[2]
    request = SimpleNamespace(args=(context, {"until": [f" {stop}"], "max_gen_toks": 6}))
    assert lm.generate_until([request]) == [text[: text.index(f" {stop}")]]


@needs_lm_eval
def test_bad_model_args_are_named(folder, tmp_path):
    from modeling_xl.harness import TransformerXLLM

    with pytest.raises(ValueError, match=r"batch_size='auto' is invalid; expected a positive integer"):
        TransformerXLLM(pretrained=str(folder), batch_size="auto")
    with pytest.raises(ValueError, match=r"tgt_len=0 is invalid"):
        TransformerXLLM(pretrained=str(folder), tgt_len=0)
    with pytest.raises(ValueError, match=r"dtype='float33' is invalid"):
        TransformerXLLM(pretrained=str(folder), dtype="float33")
    bi = TransformerXLConfig.from_preset("debug", adaptive=False, cutoffs=[], tie_projs=[False], attn_type="bi")
    from modeling_xl import TransformerXLForPermutationLM

    TransformerXLForPermutationLM(bi).save_pretrained(tmp_path / "plm")
    with pytest.raises(ValueError, match=r"is a permutation LM"):
        TransformerXLLM(pretrained=str(tmp_path / "plm"))


def test_settings_come_from_the_pretraining_run_and_given_values_win(tmp_path):
    from modeling_xl.harness.settings import evaluation_settings

    config = TransformerXLConfig.from_preset("debug", mem_len=8, clamp_len=-1, same_length=False)
    plain = evaluation_settings(tmp_path, config)
    assert {k: plain[k] for k in ("tgt_len", "mem_len", "clamp_len", "same_length")} == {
        "tgt_len": 64, "mem_len": 8, "clamp_len": -1, "same_length": False}
    (tmp_path / "training_config.json").write_text(json.dumps(
        {"eval_tgt_len": 32, "eval_mem_len": 128, "eval_clamp_len": 100, "eval_same_length": True}))
    saved = evaluation_settings(tmp_path, config, mem_len=256)
    assert (saved["tgt_len"], saved["mem_len"], saved["clamp_len"], saved["same_length"]) == (32, 256, 100, True)
    assert "training_config.json" in saved["source"]
    with pytest.raises(ValueError, match=r"mem_len=-2 is invalid; expected an integer >= 0"):
        evaluation_settings(tmp_path, config, mem_len=-2)


def test_script_adds_our_model_only_where_none_is_named_and_names_the_missing_extra(capsys):
    script = load_script("evaluate_harness")
    with mock.patch.dict(sys.modules, {"modeling_xl.harness": SimpleNamespace(MODEL_NAME="transformer-xl")}):
        assert script.with_default_model(["--tasks", "x"]) == ["--tasks", "x", "--model", "transformer-xl"]
        assert script.with_default_model(["run", "--tasks", "x"])[-2:] == ["--model", "transformer-xl"]
        assert script.with_default_model(["--model", "hf", "--tasks", "x"]) == ["--model", "hf", "--tasks", "x"]
        assert script.with_default_model(["--model=hf"]) == ["--model=hf"]
        assert script.with_default_model(["ls", "tasks"]) == ["ls", "tasks"]
    with mock.patch.dict(sys.modules, {"lm_eval": None, "lm_eval.__main__": None, "modeling_xl.harness": None}):
        assert script.main(["--tasks", "x"]) == 1
    assert 'pip install "modeling-xl[harness]"' in capsys.readouterr().err


@needs_lm_eval
def test_script_runs_lm_evals_command_line_with_our_model(tmp_path, folder, one_thread, monkeypatch):
    """`scripts/evaluate_harness.py` with lm_eval's own arguments and no `--model`: our model, the folder's settings;
    the results file is lm_eval's."""
    from lm_eval.tasks import TaskManager

    tasks = write_tasks(tmp_path)
    monkeypatch.setattr(sys, "argv", ["evaluate_harness.py"])
    indexing = TaskManager.__init__  # lm_eval's own thousands of tasks are indexed by every run: minutes here
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *a, **k: indexing(self, *a, **{
        **k, "include_defaults": False}))
    code = load_script("evaluate_harness").main(
        ["--model_args", f"pretrained={folder}", "--tasks", "xl_ppl", "--include_path", str(tasks),
         "--device", "cpu", "--output_path", str(tmp_path / "results")])
    assert code == 0
    found = list((tmp_path / "results").rglob("results_*.json"))
    assert len(found) == 1, found
    results = json.loads(found[0].read_text())
    assert results["config"]["model"] == "transformer-xl"
    assert results["results"]["xl_ppl"]["word_perplexity,none"] > 1
