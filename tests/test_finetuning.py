"""Fine-tuning (`modeling_xl.finetuning`, `scripts/finetune_classification.py`): every task shape end to end through
the script, bad rows named before training, nothing lost after training, resume, the transformers ecosystem."""

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch
import warm_launch
from transformers import AutoModelForSequenceClassification

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForSequenceClassification
from modeling_xl.finetuning import FinetuneArguments, run_finetuning

REPO = Path(__file__).resolve().parents[1]
POSITIVE, NEGATIVE = ("good", "great", "fine", "nice"), ("bad", "awful", "poor", "dull")
TOPICS = {"sport": ("goal", "match", "team"), "food": ("bread", "soup", "cake"), "music": ("song", "drum", "band"),
          "weather": ("rain", "snow", "wind")}


def sentiment_rows(n, seed):
    """Sentences whose label is carried by one sentiment word among filler words."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        label = int(torch.randint(0, 2, (1,), generator=generator))
        words = [f"w{int(i)}" for i in torch.randint(0, 20, (int(torch.randint(3, 9, (1,), generator=generator)),),
                                                     generator=generator)]
        cue = (POSITIVE if label else NEGATIVE)[int(torch.randint(0, 4, (1,), generator=generator))]
        words.insert(int(torch.randint(0, len(words) + 1, (1,), generator=generator)), cue)
        rows.append((" ".join(words), label))
    return rows


def topic_rows(n, seed, topics=tuple(TOPICS)):
    """(text, set of topics): each topic present puts one of its words among filler words."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        present = {t for t in topics if float(torch.rand((), generator=generator)) < 0.4} or {topics[0]}
        words = [f"w{int(i)}" for i in torch.randint(0, 20, (4,), generator=generator)]
        for topic in sorted(present):
            words.insert(int(torch.randint(0, len(words) + 1, (1,), generator=generator)),
                         TOPICS[topic][int(torch.randint(0, 3, (1,), generator=generator))])
        rows.append((" ".join(words), present))
    return rows


def one_topic_rows(n, seed):
    """(text, topic name): one topic drawn uniformly, one of its words among filler words."""
    generator = torch.Generator().manual_seed(seed)
    names = sorted(TOPICS)
    rows = []
    for _ in range(n):
        topic = names[int(torch.randint(0, len(names), (1,), generator=generator))]
        words = [f"w{int(i)}" for i in torch.randint(0, 20, (int(torch.randint(2, 7, (1,), generator=generator)),),
                                                     generator=generator)]
        words.insert(int(torch.randint(0, len(words) + 1, (1,), generator=generator)),
                     TOPICS[topic][int(torch.randint(0, 3, (1,), generator=generator))])
        rows.append((" ".join(words), topic))
    return rows


def write_tsv(path, rows, header=("sentence", "label")):
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, row)) + "\n" for row in rows))
    return path


def vocabulary_lines():
    return ([text for text, _ in sentiment_rows(200, 0)] + [text for text, _ in topic_rows(200, 0)]
            + [text for text, _ in one_topic_rows(200, 0)]
            + [" ".join(w for words in TOPICS.values() for w in words) + " " + " ".join(POSITIVE + NEGATIVE)])


def make_lm_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A fresh debug-preset causal LM (weights drawn from `seed`) and a word tokenizer of the tasks' words."""
    from tokenization import train_word_level_tokenizer

    tokenizer = train_word_level_tokenizer(vocabulary_lines())
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10])
    torch.manual_seed(seed)
    TransformerXLForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def lm_checkpoint(tmp_path):
    return make_lm_checkpoint(tmp_path / "lm")


def finetune_args(tmp_path, checkpoint, **overrides):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(256, 1))
    dev = write_tsv(tmp_path / "dev.tsv", sentiment_rows(64, 2))
    values = dict(model_name_or_path=str(checkpoint), output_dir=str(tmp_path / "out"), train_file=str(train),
                  validation_file=str(dev), per_device_train_batch_size=16, learning_rate=3e-3, num_train_epochs=3,
                  num_warmup_steps=0, eval_steps=24, checkpointing_steps=40, disable_tqdm=True)
    return FinetuneArguments(**{**values, **overrides})


def load_script():
    spec = importlib.util.spec_from_file_location("finetune", REPO / "scripts" / "finetune_classification.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def run_script(tmp_path, checkpoint, train, dev, *extra, output="out"):
    code = load_script().main(["--model_name_or_path", str(checkpoint), "--output_dir", str(tmp_path / output),
                               "--train_file", str(train), "--validation_file", str(dev), "--disable_tqdm",
                               "--per_device_train_batch_size", "16", "--learning_rate", "3e-3",
                               "--num_warmup_steps", "0", *extra])
    assert code == 0
    return json.loads((tmp_path / output / "classification_results.json").read_text())


def test_finetuning_keeps_freed_host_memory_before_its_training_loop(tmp_path, lm_checkpoint, one_thread):
    """`runs.keep_freed_host_memory` runs once, with the run's device, after the data and the model exist and before the
    first step."""
    from modeling_xl.finetuning import loop

    events = []
    real_loop = loop.train_loop
    with mock.patch.object(loop, "keep_freed_host_memory", side_effect=lambda device: events.append(device)), \
            mock.patch.object(loop, "train_loop",
                              side_effect=lambda *a, **k: events.append("train_loop") or real_loop(*a, **k)):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, max_train_steps=2, eval_steps=2))
    assert events == [torch.device("cpu"), "train_loop"]


# ---- every task shape, end to end through the script ---------------------------------------------------------------

def binary_task_results(tmp_path, checkpoint, seed: int = 42, **overrides) -> dict:
    """One sentiment word among filler words, 256 rows, 6 epochs (96 steps); the results of `run_finetuning`. At 3
    epochs 2 draws of 5 were still at chance (0.44): the last position had not yet learned to read the word
    (docs/testing.md); at 6 every draw of 8 reached 1.0."""
    return run_finetuning(finetune_args(tmp_path, checkpoint, seed=seed, **{"num_train_epochs": 6, **overrides}))


@pytest.mark.training_outcome
def test_binary_task_learns_and_writes_model_card_checkpoints_and_results(tmp_path, lm_checkpoint, one_thread):
    results = binary_task_results(tmp_path, lm_checkpoint)
    out = tmp_path / "out"
    assert results["train_steps"] == 96 and len(results["history"]) == 4
    assert results["dev"]["accuracy"] > 0.9, results["dev"]
    assert set(results["dev"]) >= {"accuracy", "macro_f1", "f1", "per_class_f1", "eval_loss"}
    saved = json.loads((out / "classification_results.json").read_text())
    assert saved["dev"]["accuracy"] == pytest.approx(results["dev"]["accuracy"])
    assert (out / "checkpoint-40").is_dir()
    card = (out / "README.md").read_text()
    assert f"{results['dev']['accuracy']:.4f}" in card and "model-index" in card and "macro F1" in card
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.id2label == {0: "0", 1: "1"} and model.config.problem_type == "single_label_classification"


def four_topics_results(tmp_path, checkpoint, seed: int = 42, *extra: str) -> dict:
    """One topic word (of four topics) among filler words, 320 rows, 10 epochs, through the script. The classifier
    reads the mean of the positions (`--summary_type mean`), where each word is one step away: with the last position
    2 draws of 5 stopped at 0.47, telling only two pairs of topics apart (docs/testing.md)."""
    train = write_tsv(tmp_path / "train.tsv", one_topic_rows(320, 1))
    dev = write_tsv(tmp_path / "dev.tsv", one_topic_rows(100, 2))
    return run_script(tmp_path, checkpoint, train, dev, "--num_train_epochs", "10", "--eval_steps", "40",
                      "--summary_type", "mean", "--seed", str(seed), *extra)


@pytest.mark.training_outcome
def test_string_labels_with_more_than_two_classes(tmp_path, lm_checkpoint, one_thread):
    """Four topics named by strings (the issue's crash: more than two classes failed at the first evaluation)."""
    results = four_topics_results(tmp_path, lm_checkpoint)
    dev_scores = results["dev"]
    assert results["labels"] == ["food", "music", "sport", "weather"] and results["problem_type"] == (
        "single_label_classification")
    # lowest of 8 draws 0.89 (docs/testing.md); 0.7 stays far above the two-pairs plateau (0.47) and chance (0.25)
    assert dev_scores["accuracy"] > 0.7 and dev_scores["macro_f1"] > 0.7, dev_scores
    assert sorted(dev_scores["per_class_f1"]) == ["food", "music", "sport", "weather"] and "f1" not in dev_scores
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.id2label == {0: "food", 1: "music", 2: "sport", 3: "weather"}
    assert model.config.label2id["weather"] == 3


