"""Long-context LM evaluation: stream perplexity, memory sweep, vanilla baseline, results/model card, the CLI."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
from modeling_xl.data.streams import EvalStreams
from modeling_xl.evaluation.long_context import (
    evaluate_stream,
    load_eval_tokens,
    memory_sweep,
    reuse_vs_vanilla,
    sweep_table,
    vanilla_nll,
)
from modeling_xl.evaluation.stream_scoring import evaluate_causal_lm
from modeling_xl.runtime.run_folder import update_card_section

REPO = Path(__file__).resolve().parents[1]


def lm(**overrides):
    return TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", **overrides)).eval()


def full_pass_nll(model, tokens):
    """Naive reference: one forward over the whole stream, no memory needed."""
    with torch.no_grad():
        out = model(tokens[None, :-1], next_token_labels=tokens[None, 1:])
    return float(out.losses.double().sum()), tokens.numel() - 1


def test_stream_with_memory_covering_everything_equals_one_pass():
    model = lm()
    tokens = torch.randint(0, 97, (41,))
    nll, count = full_pass_nll(model, tokens)
    result = evaluate_stream(model, tokens, tgt_len=7, mem_len=64)
    assert result["tokens"] == count == 40
    assert result["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert result["attended_context"] == 71 and model.config.mem_len == 8  # settings restored


def test_same_numbers_as_the_training_runs_evaluation():
    model = lm()
    tokens = torch.randint(0, 97, (203,))
    ours = evaluate_stream(model, tokens, tgt_len=8, mem_len=16, clamp_len=5, same_length=True, batch_size=3)
    batches = EvalStreams(tokens, 3, 8)
    theirs = evaluate_causal_lm(model, model.config, batches, eval_mem_len=16, eval_clamp_len=5, eval_same_length=True,
                                device=torch.device("cpu"))
    assert ours["tokens"] == theirs["eval_tokens"] == 202
    assert ours["perplexity"] == pytest.approx(theirs["perplexity"], rel=1e-9)


def test_same_length_is_reported_as_used():
    model, tokens = lm(), torch.randint(0, 97, (30,))
    no_memory, memory = memory_sweep(model, tokens, [0, 4], tgt_len=8, same_length=True)
    assert no_memory["same_length"] is False and memory["same_length"] is True  # the mask ignores it without memory


def test_bits_per_character():
    model = lm()
    tokens = torch.randint(0, 97, (30,))
    result = evaluate_stream(model, tokens, tgt_len=8, mem_len=8, char_level=True)
    assert result["bpc"] == pytest.approx(result["loss"] / math.log(2))


def test_vanilla_equals_a_naive_loop_and_reuse_with_the_same_context():
    model = lm()
    tokens = torch.randint(0, 97, (40,))
    nll, count, _ = vanilla_nll(model, tokens, context_len=6, num_targets=5, batch_size=2)
    naive = 0.0
    for t in range(6, 11):
        with torch.no_grad():
            naive -= float(model(tokens[None, t - 6 : t]).logits[0, -1, tokens[t]])
    assert count == 5 and nll == pytest.approx(naive, rel=1e-5)
    # one target: the state-reuse query sees exactly the vanilla window (tokens [0, context_len)), same distances
    one = reuse_vs_vanilla(model, tokens, context_len=9, num_targets=1, tgt_len=4)
    assert one["reuse_perplexity"] == pytest.approx(one["vanilla_perplexity"], rel=1e-5)
    many = reuse_vs_vanilla(model, tokens, context_len=9, num_targets=20, tgt_len=4, vanilla_batch_size=4)
    assert many["targets"] == 20 and many["speedup"] > 0


def test_memory_sweep_table():
    model = lm()
    rows = memory_sweep(model, torch.randint(0, 97, (60,)), [0, 4, 16], tgt_len=5)
    assert [r["mem_len"] for r in rows] == [0, 4, 16] and [r["attended_context"] for r in rows] == [5, 9, 21]
    table = sweep_table(rows).splitlines()
    assert len(table) == 5 and table[2].startswith("| 0 | 5 | 5 | ")


@pytest.mark.parametrize("call, match", [
    (lambda m, t: evaluate_stream(m, t, tgt_len=0, mem_len=4), r"tgt_len=0 is invalid"),
    (lambda m, t: evaluate_stream(m, t, tgt_len=4, mem_len=-1), r"mem_len=-1 is invalid"),
    (lambda m, t: memory_sweep(m, t, [], tgt_len=4), r"mem_lens is empty"),
    (lambda m, t: vanilla_nll(m, t, context_len=15, num_targets=10), r"context_len=15 \+ num_targets=10 exceeds"),
    (lambda m, t: vanilla_nll(m, t, context_len=0, num_targets=1), r"context_len=0 is invalid"),
    (lambda m, t: vanilla_nll(m, t, context_len=4, num_targets=0), r"num_targets=0 is invalid; expected a positive"),
    (lambda m, t: vanilla_nll(m, t, context_len=4, num_targets=-4), r"num_targets=-4 is invalid"),
    (lambda m, t: vanilla_nll(m, t, context_len=4, num_targets=2, batch_size=0), r"batch_size=0 is invalid"),
    (lambda m, t: reuse_vs_vanilla(m, t, context_len=4, num_targets=-4, tgt_len=4), r"num_targets=-4 is invalid"),
    (lambda m, t: reuse_vs_vanilla(m, t, context_len=4, num_targets=2, tgt_len=0), r"tgt_len=0 is invalid"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(lm(), torch.randint(0, 97, (20,)))


def test_card_section_is_appended_then_replaced(tmp_path):
    card = tmp_path / "README.md"
    card.write_text("# model\n\nintro\n")
    update_card_section(card, "lm-evaluation", "## Results\nppl 10")
    update_card_section(card, "other", "## Other")
    update_card_section(card, "lm-evaluation", "## Results\nppl 9")
    text = card.read_text()
    assert text.startswith("# model\n\nintro\n") and "ppl 9" in text and "ppl 10" not in text
    assert text.count("<!-- lm-evaluation:start -->") == 1 and "## Other" in text


@pytest.mark.parametrize("markers", ["<!-- lm-evaluation:start -->\nold", "old\n<!-- lm-evaluation:end -->",
                                     "<!-- lm-evaluation:end -->\nx\n<!-- lm-evaluation:start -->"])
def test_card_section_with_hand_edited_markers_is_refused_and_kept(tmp_path, markers):
    card = tmp_path / "README.md"
    card.write_text(f"# model\n\n{markers}\nnotes the user wrote\n")
    before = card.read_text()
    with pytest.raises(ValueError, match=r"lm-evaluation:start -->' [01] time\(s\) and .* expected each once"):
        update_card_section(card, "lm-evaluation", "## Results\nppl 9")
    assert card.read_text() == before


def test_card_section_write_that_fails_leaves_the_card_as_it_was(tmp_path):
    card = tmp_path / "README.md"
    card.write_text("# model\n\nnotes the user wrote\n")
    before = card.read_text()
    with pytest.raises(UnicodeEncodeError):  # fails while the new card is being written
        update_card_section(card, "lm-evaluation", "## Results\nppl \ud800")
    assert card.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checkpoint(tmp_path):
    """A debug-sized causal LM with a word-level tokenizer, and a two-split text corpus folder."""
    from tokenization import train_word_level_tokenizer

    lines = [" ".join(f"w{(i * 7 + j * 3) % 40}" for j in range(12)) for i in range(80)]
    tokenizer = train_word_level_tokenizer(lines)
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10, 30])
    model = TransformerXLForCausalLM(config)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "README.md").write_text("# tiny\n\nTrained for a test.\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("\n".join(lines[:60]) + "\n")
    (corpus / "valid.txt").write_text("\n".join(lines[60:]) + "\n")
    return tmp_path / "ckpt", corpus, model, tokenizer


def test_evaluate_lm_script_writes_json_plot_and_card(checkpoint):
    folder, corpus, model, tokenizer = checkpoint
    script = load_script("evaluate_lm")
    code = script.main([str(folder), "--dataset_name", str(corpus), "--split", "validation", "--tgt_len", "8",
                        "--mem_len", "16", "--mem_lens", "0", "8", "16", "--vanilla", "--context_len", "12",
                        "--vanilla_targets", "10"])
    assert code == 0
    results = json.loads((folder / "lm_evaluation.json").read_text())
    tokens = torch.tensor([i for line in (corpus / "valid.txt").read_text().splitlines()
                           for i in tokenizer(line)["input_ids"]])
    assert results["evaluation"]["tokens"] == tokens.numel() - 1 == 20 * 13 - 1  # `<eos>` after every line
    direct = evaluate_stream(model.eval(), tokens, tgt_len=8, mem_len=16)
    assert results["evaluation"]["perplexity"] == pytest.approx(direct["perplexity"], rel=1e-6)
    assert [r["mem_len"] for r in results["sweep"]] == [0, 8, 16] and results["vanilla"]["targets"] == 10
    assert (folder / "memory_sweep.png").stat().st_size > 1000
    card = (folder / "README.md").read_text()
    assert card.startswith("# tiny") and "Memory-length sweep" in card and "faster" in card


def test_evaluate_lm_script_bad_input(checkpoint, tmp_path, capsys):
    folder, corpus, *_ = checkpoint
    script = load_script("evaluate_lm")
    assert script.main([str(tmp_path / "missing"), "--dataset_name", str(corpus)]) == 1
    assert "has no config.json" in capsys.readouterr().err
    assert script.main([str(folder), "--dataset_name", str(corpus), "--split", "test"]) == 1
    assert "split='test' is not in" in capsys.readouterr().err


def test_evaluate_lm_script_names_a_permutation_lm_folder(checkpoint, tmp_path, capsys):
    from modeling_xl import TransformerXLForPermutationLM

    _, corpus, _, tokenizer = checkpoint
    config = TransformerXLConfig(vocab_size=len(tokenizer), d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32,
                                 adaptive=False, attn_type="bi", ff_activation="gelu", reuse_len=3)
    TransformerXLForPermutationLM(config).save_pretrained(tmp_path / "plm")
    tokenizer.save_pretrained(tmp_path / "plm")
    assert load_script("evaluate_lm").main([str(tmp_path / "plm"), "--dataset_name", str(corpus)]) == 1
    assert "is a permutation LM (bidirectional, attn_type 'bi': pretrained with --objective plm, or converted from " \
           "XLNet); expected a causal LM (attn_type 'uni')" in capsys.readouterr().err
    (tmp_path / "plm" / "config.json").write_text('{"attn_type": "bi",')
    assert load_script("evaluate_lm").main([str(tmp_path / "plm"), "--dataset_name", str(corpus)]) == 1
    assert "config.json is not valid JSON" in capsys.readouterr().err


def test_max_eval_tokens(checkpoint):
    _, corpus, _, tokenizer = checkpoint
    args = (tokenizer, str(corpus), None, "validation", "text")
    assert load_eval_tokens(*args, None).numel() == 20 * 13 and load_eval_tokens(*args, 2).numel() == 2
    for bad in (0, 1, -3):  # 0 used to mean the whole split and -3 to drop the last 3 tokens
        with pytest.raises(ValueError, match=rf"max_eval_tokens={bad} is invalid; expected an integer >= 2"):
            load_eval_tokens(*args, bad)


@pytest.mark.parametrize("argv, match", [
    (["--max_eval_tokens", "0"], r"max_eval_tokens=0 is invalid; expected an integer >= 2"),
    (["--mem_lens", "0", "-3"], r"mem_lens=-3 is invalid; expected an integer >= 0"),
    (["--mem_len", "-1"], r"mem_len=-1 is invalid"),
    (["--tgt_len", "0"], r"tgt_len=0 is invalid; expected a positive integer"),
    (["--batch_size", "0"], r"batch_size=0 is invalid"),
    (["--clamp_len", "-2"], r"clamp_len=-2 is invalid; expected -1 \(no clamping\) or a distance >= 0"),
    (["--vanilla", "--context_len", "0"], r"context_len=0 is invalid"),
    (["--vanilla", "--vanilla_targets", "0"], r"vanilla_targets=0 is invalid; expected a positive integer"),
    (["--vanilla", "--vanilla_targets", "-4"], r"vanilla_targets=-4 is invalid"),
    (["--vanilla", "--vanilla_batch_size", "0"], r"vanilla_batch_size=0 is invalid"),
    (["--threads", "0"], r"threads=0 is invalid"),
])
def test_evaluate_lm_script_checks_arguments_before_loading(tmp_path, capsys, argv, match):
    script = load_script("evaluate_lm")
    # no checkpoint there: the argument's error must come before the model is loaded
    assert script.main([str(tmp_path / "missing"), *argv]) == 1
    assert re.search(match, capsys.readouterr().err)


def test_evaluate_lm_script_rejects_empty_mem_lens(tmp_path, capsys):
    with pytest.raises(SystemExit):  # argparse: "expected at least one argument" (an empty sweep was silently skipped)
        load_script("evaluate_lm").main([str(tmp_path / "missing"), "--mem_lens"])
    assert "--mem_lens" in capsys.readouterr().err


def test_evaluate_lm_script_checks_the_vanilla_span_before_evaluating(checkpoint, capsys):
    folder, corpus, *_ = checkpoint
    code = load_script("evaluate_lm").main([str(folder), "--dataset_name", str(corpus), "--tgt_len", "8", "--vanilla",
                                            "--context_len", "250", "--vanilla_targets", "20"])
    out = capsys.readouterr()
    assert code == 1 and "context_len=250 + vanilla_targets=20 exceeds the 260 tokens" in out.err
    assert "perplexity" not in out.out and not (folder / "lm_evaluation.json").exists()  # nothing evaluated