def second_text_sentiment_results(tmp_path, checkpoint, seed: int = 42, *extra: str) -> dict:
    """Pairs whose label is the sentiment of the second text (the first has its own sentiment word), 600 rows, 4
    epochs, through the script."""
    first, second = sentiment_rows(700, 1), sentiment_rows(700, 3)
    rows = [(a, b, label) for (a, _), (b, label) in zip(first, second)]
    train = write_tsv(tmp_path / "train.tsv", rows[:600], header=("first", "second", "label"))
    dev = write_tsv(tmp_path / "dev.tsv", rows[600:], header=("first", "second", "label"))
    return run_script(tmp_path, checkpoint, train, dev, "--text_column", "first", "--text_pair_column", "second",
                      "--num_train_epochs", "4", "--seed", str(seed), *extra)


@pytest.mark.training_outcome
def test_text_pairs_with_the_word_level_layout(tmp_path, lm_checkpoint, one_thread):
    """The label is the sentiment of the SECOND text; the first carries a sentiment word of its own (a distractor):
    the model must read the pair `A <eos> B <eos>` and tell the texts apart."""
    results = second_text_sentiment_results(tmp_path, lm_checkpoint)
    assert results["dev"]["accuracy"] > 0.85, results["dev"]


PAIR_MATCH = dict(summary="mean", layers=4, epochs=6)  # the cell of benchmarks/bench_pair_summary.py this test runs


def pair_match_results(tmp_path, seed: int = 0, **overrides) -> dict:
    """`bench_pair_summary.run_match` (does B repeat A?) in the cell `PAIR_MATCH`; the script's results."""
    spec = importlib.util.spec_from_file_location("bench_pair_summary", REPO / "benchmarks" / "bench_pair_summary.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.run_match(tmp_path, seed=seed, **{**PAIR_MATCH, **overrides})


@pytest.mark.training_outcome
@pytest.mark.long_training
def test_a_pair_label_that_only_comparing_the_texts_gives_is_learned(tmp_path, one_thread):
    """The pair check of issue 35: does B repeat A? Neither text alone says it; the model must match B to A token by
    token across the `A <eos> B <eos>` layout. A 4-layer model (the `tiny` preset's depth) from scratch learns it;
    chance is 0.5 (the task, and the seeds and summaries measured beside this one: benchmarks/bench_pair_summary.py).
    The classifier reads the mean of the positions: with the default summary (the last position, 10 epochs) 2
    draws of 10 (5 seeds x 2 CPU kernel sets) were still at 0.66 and 0.77, the others at 0.92-0.99 (docs/testing.md)."""
    results = pair_match_results(tmp_path)
    assert results["dev"]["accuracy"] > 0.8, results["dev"]
    assert results["dev"]["eval_loss"] < 0.5, results["dev"]  # chance is ln 2 = 0.69


def test_the_pair_summary_reads_both_texts_and_the_bidirectional_one_the_segment_ids(tmp_path, lm_checkpoint):
    """Cross-encoding: the summary position the classifier pools has read both texts of a pair (a word changed in
    either text changes the logits), and the bidirectional backbone also reads XLNet's segment ids (the same tokens
    with other segment ids give other logits). Whether a model then learns a label that needs both texts is measured
    on `builtin-pairs` (docs/finetuning.md): from the main command's model, above chance and above a TF-IDF cosine."""
    import datasets
    from transformers import AutoTokenizer

    from modeling_xl.finetuning.data import left_pad_collate, tokenize_split
    from tokenization import train_unigram_tokenizer

    def logits(model, tokenizer, pairs, keep_types):
        data = datasets.Dataset.from_dict({"a": [a for a, _ in pairs], "b": [b for _, b in pairs], "label": [0] * 3})
        args = FinetuneArguments(model_name_or_path="unused", output_dir="unused", text_column="a",
                                 text_pair_column="b", max_length=64)
        encoded = tokenize_split(data, [0] * 3, tokenizer, args, keep_token_types=keep_types)
        batch = left_pad_collate(tokenizer.pad_token_id or 0)([encoded[i] for i in range(3)])
        batch.pop("labels")
        with torch.no_grad():
            return model(**batch).logits, batch

    def differ(x, y):  # relative to the logits' size, a hundred times float32 rounding (measured: 6e-4 to 2e-3)
        return float((x - y).abs().max()) > 1e-5 * float(x.abs().max())

    pairs = [("good w1 w2", "w3 bad"), ("fine w1 w2", "w3 bad"), ("good w1 w2", "w3 poor")]
    torch.manual_seed(0)
    causal = TransformerXLForSequenceClassification.from_pretrained(lm_checkpoint, num_labels=2).eval()
    out, _ = logits(causal, AutoTokenizer.from_pretrained(lm_checkpoint), pairs, keep_types=False)
    assert differ(out[0], out[1]) and differ(out[0], out[2])  # A read, B read

    unigram = train_unigram_tokenizer([text for text, _ in sentiment_rows(300, 0)], vocab_size=60)
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(unigram), cutoffs=[], adaptive=False,
                                             attn_type="bi", num_labels=2)
    bidirectional = TransformerXLForSequenceClassification(config).eval()
    with torch.no_grad():  # the segment embeddings of a trained model, not the 0.02 of a fresh one (too weak to show)
        for name, parameter in bidirectional.named_parameters():
            if name.endswith("seg_embed"):
                parameter.normal_(0.0, 1.0)
    out, batch = logits(bidirectional, unigram, pairs, keep_types=True)
    assert differ(out[0], out[1]) and differ(out[0], out[2])
    assert set(batch["token_type_ids"][0].tolist()) >= {0, 1, 2}
    with torch.no_grad():
        unsegmented = bidirectional(**{**batch, "token_type_ids": torch.zeros_like(batch["token_type_ids"])}).logits
    assert differ(out, unsegmented)


def test_pair_layout_of_the_unigram_tokenizer_has_segment_ids(tmp_path):
    """XLNet layout `A <sep> B <sep> <cls>` with segment ids 0/1/2, kept for the bidirectional backbone."""
    import datasets

    from modeling_xl.finetuning.data import left_pad_collate, tokenize_split
    from tokenization import train_unigram_tokenizer

    tokenizer = train_unigram_tokenizer([text for text, _ in sentiment_rows(300, 0)], vocab_size=60)
    data = datasets.Dataset.from_dict({"a": ["good w1", "bad"], "b": ["w2 w3", "fine w4 w5"], "label": [1, 0]})
    args = FinetuneArguments(model_name_or_path="unused", output_dir="unused", text_column="a", text_pair_column="b",
                             max_length=64)
    encoded = tokenize_split(data, [1, 0], tokenizer, args, keep_token_types=True)
    first = encoded[0]
    sep, cls = tokenizer.convert_tokens_to_ids("<sep>"), tokenizer.convert_tokens_to_ids("<cls>")
    assert first["input_ids"][-1] == cls and first["token_type_ids"][-1] == 2
    seps = [i for i, t in enumerate(first["input_ids"]) if t == sep]
    assert len(seps) == 2 and seps[1] == len(first["input_ids"]) - 2
    assert set(first["token_type_ids"][:seps[0] + 1]) == {0} and set(first["token_type_ids"][seps[0] + 1:-1]) == {1}
    batch = left_pad_collate(tokenizer.pad_token_id)([encoded[0], encoded[1]])
    assert batch["token_type_ids"].shape == batch["input_ids"].shape
    assert batch["token_type_ids"][:, -1].tolist() == [2, 2]
    short = tokenize_split(data, [1, 0], tokenizer, FinetuneArguments(
        model_name_or_path="unused", output_dir="unused", text_column="a", text_pair_column="b", max_length=7),
        keep_token_types=True)
    assert max(len(x) for x in short["input_ids"]) <= 7 and all(x[-1] == cls for x in short["input_ids"])


def regression_results(tmp_path, checkpoint, seed: int = 42, *extra: str) -> dict:
    """Fractional targets (0.8 per positive word minus 0.8 per negative one, plus 0.1), 400 rows, 4 epochs."""
    def rows(n, data_seed):
        out = []
        for text, _ in sentiment_rows(n, data_seed):
            words = text.split()
            out.append((text, round(0.8 * sum(w in POSITIVE for w in words) - 0.8 * sum(w in NEGATIVE for w in words)
                                    + 0.1, 2)))
        return out

    train, dev = write_tsv(tmp_path / "train.tsv", rows(400, 1)), write_tsv(tmp_path / "dev.tsv", rows(100, 2))
    return run_script(tmp_path, checkpoint, train, dev, "--num_train_epochs", "4", "--seed", str(seed), *extra)


@pytest.mark.training_outcome
def test_regression_from_fractional_labels(tmp_path, lm_checkpoint, one_thread):
    """The target is 0.8 per positive word minus 0.8 per negative one, plus 0.1: fractional, so regression."""
    results = regression_results(tmp_path, lm_checkpoint)
    assert results["problem_type"] == "regression" and results["labels"] == ["score"]
    assert results["dev"]["pearsonr"] > 0.8 and results["dev"]["spearmanr"] > 0.7, results["dev"]
    assert results["dev"]["mse"] == pytest.approx(results["dev"]["eval_loss"], rel=1e-5)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"


def multi_label_results(tmp_path, checkpoint, seed: int = 42, *extra: str) -> dict:
    """Rows naming each of their topics with one word (labels "food|sport"), 500 rows, 12 epochs, through the script.
    At 8 epochs the lowest of 10 draws (5 seeds x 2 kernel sets) was micro / macro F1 0.85 / 0.83, too near the 0.8
    asserted; at 12, 0.91 / 0.90 (6 draws; docs/testing.md)."""
    def rows(n, data_seed):
        return [(text, "|".join(sorted(topics))) for text, topics in topic_rows(n, data_seed)]

    train, dev = write_tsv(tmp_path / "train.tsv", rows(500, 1)), write_tsv(tmp_path / "dev.tsv", rows(150, 2))
    return run_script(tmp_path, checkpoint, train, dev, "--problem_type", "multi_label_classification",
                      "--label_delimiter", "|", "--num_train_epochs", "12", "--threshold", "0.5", "--summary_type",
                      "mean", "--learning_rate", "1e-2", "--per_device_train_batch_size", "8", "--seed", str(seed),
                      *extra)


@pytest.mark.training_outcome
def test_multi_label_from_delimited_labels(tmp_path, lm_checkpoint, one_thread):
    results = multi_label_results(tmp_path, lm_checkpoint)
    dev_scores = results["dev"]
    assert results["labels"] == ["food", "music", "sport", "weather"]
    # predicting every topic for every row scores micro F1 0.72 here (prevalence 0.57)
    assert dev_scores["micro_f1"] > 0.8 and dev_scores["macro_f1"] > 0.8, dev_scores
    assert sorted(dev_scores["per_class_f1"]) == results["labels"] and dev_scores["threshold"] == 0.5
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.problem_type == "multi_label_classification" and model.config.num_labels == 4


def test_multi_label_from_json_lists(tmp_path):
    from modeling_xl.finetuning.data import check_rows, load_raw_datasets

    for name, rows in (("train", [["a", "b"], ["b"], ["c"]]), ("dev", [["c", "a"]])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": "x y", "tags": r}) + "\n" for r in rows))
    args = FinetuneArguments(model_name_or_path="unused", output_dir="unused", train_file=str(tmp_path / "train.jsonl"),
                             validation_file=str(tmp_path / "dev.jsonl"), text_column="text", label_column="tags")
    labels, targets = check_rows(load_raw_datasets(args), args)
    assert labels.problem_type == "multi_label_classification" and labels.names == ["a", "b", "c"]
    assert targets["train"] == [[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert targets["validation"] == [[1.0, 0.0, 1.0]]


def long_rows(n, seed, length=40):
    """Documents of `length` filler words whose sentiment word is among the FIRST eight words."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        label = int(torch.randint(0, 2, (1,), generator=generator))
        words = [f"w{int(i)}" for i in torch.randint(0, 20, (length,), generator=generator)]
        words[int(torch.randint(0, 8, (1,), generator=generator))] = (POSITIVE if label else NEGATIVE)[
            int(torch.randint(0, 4, (1,), generator=generator))]
        rows.append((" ".join(words), label))
    return rows


def test_long_documents_are_read_whole_through_forward_long(tmp_path, lm_checkpoint, monkeypatch, one_thread):
    """--long_document keeps every token of a 41-token document and reads it 16 tokens at a time with memory, in
    training and evaluation (that memory carries a label across segments: test_classification's
    test_long_document_label_from_first_segment_is_learned_with_memory_only); without it the text is cut to its
    last 16 tokens."""
    calls = []
    real = TransformerXLForSequenceClassification.forward_long

    def spy(self, input_ids, attention_mask=None, labels=None, segment_len=128, detach_memory=False):
        calls.append((tuple(input_ids.shape), segment_len, self.training, detach_memory))
        return real(self, input_ids, attention_mask=attention_mask, labels=labels, segment_len=segment_len,
                    detach_memory=detach_memory)

    monkeypatch.setattr(TransformerXLForSequenceClassification, "forward_long", spy)
    train, dev = write_tsv(tmp_path / "train.tsv", long_rows(32, 1)), write_tsv(tmp_path / "dev.tsv", long_rows(8, 2))
    whole = run_script(tmp_path, lm_checkpoint, train, dev, "--max_length", "16", "--long_document",
                       "--max_train_steps", "2", output="whole")
    assert calls == [((16, 41), 16, True, False), ((16, 41), 16, True, False), ((8, 41), 16, False, False)]
    assert whole["args"]["long_document"] and "segment_len=16" in (tmp_path / "whole" / "README.md").read_text()
    calls.clear()
    run_script(tmp_path, lm_checkpoint, train, dev, "--max_length", "16", "--max_train_steps", "2", output="cut")
    assert calls == []


def test_builtin_task_is_offline_deterministic_and_has_eight_topics():
    from modeling_xl.finetuning.builtin_task import TOPICS, builtin_task

    first = builtin_task()  # files in sorted order, split by a hash of the text: nothing random
    assert sorted(set(first["train"]["label"])) == sorted(TOPICS) and len(TOPICS) >= 5
    assert not set(first["train"]["sentence"]) & set(first["validation"]["sentence"])
    assert len(first["validation"]) > 400 and len(first["train"]) > 2000
    long = builtin_task(long_documents=True)
    assert sum(len(t.split()) for t in long["train"]["sentence"]) / len(long["train"]) > 100


# ---- bad input: named before training ------------------------------------------------------------------------------

@pytest.mark.parametrize("train_rows, dev_rows, extra, match", [
    ([("good film", 1), ("bad film", "")], [("fine", 1)], {},
     r"train_file='.*train.tsv', row 2, column 'label': the label is missing"),
    ([("good film", 1), ("bad film", 0)], [("fine", 1), ("dull", 7)], {},
     r"validation_file='.*dev.tsv', row 2, column 'label': label 7 does not occur in the training labels; expected "
     r"one of \['0', '1'\]"),
    ([("good film", 1), ("bad film", 0), ("meh", 0.5)], [("fine", 1)],
     {"problem_type": "single_label_classification"},
     r"train_file='.*train.tsv', row 3, column 'label': label 0.5 is fractional in a classification task"),
    ([("good film", 1.5), ("bad film", "nan")], [("fine", 1.0)], {},
     r"train_file='.*train.tsv', row 2, column 'label': the label is missing"),
    ([("good film", 1), ("  ", 0)], [("fine", 1)], {},
     r"train_file='.*train.tsv', row 2, column 'sentence': the text is empty"),
    ([("good film", "x"), ("bad film", 0.5)], [("fine", 1.0)], {"problem_type": "regression"},
     r"train_file='.*train.tsv', row 1, column 'label': label 'x' is not a finite number"),
])
def test_bad_rows_are_named_before_training(tmp_path, lm_checkpoint, train_rows, dev_rows, extra, match):
    args = finetune_args(tmp_path, lm_checkpoint, **extra)
    write_tsv(Path(args.train_file), train_rows)
    write_tsv(Path(args.validation_file), dev_rows)
    with pytest.raises(ValueError, match=match):
        run_finetuning(args)
    assert not (tmp_path / "out" / "train_log.jsonl").exists()


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a, p: setattr(a, "text_column", "text"), ValueError,
     r"text_column='text' is not a column of the train split; expected one of \['sentence', 'label'\]"),
    (lambda a, p: setattr(a, "text_pair_column", "other"), ValueError,
     r"text_pair_column='other' is not a column of the train split"),
    (lambda a, p: setattr(a, "validation_file", str(p / "nope.tsv")), FileNotFoundError, r"validation_file="),
    (lambda a, p: setattr(a, "dataset_name", "glue"), ValueError, r"expected exactly one of them"),
])
def test_finetuning_bad_input(tmp_path, lm_checkpoint, mutate, error, match):
    args = finetune_args(tmp_path, lm_checkpoint)
    mutate(args, tmp_path)
    with pytest.raises(error, match=match):
        run_finetuning(args)


@pytest.mark.parametrize("overrides, match", [
    ({"max_length": 0}, r"max_length=0 is invalid; expected a positive integer"),
    ({"per_device_train_batch_size": 0}, r"per_device_train_batch_size=0 is invalid; expected a positive integer"),
    ({"overwrite_output_dir": True, "resume_from_checkpoint": "latest"}, r"overwrite_output_dir=True and "
     r"resume_from_checkpoint='latest' are both set; expected one"),
    ({"learning_rate": 0.0}, r"learning_rate=0.0 is invalid; expected a positive number"),
    ({"max_train_time": -5.0}, r"max_train_time=-5.0 is invalid; expected a positive number of seconds"),
    ({"summary_type": "bogus"}, r"summary_type='bogus' is invalid; expected one of \['last', 'first', 'mean'\]"),
    ({"problem_type": "multiclass"}, r"problem_type='multiclass' is invalid; expected one of \["),
    ({"threshold": 1.5}, r"threshold=1.5 is invalid; expected a probability strictly between 0 and 1"),
    ({"long_document": True, "text_pair_column": "b"}, r"long_document=True and text_pair_column='b' are both set"),
    ({"compare_with": "/nonexistent"}, r"compare_with='/nonexistent' is invalid; expected a "
     r"classification_results.json file"),
    ({"model_name_or_path": "/nonexistent/model"}, r"model_name_or_path='/nonexistent/model' does not exist; "
     r"expected a local folder"),
])
def test_bad_arguments_are_named_before_anything_is_written(tmp_path, lm_checkpoint, overrides, match):
    with pytest.raises(ValueError, match=match):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, **overrides))
    assert not (tmp_path / "out").exists()


def test_a_missing_local_model_a_model_file_and_a_data_folder_are_named_as_such(tmp_path, lm_checkpoint, monkeypatch):
    """The README's `outputs/tiny` before that run wrote it reads as a Hub id 'user/name' (and may be one, so it is
    looked up); offline the lookup fails, and with `outputs/` here the error says the local folder is missing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with pytest.raises(ValueError, match=r"(?s)model_name_or_path='outputs/tiny' could not be loaded \(.*\); and there is "
                                         r"no local folder 'outputs/tiny': 'outputs' \(from .*\) holds no 'tiny'; "
                                         r"expected a folder written by save_pretrained or a Hub id"):
        run_finetuning(finetune_args(tmp_path, "outputs/tiny"))
    with pytest.raises(ValueError, match=r"model.safetensors' is a file; expected the folder save_pretrained wrote"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint / "model.safetensors"))
    args = finetune_args(tmp_path, lm_checkpoint)
    args.train_file = str(tmp_path)
    with pytest.raises(ValueError, match=r"train_file='.*' is a folder; expected a .csv, .tsv, .json or .jsonl file "
                                         r"\(this folder holds \['dev.tsv', 'train.tsv'\]\)"):
        run_finetuning(args)
    assert not (tmp_path / "out").exists()


def test_a_file_separated_by_semicolons_is_named_with_what_to_do(tmp_path, lm_checkpoint):
    """A semicolon-separated .csv: with commas in a text pandas fails to parse it (the parser's own reason is given,
    not datasets' wrapper); without, it is one column named 'sentence;label'. Both say what separates the header."""
    hint = r"its header 'sentence;label' is separated by semicolons: a .csv file is read comma-separated"
    rows = "sentence;label\ngood movie;1\nbad, dull movie;0\nnice;1\n"
    for name in ("train.csv", "dev.csv"):
        (tmp_path / name).write_text(rows)
    args = finetune_args(tmp_path, lm_checkpoint, train_file=str(tmp_path / "train.csv"),
                         validation_file=str(tmp_path / "dev.csv"))
    with pytest.raises(ValueError, match=r"could not be read as CSV \(ParserError: Error tokenizing data.*" + hint):
        run_finetuning(args)
    for name in ("train.csv", "dev.csv"):
        (tmp_path / name).write_text(rows.replace(",", ""))
    with pytest.raises(ValueError, match=r"text_column='sentence' is not a column of the train split; expected one of "
                                         r"\['sentence;label'\] \(" + hint):
        run_finetuning(args)
    assert not (tmp_path / "out").exists()


def test_class_names_that_look_like_a_mistake_are_warned_about(caplog):
    from modeling_xl.finetuning.labels import build_label_space

    describe = lambda split, row: f"{split} row {row}"  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="modeling_xl.finetuning.labels"):
        space, _ = build_label_space({"train": ["neg", "NEG", "pos", "Pos", "sport,news"], "validation": ["neg"]},
                                     None, ",", describe)
    assert space.names == ["NEG", "Pos", "neg", "pos", "sport,news"]  # still classes of their own
    assert "'NEG' / 'neg'; 'Pos' / 'pos' differ only in case" in caplog.text
    assert "1 of the 5 training labels hold ',' (e.g. 'sport,news')" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modeling_xl.finetuning.labels"):
        build_label_space({"train": ["neg", "pos"], "validation": ["pos"]}, None, ",", describe)
    assert caplog.text == ""


def test_a_folder_holding_somebodys_files_is_refused_and_left_as_it_was(tmp_path, lm_checkpoint):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my project notes\n")
    with pytest.raises(ValueError, match=r"output_dir='.*out' holds README.md but no earlier run; the final save would "
                                         r"replace them; expected an empty or new folder, or --overwrite_output_dir"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint))
    assert sorted(p.name for p in out.iterdir()) == ["README.md"]
    assert (out / "README.md").read_text() == "my project notes\n"


@pytest.mark.parametrize("content, match", [
    ("", r"train_file='.*train.tsv' is empty \(0 bytes\); expected a header row and at least one example"),
    ("sentence\tlabel\n\n", r"train_file='.*train.tsv' holds a header but no rows; expected a header row and at "
                           r"least one example"),
    ("\n \n", r"train_file='.*train.tsv' holds only blank lines; expected a header row"),
])
def test_an_empty_or_header_only_file_is_named_and_nothing_is_written(tmp_path, lm_checkpoint, content, match):
    args = finetune_args(tmp_path, lm_checkpoint)
    Path(args.train_file).write_text(content)
    with pytest.raises(ValueError, match=match):
        run_finetuning(args)
    assert not (tmp_path / "out").exists()  # the folder the run made is gone again


def test_na_none_and_null_are_labels_and_texts_an_empty_cell_is_missing(tmp_path, lm_checkpoint):
    from modeling_xl.finetuning.data import check_rows, load_raw_datasets

    args = finetune_args(tmp_path, lm_checkpoint)
    write_tsv(Path(args.train_file), [("north america", "NA"), ("None", "positive"), ("null", "N/A"), ("x", "NA")])
    write_tsv(Path(args.validation_file), [("south", "N/A")])
    labels, _ = check_rows(load_raw_datasets(args), args)
    assert labels.names == ["N/A", "NA", "positive"]
    write_tsv(Path(args.train_file), [("good", "NA"), ("", "positive")])
    with pytest.raises(ValueError, match=r"train_file='.*train.tsv', row 2, column 'sentence': the text is empty"):
        check_rows(load_raw_datasets(args), args)
    # among numbers a marker is what it looks like: a missing label (the column would otherwise be read as classes)
    for rows in ([("a", 1.5), ("b", "NA"), ("c", 2.25)], [("a", 0), ("b", 1), ("c", "null")]):
        write_tsv(Path(args.train_file), rows)
        write_tsv(Path(args.validation_file), [("d", 1)])
        with pytest.raises(ValueError, match=r"train_file='.*train.tsv', row \d, column 'label': the label is missing "
                                             r"\('(NA|null)' among numbers\)"):
            check_rows(load_raw_datasets(args), args)


def test_card_names_the_data_folder_for_files_given_without_a_folder(tmp_path, lm_checkpoint, monkeypatch, one_thread):
    args = finetune_args(tmp_path, lm_checkpoint, max_train_steps=2, eval_steps=None, checkpointing_steps=None)
    monkeypatch.chdir(tmp_path)
    args.train_file, args.validation_file = Path(args.train_file).name, Path(args.validation_file).name
    run_finetuning(args)
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"name: {tmp_path.name}" in card and "name: ''" not in card


def test_hub_dataset_goes_through_load_dataset_and_fails_offline_with_a_clear_message(tmp_path, monkeypatch):
    import datasets

    from modeling_xl.finetuning.data import load_raw_datasets

    args = FinetuneArguments(model_name_or_path="unused", output_dir=str(tmp_path), dataset_name="glue",
                             dataset_config_name="sst2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"could not load dataset_name='glue' \(config 'sst2'\) from the Hugging Face "
                                      r"Hub .*pass local files with --train_file/--validation_file"):
        load_raw_datasets(args)
    split = datasets.Dataset.from_dict({"sentence": ["a"], "label": [0]})
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or datasets.DatasetDict(
        train=split, validation=split, test=split))
    raw = load_raw_datasets(args)
    assert calls == [("glue", "sst2")] and sorted(raw) == ["train", "validation"]


def test_local_train_and_dev_files_may_differ_in_columns(tmp_path):
    from modeling_xl.finetuning.data import load_raw_datasets

    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("index\tsentence\tlabel\n7\tfine\t1\n", encoding="utf-8")
    args = FinetuneArguments(model_name_or_path="unused", output_dir=str(tmp_path / "out"),
                             train_file=str(tmp_path / "train.tsv"), validation_file=str(tmp_path / "dev.tsv"))
    raw = load_raw_datasets(args)
    assert raw["train"]["label"] == [1, 0] and raw["validation"]["sentence"] == ["fine"]


def test_offline_metric_modules_match_definitions():
    import evaluate

    from modeling_xl.metrics import METRICS_DIR

    def load(name):
        return evaluate.load(str(METRICS_DIR / name))

    assert load("accuracy").compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["accuracy"] == 0.75
    f1 = load("f1")
    assert f1.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["f1"] == pytest.approx(2 / 3)
    # per class F1: class 0: 1.0, class 1: 2/3, class 2: 2/3 -> macro 7/9
    assert f1.compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2], average="macro")["f1"] == pytest.approx(7 / 9)
    assert f1.compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2], average=None, labels=[0, 1, 2, 3])["f1"] == (
        pytest.approx([1.0, 2 / 3, 2 / 3, 0.0]))
    # multi-label: class 0 TP 1 FP 1 -> 2/3; class 1 TP 1 -> 1; micro 2*2 / (2*2 + 1) = 0.8
    multi = load("multilabel_f1").compute(predictions=[[1, 0], [1, 1]], references=[[1, 0], [0, 1]])
    assert multi.pop("per_class_f1") == pytest.approx([2 / 3, 1.0])
    assert multi == pytest.approx({"micro_f1": 0.8, "macro_f1": 5 / 6, "subset_accuracy": 0.5})
    x, y = [1.0, 2.0, 3.0, 3.0, 7.0], [2.0, 1.0, 5.0, 4.0, 9.0]
    mx, my = sum(x) / 5, sum(y) / 5
    naive = sum((a - mx) * (b - my) for a, b in zip(x, y)) / (
        sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y)) ** 0.5
    assert load("pearsonr").compute(predictions=x, references=y)["pearsonr"] == pytest.approx(naive)
    # ranks of x: [1, 2, 3.5, 3.5, 5]; of y: [2, 1, 4, 3, 5]
    rx, ry = [1, 2, 3.5, 3.5, 5], [2, 1, 4, 3, 5]
    naive_rank = sum((a - 3) * (b - 3) for a, b in zip(rx, ry)) / (
        sum((a - 3) ** 2 for a in rx) * sum((b - 3) ** 2 for b in ry)) ** 0.5
    assert load("spearmanr").compute(predictions=x, references=y)["spearmanr"] == pytest.approx(naive_rank)


# ---- nothing lost --------------------------------------------------------------------------------------------------

def test_a_failing_metric_is_named_and_the_weights_are_already_saved(tmp_path, lm_checkpoint, monkeypatch):
    from modeling_xl.finetuning import MetricError, tasks

    real = tasks.compute_metric

    def broken(name, **inputs):
        if name == "f1":
            raise MetricError("metric 'f1' failed: RuntimeError: disk full")
        return real(name, **inputs)

    monkeypatch.setattr(tasks, "compute_metric", broken)
    with pytest.raises(MetricError, match=r"metric 'f1' failed: RuntimeError: disk full \(after training; the "
                                          r"fine-tuned model and tokenizer are saved in .*out\)"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, max_train_steps=3, eval_steps=None,
                                     checkpointing_steps=None))
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.num_labels == 2 and (tmp_path / "out" / "tokenizer.json").exists()


def test_never_writes_over_the_model_it_starts_from_and_checks_the_tokenizer(tmp_path, lm_checkpoint):
    from tokenization import train_word_level_tokenizer

    before = {p.name: p.read_bytes() for p in lm_checkpoint.iterdir()}
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"output_dir=.* is the folder of model_name_or_path=.*; the run's final "
                                             "save would write over it"):
            run_finetuning(finetune_args(tmp_path, lm_checkpoint, output_dir=str(lm_checkpoint),
                                         overwrite_output_dir=overwrite))
    assert {p.name: p.read_bytes() for p in lm_checkpoint.iterdir()} == before
    big = train_word_level_tokenizer([f"w{i}" for i in range(300)])
    big.save_pretrained(tmp_path / "big")
    with pytest.raises(ValueError, match=r"tokenizer_name=.*big' does not fit model_name_or_path=.*tokenizer "
                                         r"vocabulary has 302 tokens but config.vocab_size="):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, tokenizer_name=str(tmp_path / "big")))
    assert not (tmp_path / "out" / "train_log.jsonl").exists()  # a retry in the same folder is not refused


def test_script_from_scratch_with_comparison_in_the_card(tmp_path, lm_checkpoint, one_thread):
    args = finetune_args(tmp_path, lm_checkpoint)
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"initialisation": "pretrained elsewhere", "train_steps": 5, "train_seconds": 1.0,
                                "dev": {"accuracy": 0.5, "macro_f1": 0.25}}))
    run_script(tmp_path, lm_checkpoint, args.train_file, args.validation_file, "--from_scratch", "--max_train_steps",
               "3", "--compare_with", str(base), output="scratch")
    card = (tmp_path / "scratch" / "README.md").read_text()
    assert "| from scratch |" in card and "| pretrained elsewhere | 0.5000 | 0.2500 | 5 | 1 |" in card


# ---- defaults that suit the model ----------------------------------------------------------------------------------

def test_default_learning_rate_follows_width_and_start():
    """The measured small row, the large rows, the geometric interpolation between them, clamped outside."""
    from modeling_xl.finetuning.defaults import default_epochs, default_learning_rate

    assert default_learning_rate(128, True) == default_learning_rate(128, False) == 1e-3
    assert default_learning_rate(64, True) == 1e-3  # narrower than the measured row: clamped
    assert default_learning_rate(768, True) == 3e-5 and default_learning_rate(768, False) == 1e-4
    assert default_learning_rate(1024, True) == 3e-5  # xlnet-large: clamped to the large row
    middle = round((128 * 768) ** 0.5)  # the geometric middle of the widths: the geometric middle of the rates
    assert default_learning_rate(middle, True) == pytest.approx((1e-3 * 3e-5) ** 0.5, rel=0.02)
    rates = [default_learning_rate(width, True) for width in (128, 256, 410, 512, 768)]
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == 5
    assert all(default_learning_rate(w, False) >= default_learning_rate(w, True) for w in (128, 256, 410, 512, 768))
    assert [default_epochs(w) for w in (64, 128, 410, 768, 1024)] == [5, 5, 4, 3, 3]


def test_apply_defaults_fills_only_what_the_user_left_unnamed():
    from modeling_xl.finetuning.defaults import apply_defaults

    config = TransformerXLConfig.from_preset("tiny")
    args = FinetuneArguments(model_name_or_path="m", output_dir="o")
    chosen = apply_defaults(args, config, batches_per_epoch=75)
    assert (args.learning_rate, args.num_train_epochs, args.num_warmup_steps) == (1e-3, 5, 38)  # 10% of 375 steps
    assert sorted(chosen) == ["learning_rate", "num_train_epochs", "num_warmup_steps"]
    assert "d_model 128, pretrained" in chosen["learning_rate"] and "375 steps" in chosen["num_warmup_steps"]
    named = FinetuneArguments(model_name_or_path="m", output_dir="o", learning_rate=5e-4, num_warmup_steps=0,
                              max_train_steps=40, from_scratch=True)
    chosen = apply_defaults(named, TransformerXLConfig.from_preset("xlnet-base"), batches_per_epoch=75)
    assert (named.learning_rate, named.num_train_epochs, named.num_warmup_steps) == (5e-4, 3, 0)  # 768 wide: 3
    assert list(chosen) == ["num_train_epochs"]


def test_a_run_records_the_defaults_it_chose_in_training_config(tmp_path, lm_checkpoint, one_thread):
    """No schedule argument named: the run trains with the model's defaults (the debug preset is 16 wide: the small
    row), writes them into training_config.json with the reason for each, and the card lists them; a named argument
    is kept and not called a default. --overwrite_output_dir deletes the earlier record."""
    args = finetune_args(tmp_path, lm_checkpoint)
    run_script(tmp_path, lm_checkpoint, args.train_file, args.validation_file, "--max_train_steps", "5",
               "--num_warmup_steps", "1", output="run")
    record = json.loads((tmp_path / "run" / "training_config.json").read_text())
    assert record["learning_rate"] == 3e-3 and record["num_warmup_steps"] == 1  # named by run_script and here
    assert record["num_train_epochs"] == 5 and list(record["defaults_chosen"]) == ["num_train_epochs"]
    code = load_script().main(["--model_name_or_path", str(lm_checkpoint), "--output_dir", str(tmp_path / "run"),
                               "--train_file", str(args.train_file), "--validation_file", str(args.validation_file),
                               "--disable_tqdm", "--max_train_steps", "10", "--overwrite_output_dir"])
    assert code == 0
    record = json.loads((tmp_path / "run" / "training_config.json").read_text())
    assert (record["learning_rate"], record["num_warmup_steps"]) == (1e-3, 1)  # 10% of 10 steps
    assert sorted(record["defaults_chosen"]) == ["learning_rate", "num_train_epochs", "num_warmup_steps"]
    assert "d_model 16, pretrained" in record["defaults_chosen"]["learning_rate"]
    results = json.loads((tmp_path / "run" / "classification_results.json").read_text())
    assert results["args"]["learning_rate"] == 1e-3 and results["defaults_chosen"] == record["defaults_chosen"]
    assert "learning_rate" in (tmp_path / "run" / "README.md").read_text()
    lines = (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["lr"] == pytest.approx(1e-3)  # after the one warmup step: the peak


# ---- the transformers ecosystem ------------------------------------------------------------------------------------

@pytest.fixture
def classifier_folder(tmp_path, lm_checkpoint, one_thread):
    train = write_tsv(tmp_path / "train.tsv", one_topic_rows(200, 1))
    dev = write_tsv(tmp_path / "dev.tsv", one_topic_rows(40, 2))
    run_script(tmp_path, lm_checkpoint, train, dev, "--max_train_steps", "30", output="clf")
    return tmp_path / "clf"


def test_an_earlier_classifier_of_other_labels_gets_a_new_class_layer(classifier_folder, tmp_path, caplog):
    """From the four-topic classifier: two classes (another count: the user's crash), two other names of the same
    count, and the same four topics (the class layer kept). The sequence summary is kept in every case."""
    from modeling_xl.finetuning.classification import build_model
    from modeling_xl.finetuning.labels import LabelSpace
    from modeling_xl.finetuning.loop import _read_config

    source = AutoModelForSequenceClassification.from_pretrained(classifier_folder)
    args = finetune_args(tmp_path, classifier_folder)
    saved_config = _read_config(args)
    single = "single_label_classification"
    with caplog.at_level(logging.INFO, logger="modeling_xl.finetuning.classification"):
        two = build_model(args, LabelSpace(single, ["0", "1"], {}), saved_config)
    assert two.logits_proj.weight.shape == (2, source.config.d_model) and "its class layer is new" in caplog.text
    assert torch.equal(two.sequence_summary.summary.weight, source.sequence_summary.summary.weight)
    renamed = build_model(args, LabelSpace(single, ["a", "b", "c", "d"], {}), saved_config)
    assert not torch.equal(renamed.logits_proj.weight, source.logits_proj.weight)
    same = build_model(args, LabelSpace(single, ["food", "music", "sport", "weather"], {}), saved_config)
    assert torch.equal(same.logits_proj.weight, source.logits_proj.weight)
    assert same.config.id2label == {0: "food", 1: "music", 2: "sport", 3: "weather"}
    # the script end to end, 8-class style crash case: four topics -> two sentiment classes
    results = run_script(tmp_path, classifier_folder, tmp_path / "train.tsv", tmp_path / "dev.tsv",
                         "--max_train_steps", "4", output="again")
    assert results["labels"] == ["0", "1"]


def test_saved_tokenizer_pads_and_pipeline_returns_label_names(classifier_folder):
    from transformers import AutoTokenizer, DataCollatorWithPadding, pipeline

    tokenizer = AutoTokenizer.from_pretrained(classifier_folder)
    assert tokenizer.pad_token == "<eos>"
    batch = tokenizer(["goal w1 w2", "soup"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape[0] == 2 and batch["attention_mask"].sum().item() == 6  # each text + <eos>
    collated = DataCollatorWithPadding(tokenizer)([tokenizer("goal w1 w2"), tokenizer("soup")])
    assert collated["input_ids"].shape == (2, 4)
    classifier = pipeline("text-classification", model=str(classifier_folder))
    texts = ["goal w1 w2 w3", "soup w4", "song w5 w6", "snow", "w1 match w2", "cake", "drum w7", "wind w8 w9"]
    batched = classifier(texts, batch_size=8)
    assert [r["label"] for r in batched] == [r["label"] for r in classifier(texts, batch_size=1)]
    assert {r["label"] for r in batched} <= {"food", "music", "sport", "weather"}
    for one, many in zip(classifier(texts, batch_size=1), batched):
        assert one["score"] == pytest.approx(many["score"], abs=1e-4)


def test_trainer_fine_tunes_an_auto_model_with_padding_collator(classifier_folder, tmp_path, one_thread):
    import datasets
    from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(classifier_folder)
    model = AutoModelForSequenceClassification.from_pretrained(classifier_folder)
    assert isinstance(model, TransformerXLForSequenceClassification)
    label2id = model.config.label2id
    rows = one_topic_rows(40, 5)
    data = datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [label2id[lab] for _, lab in rows]})
    data = data.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=4,
                                                          per_device_train_batch_size=8, report_to=[], use_cpu=True,
                                                          save_strategy="no", logging_steps=1),
                      train_dataset=data, eval_dataset=data, data_collator=DataCollatorWithPadding(tokenizer))
    before = model.logits_proj.weight.detach().clone()
    trainer.train()
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"])) and not torch.equal(before, model.logits_proj.weight)


REMOTE = textwrap.dedent("""
    import sys
    sys.modules["modeling_xl"] = None  # the code must come from the folder
    from transformers import AutoModelForSequenceClassification, pipeline
    model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    classifier = pipeline("text-classification", model=sys.argv[1], trust_remote_code=True)
    print([r["label"] for r in classifier(["goal w1", "soup", "song w2"], batch_size=8)])
""")


def test_remote_code_classifier_and_pipeline_in_a_fresh_process(classifier_folder, tmp_path):
    (tmp_path / "remote.py").write_text(REMOTE)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "remote.py"), str(classifier_folder)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels = eval(proc.stdout.strip().splitlines()[-1])
    assert len(labels) == 3 and set(labels) <= {"food", "music", "sport", "weather"}


# ---- resume and several processes ----------------------------------------------------------------------------------

def step_losses(out) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_resumed_from_a_checkpoint_trains_on_the_same_batches(tmp_path, lm_checkpoint, one_thread):
    """4 batches per epoch, a checkpoint at step 6 (in the middle of the second epoch), dropout on: the resumed run
    logs the losses of the uninterrupted one. A new run in a folder with checkpoints is refused unless it overwrites."""
    import shutil

    run = dict(max_train_samples=64, max_train_steps=10, checkpointing_steps=6, eval_steps=5)
    first = run_finetuning(finetune_args(tmp_path, lm_checkpoint, **run))
    out, resumed = tmp_path / "out", tmp_path / "resumed"
    shutil.copytree(out / "checkpoint-6", resumed / "checkpoint-6")
    second = run_finetuning(finetune_args(tmp_path, lm_checkpoint, **run, output_dir=str(resumed),
                                          resume_from_checkpoint="latest"))
    uninterrupted, continued = step_losses(out), step_losses(resumed)
    assert sorted(continued) == [7, 8, 9, 10]
    for step in continued:
        assert continued[step] == pytest.approx(uninterrupted[step], rel=1e-6, abs=1e-7), step
    assert second["dev"].pop("per_class_f1") == pytest.approx(first["dev"].pop("per_class_f1"), rel=1e-6)
    assert second["dev"] == pytest.approx(first["dev"], rel=1e-6)
    assert [h["step"] for h in second["history"]] == [5, 10] and second["train_steps"] == 10
    with pytest.raises(ValueError, match=r"output_dir=.* already holds an earlier run \(checkpoint-6, train_log.jsonl, "
                                         r"training_config.json, "
                                         r"classification_results.json\); expected .*--overwrite_output_dir"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, **run))
    with pytest.raises(ValueError, match=r"resume_from_checkpoint=.*checkpoint-6' was written with seed=42, this run "
                                         r"has seed=7"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, **run, seed=7, resume_from_checkpoint="latest"))
    (out / "notes.txt").write_text("the user's own file")
    (out / "checkpoint-100").mkdir()  # a folder named like a checkpoint that this tool did not write: kept
    (out / "checkpoint-100" / "model.safetensors").write_text("someone's model")
    short = {**run, "checkpointing_steps": 4, "max_train_steps": 4}
    run_finetuning(finetune_args(tmp_path, lm_checkpoint, **short, overwrite_output_dir=True))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-100", "checkpoint-4"]
    assert sorted(step_losses(out)) == [1, 2, 3, 4] and (out / "notes.txt").exists()
    assert (out / "checkpoint-100" / "model.safetensors").exists()
    with pytest.raises(ValueError, match=r"tokenizer_name=.*checkpoint-4' lies in .*checkpoint-4, which "
                                         r"--overwrite_output_dir would delete"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, **short, overwrite_output_dir=True,
                                     tokenizer_name=str(out / "checkpoint-4")))
    assert (out / "checkpoint-4").exists()


TWO_PROCESS_EVAL = textwrap.dedent("""
    import json, sys
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from modeling_xl import TransformerXLConfig, TransformerXLForSequenceClassification
    from modeling_xl.finetuning.data import left_pad_collate
    from modeling_xl.finetuning.labels import LabelSpace
    from modeling_xl.finetuning.classification import evaluate_model
    from modeling_xl.finetuning.tasks import task_for

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = TransformerXLForSequenceClassification(TransformerXLConfig.from_preset("debug", num_labels=3))
    generator = torch.Generator().manual_seed(1)  # 13 examples of different lengths: the last batch is uneven
    dev = [{"input_ids": torch.randint(1, 97, (int(n),), generator=generator).tolist(), "labels": i % 3}
           for i, n in enumerate(torch.randint(2, 9, (13,), generator=generator))]
    loader = accelerator.prepare(DataLoader(dev, batch_size=4, collate_fn=left_pad_collate(0)))
    task = task_for(LabelSpace("single_label_classification", ["a", "b", "c"], {}))
    result = evaluate_model(accelerator, accelerator.prepare(model), loader, task)
    with open(f"{sys.argv[1]}/rank{accelerator.process_index}.json", "w") as handle:
        json.dump(result, handle)
""")


def test_dev_scores_of_two_processes_are_those_of_the_whole_dev_set(tmp_path):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from modeling_xl.finetuning.classification import evaluate_model
    from modeling_xl.finetuning.data import left_pad_collate
    from modeling_xl.finetuning.labels import LabelSpace
    from modeling_xl.finetuning.tasks import task_for

    (tmp_path / "driver.py").write_text(TWO_PROCESS_EVAL)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = warm_launch.run(tmp_path / "driver.py", [tmp_path], env=env, cwd=tmp_path, timeout=240, processes=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    torch.manual_seed(0)
    model = TransformerXLForSequenceClassification(TransformerXLConfig.from_preset("debug", num_labels=3)).eval()
    generator = torch.Generator().manual_seed(1)
    dev = [{"input_ids": torch.randint(1, 97, (int(n),), generator=generator).tolist(), "labels": i % 3}
           for i, n in enumerate(torch.randint(2, 9, (13,), generator=generator))]
    with torch.no_grad():
        by_hand = sum(float(model(torch.tensor([e["input_ids"]]), labels=torch.tensor([e["labels"]])).loss)
                      for e in dev) / len(dev)
    task = task_for(LabelSpace("single_label_classification", ["a", "b", "c"], {}))
    one = evaluate_model(Accelerator(cpu=True), model, DataLoader(dev, batch_size=4, collate_fn=left_pad_collate(0)),
                         task)
    assert one["eval_loss"] == pytest.approx(by_hand, rel=1e-5)
    per_class = one.pop("per_class_f1")
    for result in ranks:
        assert result.pop("per_class_f1") == pytest.approx(per_class, rel=1e-5)
        assert result == pytest.approx(one, rel=1e-5)


class _StubTraining:
    """Accelerator, model, optimizer, scheduler and log of `train_loop` in one object: records each step's batch and
    a dropout-like draw from the torch RNG."""

    is_local_main_process = False

    def __init__(self):
        self.seen = []

    def __call__(self, **batch):
        self.seen.append((batch["x"].tolist(), float(torch.rand(()))))
        return type("Out", (), {"loss": torch.zeros(())})()

    def backward(self, loss): pass
    def clip_grad_norm_(self, *args): pass
    def reduce(self, tensor, reduction): return tensor
    def train(self): pass
    def parameters(self): return []
    def step(self): pass
    def zero_grad(self): pass
    def get_last_lr(self): return [0.0]
    def write(self, record): pass


@pytest.mark.parametrize("num_processes", [1, 2])
def test_train_loop_resumed_anywhere_reads_the_uninterrupted_batches(num_processes):
    """Resumed from a checkpoint in the middle of an epoch or at its end, the loop reads the batches (and RNG draws)
    of the uninterrupted run, in that epoch and the next ones. With several processes the order comes from the
    generator Accelerate shares between them (here process 0 of 2), which Accelerate's own state does not save."""
    import types

    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    from modeling_xl.finetuning.loop import train_loop

    def loader():
        set_seed(0)
        plain = DataLoader([{"x": i} for i in range(12)], batch_size=2, shuffle=True)
        if num_processes == 1:
            return plain
        return prepare_data_loader(plain, num_processes=2, process_index=0, put_on_device=False,
                                   rng_types=["generator"])

    Accelerator(cpu=True)
    args = types.SimpleNamespace(disable_tqdm=True, eval_steps=None, checkpointing_steps=1, max_train_time=None,
                                 long_document=False)
    saved = {}
    whole = _StubTraining()
    train_loop(whole, args, whole, whole, whole, loader(), 14, 0, None, 0.0, whole, None,
               lambda step, rng: saved.update({step: (torch.get_rng_state(), rng)}))
    per_epoch = len(loader())
    for at in (per_epoch + 1, 2 * per_epoch):  # in the middle of the second epoch, at the end of the second
        torch_state, rng = saved[at]
        resumed = _StubTraining()
        torch.manual_seed(123)  # the resumed process starts elsewhere ...
        dl = loader()
        torch.set_rng_state(torch_state)  # ... and Accelerate's load_state restores the torch RNG
        train_loop(resumed, args, resumed, resumed, resumed, dl, 14, at, rng, 0.0, resumed, None, lambda *a: None)
        assert resumed.seen == whole.seen[at:], at


def test_a_launch_whose_processes_each_run_alone_is_refused_before_anything_is_written(tmp_path, lm_checkpoint,
                                                                                         monkeypatch):
    """The launcher set WORLD_SIZE=2 but this process runs alone (as `accelerate launch --use_fsdp` on a CPU-only
    machine without ACCELERATE_USE_CPU): two such processes would fine-tune separately into one folder."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE=2 processes but each one runs alone"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---- what the tokenizer does to the user's text (issue 35, item 1) ---------------------------------------------------

def test_unknown_token_report_names_case_characters_and_coverage():
    from modeling_xl.finetuning.coverage import unknown_token_report
    from tokenization import train_word_level_tokenizer

    # lowercase=False: a case-sensitive tokenizer of lowercase text (as WT103's vocabulary, or one saved before the
    # lowercase normalizer); one trained here by default would lowercase its input
    tokenizer = train_word_level_tokenizer(["the cat sat on the mat", "a dog ran to the cat"], lowercase=False)
    assert unknown_token_report(tokenizer, ["the cat sat", "a dog ran"])["share"] == 0.0
    cased = unknown_token_report(tokenizer, ["The Cat sat", "A Dog ran to The mat"])
    assert cased["share"] == pytest.approx(5 / 9) and cased["lowercase_share"] == 0.0
    assert cased["cause"].startswith("case:") and "gives 0.0% unknown" in cased["cause"]
    assert cased["examples"][0] == "The"
    foreign = unknown_token_report(tokenizer, ["the café sat", "the naïve dog", "the cat"])
    assert foreign["cause"].startswith("characters the tokenizer never saw: ") and foreign["lowercase_share"] is None
    assert "'é'" in foreign["cause"] and "'ï'" in foreign["cause"] and "(100% of the unknown words hold one)" in (
        foreign["cause"])
    missing = unknown_token_report(tokenizer, ["the horse sat on the hat"])
    assert missing["share"] == pytest.approx(2 / 6) and missing["cause"].startswith("vocabulary coverage")
    assert sorted(missing["examples"]) == ["hat", "horse"]


def test_an_unknown_heavy_tokenizer_stops_fine_tuning_with_the_cause_unless_allowed(tmp_path, lm_checkpoint, caplog):
    """Cased texts against a lowercase word-level tokenizer: above 50% unknown the run stops before anything is written,
    naming the share, the cause and the flag; with --allow_unknown_tokens it runs, warns, and records the share in its
    results and card. Below 10% nothing is said. The tokenizer is case-sensitive (lowercase=False), as WT103's."""
    from tokenization import train_word_level_tokenizer

    train_word_level_tokenizer(vocabulary_lines(), lowercase=False).save_pretrained(lm_checkpoint)
    train = write_tsv(tmp_path / "cased.tsv", [(text.title(), label) for text, label in sentiment_rows(64, 1)])
    args = finetune_args(tmp_path, lm_checkpoint, train_file=str(train), max_train_steps=2, eval_steps=2)
    with pytest.raises(ValueError, match=r"(?s)of the training texts' tokens are the tokenizer's unknown token "
                                         r"'<unk>' \(likely cause: case: .*lowercasing them gives 0\.0% unknown.*"
                                         r"--allow_unknown_tokens"):
        run_finetuning(args)
    assert not (tmp_path / "out").exists()
    with caplog.at_level(logging.WARNING, logger="modeling_xl.finetuning.coverage"):
        results = run_finetuning(finetune_args(tmp_path, lm_checkpoint, train_file=str(train), max_train_steps=2,
                                               eval_steps=2, allow_unknown_tokens=True))
    assert results["unknown_token_share"] > 0.5
    assert [r.name for r in caplog.records if "likely cause: case" in r.getMessage()] == [
        "modeling_xl.finetuning.coverage"]
    assert "Tokenizer coverage: " in (tmp_path / "out" / "README.md").read_text()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modeling_xl.finetuning.coverage"):
        clean = run_finetuning(finetune_args(tmp_path, lm_checkpoint, output_dir=str(tmp_path / "clean"),
                                             max_train_steps=2, eval_steps=2))
    assert clean["unknown_token_share"] == 0.0
    assert not [r for r in caplog.records if r.name == "modeling_xl.finetuning.coverage"]


def test_fine_tuning_from_a_transformers_xlnet_folder_imports_its_backbone(tmp_path):
    """The path a user with `xlnet-base-cased` takes: a transformers XLNet folder as model_name_or_path. Its backbone
    is imported (every weight equal to the folder's), not trained from a MISSING (random) backbone."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    from tokenization import train_word_level_tokenizer

    tokenizer = train_word_level_tokenizer(vocabulary_lines())
    xlnet = XLNetLMHeadModel(XLNetConfig(vocab_size=len(tokenizer), d_model=16, n_layer=2, n_head=2, d_inner=32,
                                         mem_len=0, pad_token_id=None, bos_token_id=None, eos_token_id=0))
    xlnet.save_pretrained(tmp_path / "xlnet")
    tokenizer.save_pretrained(tmp_path / "xlnet")
    run_finetuning(finetune_args(tmp_path, tmp_path / "xlnet", max_train_steps=2, eval_steps=2, learning_rate=1e-12))
    tuned = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    torch.testing.assert_close(tuned.transformer.word_emb.weight, xlnet.transformer.word_embedding.weight)
    torch.testing.assert_close(tuned.transformer.layers[1].ff.layer_2.weight, xlnet.transformer.layer[1].ff.layer_2.weight)


def test_a_checkpoint_without_backbone_weights_stops_fine_tuning_naming_the_folder(tmp_path, lm_checkpoint):
    from safetensors.torch import load_file, save_file

    weights = lm_checkpoint / "model.safetensors"
    kept = {k: v for k, v in load_file(weights).items() if not k.startswith("transformer.layers.")}
    save_file(kept, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"model_name_or_path='{lm_checkpoint}': \d+ of the backbone's \d+ weights "
                                         r"are missing from the checkpoint \(first: \['transformer.layers.0"):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, max_train_steps=2, eval_steps=2))
    assert not (tmp_path / "out").exists()


def long_document_scores(tmp_path, model_seed: int = 0, seed: int = 42, arms=("cut", "whole", "detached", "one_read"),
                         **overrides) -> dict[str, dict]:
    """A topic cue among the first 6 words of a 17-token document, filler after it, 150 steps from a fresh debug
    model (weights from `model_seed`): per arm, the dev scores and `cue_rows_changed`, how many of the 4 cue words'
    embedding rows training changed (a row changes only if a gradient reached it: AdamW without weight decay). Arms:
    truncated to the last 8 tokens ("cut"), read whole in segments of 8 with the gradient through the memory
    ("whole"), the same with the paper's detached memory ("detached"), all 17 tokens in one segment ("one_read")."""
    import random

    from tokenization import declare_task_tokens, train_word_level_tokenizer

    cues = {"sport": "goal", "food": "soup", "music": "drum", "weather": "rain"}
    filler = [f"w{i}" for i in range(30)]

    def rows(n, data_seed):
        rng, out = random.Random(data_seed), []
        for _ in range(n):
            topic, words = rng.choice(sorted(cues)), [rng.choice(filler) for _ in range(15)]
            words.insert(rng.randrange(0, 6), cues[topic])
            out.append((" ".join(words), topic))
        return out

    def cue_rows(model):
        embedding, ids = model.transformer.word_emb, tokenizer.convert_tokens_to_ids(list(cues.values()))
        return [table.weight[i - lo] for i in ids for (lo, hi), table in zip(embedding.bounds, embedding.emb_layers)
                if lo <= i < hi]

    tokenizer = train_word_level_tokenizer([" ".join(filler + list(cues.values()))], lowercase=False)
    declare_task_tokens(tokenizer)
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10], mem_len=16)
    torch.manual_seed(model_seed)
    initial = TransformerXLForCausalLM(config)
    initial.save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    train, dev = write_tsv(tmp_path / "train.tsv", rows(256, 1)), write_tsv(tmp_path / "dev.tsv", rows(128, 2))
    settings = {"cut": {}, "whole": dict(long_document=True),
                "detached": dict(long_document=True, detach_memory=True), "one_read": dict(max_length=64)}
    values = dict(model_name_or_path=str(tmp_path / "lm"), train_file=str(train), validation_file=str(dev),
                  max_length=8, learning_rate=3e-3, max_train_steps=150, num_warmup_steps=0,
                  per_device_train_batch_size=16, disable_tqdm=True, seed=seed)
    values.update(overrides)
    scores = {}
    for arm in arms:
        dev_scores = run_finetuning(FinetuneArguments(**{**values, "output_dir": str(tmp_path / arm),
                                                         **settings[arm]}))["dev"]
        tuned = TransformerXLForSequenceClassification.from_pretrained(tmp_path / arm)
        changed = sum(not torch.equal(a, b) for a, b in zip(cue_rows(tuned), cue_rows(initial)))
        scores[arm] = {**dev_scores, "cue_rows_changed": changed}
    return scores


@pytest.mark.training_outcome
def test_long_document_learns_evidence_that_truncation_cuts(tmp_path, one_thread):
    """A topic cue among the first 6 words of a 2-segment document (segment 8 tokens), filler after it. Truncated to
    its last 8 tokens the cue is gone: chance. Read whole with --long_document, the gradient crosses the memory and the
    classifier learns the cue as a single long read does (the same numbers). With the paper's detached memory
    (`--detach_memory`) no gradient reaches the cue's segment (issue 35 item 4's cause): the cue words' embeddings
    stay as initialised, bit for bit. The detached arm's accuracy is not asserted: the last segment can still learn
    to read the untrained cue embeddings through the memory, and did in 2 draws of 5 (0.51 and 0.59 against 0.14-0.26
    for the cut; docs/testing.md)."""
    scores = long_document_scores(tmp_path)
    cut, whole, detached, one_read = (scores[arm] for arm in ("cut", "whole", "detached", "one_read"))
    assert cut["accuracy"] < 0.35 and cut["eval_loss"] > 1.3, cut  # chance: 0.25, ln 4 = 1.39
    assert whole["accuracy"] > 0.4 and whole["eval_loss"] < 1.0, whole
    assert whole["accuracy"] == one_read["accuracy"] and whole["eval_loss"] == pytest.approx(one_read["eval_loss"],
                                                                                             rel=1e-4)
    assert detached["cue_rows_changed"] == 0 and whole["cue_rows_changed"] == 4, (detached, whole)
