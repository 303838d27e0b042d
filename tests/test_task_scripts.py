"""Our task scripts (`scripts/finetune_question_answering.py`, `finetune_token_classification.py`,
`finetune_multiple_choice.py`; library `modeling_xl.finetuning`): end to end on a debug model, windows and
post-processing exact on an oracle, entity metrics equal to seqeval's, long documents read whole, bad input named
before anything is written, resume exact."""

import importlib.util
import json
import random

import pytest
import torch

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
FILLER = [f"w{i}" for i in range(30)]
NAMES = ["alice", "bob", "carol", "dave"]
PLACES = ["paris", "rome", "oslo", "lima"]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(n, seed, filler_words=12):
    """Contexts of filler words with "NAME lives in PLACE" somewhere; the question asks where NAME lives."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name, place = rng.choice(NAMES), rng.choice(PLACES)
        words = [rng.choice(FILLER) for _ in range(filler_words)]
        at = rng.randint(0, len(words))
        before = " ".join(words[:at] + [name, "lives", "in"])
        context = " ".join(words[:at] + [name, "lives", "in", place] + words[at:])
        rows.append({"id": f"q{seed}-{i}", "question": f"where does {name} live", "context": context,
                     "answers": {"text": [place], "answer_start": [len(before) + 1]}})
    return rows


def tag_rows(n, seed, length=(4, 9)):
    """Sentences of filler words with names (B-PER, a following "jr" is I-PER) and places (B-LOC)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(*length)):
            kind = rng.random()
            if kind < 0.2:
                tokens.append(rng.choice(NAMES))
                tags.append("B-PER")
                if rng.random() < 0.5:
                    tokens.append("jr")
                    tags.append("I-PER")
            elif kind < 0.35:
                tokens.append(rng.choice(PLACES))
                tags.append("B-LOC")
            else:
                tokens.append(rng.choice(FILLER))
                tags.append("O")
        rows.append({"tokens": tokens, "ner_tags": tags})
    return rows


def choice_rows(n, seed, counts=(3, 4, 5)):
    """Where does NAME live? Choices: places, one of them right (by a fixed rule); 3 to 5 choices."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name = rng.choice(NAMES)
        k = counts[i % len(counts)]
        choices = rng.sample(PLACES + ["kiev", "cairo"], k)
        rows.append({"question": f"where does {name} live", "choices": choices, "label": rng.randrange(k)})
    return rows


@pytest.fixture
def task_checkpoint(tmp_path):
    """A debug causal model with a word-level tokenizer declaring `<eos>` as pad / sep / cls, as
    `scripts/pretrain.py` saves them."""
    from tokenization import declare_task_tokens, train_word_level_tokenizer

    lines = [r["context"] + " " + r["question"] for r in qa_rows(50, 0)] + [" ".join(FILLER + NAMES + PLACES)]
    lines += [" ".join(r["tokens"]) for r in tag_rows(50, 0)] + ["kiev cairo jr"]
    tokenizer = train_word_level_tokenizer(lines, lowercase=False)
    declare_task_tokens(tokenizer)
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10])
    TransformerXLForCausalLM(config).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    return tmp_path / "lm"


def run(script, tmp_path, checkpoint, train, dev, *extra, output="out"):
    return load_script(script).main(["--model_name_or_path", str(checkpoint), "--output_dir", str(tmp_path / output),
                                     "--train_file", str(train), "--validation_file", str(dev), "--disable_tqdm",
                                     "--per_device_train_batch_size", "8", "--learning_rate", "3e-3", *extra])


# ---- question answering ----------------------------------------------------------------------------------------

def test_question_answering_script_end_to_end(tmp_path, task_checkpoint, one_thread):
    from transformers import AutoModelForQuestionAnswering

    import modeling_xl  # noqa: F401  (registers the Auto classes)

    train = write_jsonl(tmp_path / "train.jsonl", qa_rows(40, 1))
    dev = write_jsonl(tmp_path / "dev.json", [])
    dev.write_text(json.dumps({"version": "x", "data": qa_rows(12, 2)}))  # run_qa.py's JSON layout
    code = run("finetune_question_answering", tmp_path, task_checkpoint, train, dev, "--max_train_steps", "4",
               "--max_length", "24", "--doc_stride", "8", "--eval_steps", "2")
    assert code == 0
    out = tmp_path / "out"
    results = json.loads((out / "qa_results.json").read_text())
    assert results["question_first"] is True and results["num_dev_examples"] >= 12
    assert set(results["dev"]) >= {"exact_match", "f1", "eval_loss", "answers_outside_windows"}
    assert 0.0 <= results["dev"]["f1"] <= 100.0 and [h["step"] for h in results["history"]] == [2, 4]
    assert sorted(results["predictions"]) == sorted(r["id"] for r in qa_rows(12, 2))
    card = (out / "README.md").read_text()
    assert "model-index" in card and "type: question-answering" in card and "exact_match" in card
    model = AutoModelForQuestionAnswering.from_pretrained(out)
    assert type(model).__name__ == "TransformerXLForQuestionAnsweringSimple"


def oracle_scores(job, tokenizer, config):
    """EM / F1 of the post-processing fed the gold start and end of each window (a spike at each)."""
    from modeling_xl.metrics.squad.squad import squad_v1

    raw = job.load()
    _, dev = job.tokenize(raw, tokenizer, config)
    width = max(len(ids) for ids in dev["input_ids"])
    starts = torch.full((len(dev), width), -5.0)
    ends = torch.full((len(dev), width), -5.0)
    for f, (s, e, has) in enumerate(zip(dev["start_positions"], dev["end_positions"],
                                        job.dev_features["has_answer"])):
        if has:
            starts[f, s] = ends[f, e] = 5.0
    texts = job.best_spans(starts, ends)
    refs = [{"id": str(i), "answers": a} for i, a in zip(raw["validation"]["id"], raw["validation"]["answers"])]
    return texts, squad_v1(dict(zip((str(i) for i in raw["validation"]["id"]), texts)), refs), dev


@pytest.mark.parametrize("attn_type", ["uni", "bi"])
def test_question_answering_windows_and_post_processing_recover_every_answer(tmp_path, task_checkpoint, attn_type):
    """Contexts of 60 words read in windows of 24 tokens: every gold span is found in some window, and the oracle's
    logits map back to exactly the answer texts (EM 100), question first (causal) or XLNet's context first (bi)."""
    from transformers import AutoTokenizer

    from modeling_xl.finetuning.question_answering import QuestionAnsweringArguments, QuestionAnsweringJob

    rows = qa_rows(20, 3, filler_words=60)
    write_jsonl(tmp_path / "t.jsonl", rows)
    args = QuestionAnsweringArguments(model_name_or_path=str(task_checkpoint), output_dir=str(tmp_path / "o"),
                                      train_file=str(tmp_path / "t.jsonl"), validation_file=str(tmp_path / "t.jsonl"),
                                      max_length=24, doc_stride=8)
    job = QuestionAnsweringJob(args)
    config = TransformerXLConfig.from_pretrained(task_checkpoint, attn_type=attn_type)
    texts, scores, dev = oracle_scores(job, AutoTokenizer.from_pretrained(task_checkpoint), config)
    assert job.question_first is (attn_type == "uni")
    assert len(dev) > 3 * len(rows)  # several windows per context
    assert texts == [r["answers"]["text"][0] for r in rows]
    assert scores == {"exact_match": 100.0, "f1": 100.0}
    if attn_type == "bi":
        assert "token_type_ids" in dev.column_names


def test_question_answering_answer_outside_every_window_is_counted_not_fatal(tmp_path, task_checkpoint):
    """An answer longer than what a window holds of the context: no window holds it whole; it is counted and the
    run's post-processing still answers (a partial span)."""
    from transformers import AutoTokenizer

    from modeling_xl.finetuning.question_answering import QuestionAnsweringArguments, QuestionAnsweringJob

    context = " ".join(FILLER[:20])
    answer = " ".join(FILLER[2:18])
    rows = [{"id": "long", "question": "where does bob live", "context": context,
             "answers": {"text": [answer], "answer_start": [context.index(answer)]}}]
    write_jsonl(tmp_path / "t.jsonl", rows)
    args = QuestionAnsweringArguments(model_name_or_path=str(task_checkpoint), output_dir=str(tmp_path / "o"),
                                      train_file=str(tmp_path / "t.jsonl"), validation_file=str(tmp_path / "t.jsonl"),
                                      max_length=16, doc_stride=4)
    job = QuestionAnsweringJob(args)
    tokenizer = AutoTokenizer.from_pretrained(task_checkpoint)
    train, dev = job.tokenize(job.load(), tokenizer, TransformerXLConfig.from_pretrained(task_checkpoint))
    assert not any(job.dev_features["has_answer"])
    cls = [len(ids) - 1 for ids in train["input_ids"]]  # `Q <eos> P <eos>`: the last <eos> is the <cls>
    assert train["start_positions"] == cls and train["end_positions"] == cls
    assert job.train_windows_without_answer == len(train)


def test_question_answering_bad_input_is_named_and_writes_nothing(tmp_path, task_checkpoint, capsys):
    good = qa_rows(6, 4)
    bad = [dict(r) for r in good]
    bad[3] = {**bad[3], "answers": {"text": ["berlin"], "answer_start": [0]}}
    train, dev = write_jsonl(tmp_path / "train.jsonl", bad), write_jsonl(tmp_path / "dev.jsonl", good)
    assert run("finetune_question_answering", tmp_path, task_checkpoint, train, dev, "--max_length", "24",
               "--doc_stride", "8") == 1
    error = capsys.readouterr().err
    assert "row 4, column 'answers'" in error and "'berlin'" in error and "does not occur in the context" in error
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    shifted = [dict(r) for r in good]
    start = shifted[0]["answers"]["answer_start"][0]
    shifted[0] = {**shifted[0], "answers": {"text": shifted[0]["answers"]["text"], "answer_start": [start + 1]}}
    write_jsonl(train, shifted)
    assert run("finetune_question_answering", tmp_path, task_checkpoint, train, dev, "--max_length", "24",
               "--doc_stride", "8") == 1
    assert f"occurs at character {start}" in capsys.readouterr().err
    write_jsonl(train, good)
    assert run("finetune_question_answering", tmp_path, task_checkpoint, train, dev, "--max_length", "12",
               "--doc_stride", "8") == 1
    error = capsys.readouterr().err
    assert "column 'question'" in error and "doc_stride=8" in error
    assert run("finetune_question_answering", tmp_path, task_checkpoint, train, dev, "--doc_stride", "400") == 1
    assert "doc_stride=400" in capsys.readouterr().err


# ---- token classification --------------------------------------------------------------------------------------

def test_token_classification_script_end_to_end_with_entity_metrics(tmp_path, task_checkpoint, one_thread):
    from transformers import AutoModelForTokenClassification

    import modeling_xl  # noqa: F401

    train = write_jsonl(tmp_path / "train.jsonl", tag_rows(48, 1))
    dev = write_jsonl(tmp_path / "dev.jsonl", tag_rows(16, 2))
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev, "--max_train_steps", "6") == 0
    out = tmp_path / "out"
    results = json.loads((out / "token_classification_results.json").read_text())
    assert results["label_column"] == "ner_tags" and results["entity_metrics"] is True
    assert results["labels"] == ["B-LOC", "B-PER", "I-PER", "O"]
    assert set(results["dev"]) >= {"f1", "precision", "recall", "accuracy", "unread_words", "eval_loss"}
    assert results["dev"]["unread_words"] == 0
    assert "entity F1" in (out / "README.md").read_text()
    model = AutoModelForTokenClassification.from_pretrained(out)
    assert model.config.id2label == {0: "B-LOC", 1: "B-PER", 2: "I-PER", 3: "O"}


def test_entity_metrics_equal_seqeval(tmp_path):
    """`tagging_scores` on random BIO / IOBES sequences (ill-formed ones included) equals seqeval's default mode."""
    seqeval = pytest.importorskip("seqeval.metrics", reason="seqeval is in the dev extra (pip install -e .[dev])")
    from modeling_xl.finetuning.token_classification import tagging_scores

    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "E-LOC", "S-PER", "I-ORG"]
    for _ in range(30):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(8)]
        predicted = [[rng.choice(tags) for _ in g] for g in gold]
        ours = tagging_scores(predicted, gold, entities=True)
        for key in ("precision", "recall", "f1"):
            theirs = getattr(seqeval, f"{key}_score")(gold, predicted)
            assert ours[key] == pytest.approx(theirs, abs=1e-12), (key, gold, predicted)
        assert ours["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, predicted))


def test_token_classification_long_documents_are_read_whole(tmp_path, task_checkpoint, one_thread):
    """Documents of ~60 words with max_length 16: cut, most words go unread (and count as wrong); with
    --long_document every word is tagged, 16 tokens at a time with memory."""
    train = write_jsonl(tmp_path / "train.jsonl", tag_rows(16, 1, length=(40, 60)))
    dev = write_jsonl(tmp_path / "dev.jsonl", tag_rows(6, 2, length=(40, 60)))
    common = ["--max_train_steps", "2", "--max_length", "16"]
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev, *common, output="cut") == 0
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev, *common, "--long_document",
               output="whole") == 0
    cut = json.loads((tmp_path / "cut" / "token_classification_results.json").read_text())
    whole = json.loads((tmp_path / "whole" / "token_classification_results.json").read_text())
    words = sum(len(r["tokens"]) for r in tag_rows(6, 2, length=(40, 60)))
    assert cut["dev"]["unread_words"] > words / 2 and whole["dev"]["unread_words"] == 0
    assert cut["dev"]["accuracy"] <= 1 - cut["dev"]["unread_words"] / words
    assert "segment_len=16" in (tmp_path / "whole" / "README.md").read_text()


def test_token_classification_bad_input_is_named(tmp_path, task_checkpoint, capsys):
    rows = tag_rows(8, 5)
    rows[2] = {**rows[2], "ner_tags": rows[2]["ner_tags"][:-1]}
    train, dev = write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "dev.jsonl", tag_rows(4, 6))
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev) == 1
    n = len(rows[2]["tokens"])
    assert f"row 3, column 'ner_tags': {n - 1} tags for {n} words" in capsys.readouterr().err
    write_jsonl(train, tag_rows(8, 5))
    odd = tag_rows(4, 6)
    odd[1]["ner_tags"][0] = "B-ORG"
    write_jsonl(dev, odd)
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev) == 1
    assert "row 2, column 'ner_tags': tag 'B-ORG' never occurs in the train split" in capsys.readouterr().err
    write_jsonl(dev, [{"words": ["a"], "ner_tags": ["O"]}])
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev) == 1
    assert "tokens_column='tokens' is not a column of the validation split" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_token_classification_resume_is_exact(tmp_path, task_checkpoint, one_thread):
    """4 steps straight, and 2 + a resume from checkpoint-2 in another folder: the same weights."""
    from safetensors.torch import load_file

    train = write_jsonl(tmp_path / "train.jsonl", tag_rows(24, 1))
    dev = write_jsonl(tmp_path / "dev.jsonl", tag_rows(6, 2))
    common = ["--max_train_steps", "4", "--checkpointing_steps", "2"]
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev, *common, output="a") == 0
    (tmp_path / "b").mkdir()
    import shutil

    shutil.copytree(tmp_path / "a" / "checkpoint-2", tmp_path / "b" / "checkpoint-2")
    assert run("finetune_token_classification", tmp_path, task_checkpoint, train, dev, *common,
               "--resume_from_checkpoint", "latest", output="b") == 0
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- multiple choice -------------------------------------------------------------------------------------------

def test_multiple_choice_script_with_three_four_and_five_choices(tmp_path, task_checkpoint, one_thread):
    from transformers import AutoModelForMultipleChoice

    import modeling_xl  # noqa: F401

    rows = choice_rows(30, 1)
    for i, r in enumerate(rows[:6]):  # labels as letters and as the choice's text work too
        r["label"] = "ABCDE"[r["label"]] if i % 2 else r["choices"][r["label"]]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    dev = write_jsonl(tmp_path / "dev.jsonl", choice_rows(9, 2))
    assert run("finetune_multiple_choice", tmp_path, task_checkpoint, train, dev, "--max_train_steps", "4") == 0
    results = json.loads((tmp_path / "out" / "multiple_choice_results.json").read_text())
    assert results["choices_per_question"]["train"] == {"3": 10, "4": 10, "5": 10}
    assert 0.0 <= results["dev"]["accuracy"] <= 1.0 and results["num_dev_examples"] == 9
    assert "type: multiple-choice" in (tmp_path / "out" / "README.md").read_text()
    assert type(AutoModelForMultipleChoice.from_pretrained(tmp_path / "out")).__name__ == \
        "TransformerXLForMultipleChoice"


def test_multiple_choice_padded_choices_do_not_change_scores(task_checkpoint):
    """A 3-choice question scored alone and in a batch beside a 5-choice one (two absent choices): same logits."""
    from transformers import AutoTokenizer

    from modeling_xl import TransformerXLForMultipleChoice
    from modeling_xl.finetuning.multiple_choice import MultipleChoiceArguments, MultipleChoiceJob

    tokenizer = AutoTokenizer.from_pretrained(task_checkpoint)
    job = MultipleChoiceJob(MultipleChoiceArguments(model_name_or_path="x", output_dir="y"))
    collate = job.collate(tokenizer.pad_token_id)

    def example(question, choices, label):
        return {"input_ids": tokenizer([question] * len(choices), choices)["input_ids"], "labels": label}

    three = example("where does bob live", ["paris", "rome", "oslo"], 1)
    five = example("where does alice live jr", ["lima", "kiev", "cairo", "paris", "rome"], 4)
    model = TransformerXLForMultipleChoice.from_pretrained(task_checkpoint).eval()
    alone = model(**collate([three])).logits
    together = model(**collate([three, five])).logits
    assert together.shape == (2, 5)
    torch.testing.assert_close(together[0, :3], alone[0], rtol=1e-5, atol=1e-5)
    assert (together[0, 3:] == torch.finfo(together.dtype).min).all()


def test_multiple_choice_bad_input_is_named(tmp_path, task_checkpoint, capsys):
    rows = choice_rows(6, 3)
    rows[4] = {**rows[4], "label": 7}
    train, dev = write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "dev.jsonl", choice_rows(3, 4))
    assert run("finetune_multiple_choice", tmp_path, task_checkpoint, train, dev) == 1
    k = len(rows[4]["choices"])
    assert f"row 5, column 'label': 7 names none of the {k} choices" in capsys.readouterr().err
    rows[4] = {**rows[4], "label": 0, "choices": ["paris"]}
    write_jsonl(train, rows)
    assert run("finetune_multiple_choice", tmp_path, task_checkpoint, train, dev) == 1
    assert "row 5, column 'choices': ['paris']; expected a list of at least 2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_multiple_choice_labels_keys_texts_and_context(task_checkpoint):
    """`label_index` reads a label as the Hub's choice keys, then the choices' texts, then an index or a letter; with
    a context only the passage is cut, so the question and the choice are always read."""
    from transformers import AutoTokenizer

    from modeling_xl.finetuning.multiple_choice import MultipleChoiceArguments, MultipleChoiceJob, label_index

    assert label_index("1", ["a", "b"], ["1", "2"]) == 0 and label_index("B", ["a", "b"], ["A", "B"]) == 1
    assert label_index("3", ["1", "2", "3", "4"]) == 2 and label_index("A", ["B", "C", "A"]) == 2
    assert label_index("2", ["x", "y", "z"]) == 2 and label_index("c", ["x", "y", "z"]) == 2
    assert label_index(3, ["x", "y", "z"]) is None and label_index("D", ["x", "y", "z"]) is None
    assert label_index(True, ["x", "y"]) is None
    tokenizer = AutoTokenizer.from_pretrained(task_checkpoint)
    args = MultipleChoiceArguments(model_name_or_path="x", output_dir="y", context_column="passage", max_length=16)
    job = MultipleChoiceJob(args)
    job.targets = {"train": [1], "validation": [1]}
    import datasets

    rows = datasets.Dataset.from_list([{"passage": " ".join(FILLER * 3), "question": "where does bob live",
                                        "choices": ["paris", "rome"], "label": 1}])
    train, _ = job.tokenize(datasets.DatasetDict({"train": rows, "validation": rows}), tokenizer,
                            TransformerXLConfig.from_pretrained(task_checkpoint))
    for ids, choice in zip(train[0]["input_ids"], ["paris", "rome"]):
        assert len(ids) == 16
        assert tokenizer.decode(ids[-7:]).split() == ["<eos>", "where", "does", "bob", "live", choice, "<eos>"]


def test_subset_of_training_rows_keeps_each_rows_label(tmp_path, task_checkpoint, one_thread):
    """--max_train_samples subsets the rows before their labels are read: rows of 2 to 5 choices, the last one
    right, train (a label read from another row would name an absent choice and stop the run)."""
    rows = choice_rows(30, 7, counts=(2, 5))
    for r in rows:
        r["label"] = len(r["choices"]) - 1
    train, dev = write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "dev.jsonl", rows[:4])
    assert run("finetune_multiple_choice", tmp_path, task_checkpoint, train, dev, "--max_train_samples", "12",
               "--max_train_steps", "3", "--per_device_train_batch_size", "4") == 0
    results = json.loads((tmp_path / "out" / "multiple_choice_results.json").read_text())
    assert results["num_train_examples"] == 12 and sum(results["choices_per_question"]["train"].values()) == 12


def test_a_folder_of_another_tasks_run_is_an_earlier_run(tmp_path, task_checkpoint, capsys, one_thread):
    """A multiple-choice run into the folder of a question-answering run is refused; with --overwrite_output_dir
    the earlier run's records (its results file included) go."""
    qa_train = write_jsonl(tmp_path / "qa.jsonl", qa_rows(8, 1))
    assert run("finetune_question_answering", tmp_path, task_checkpoint, qa_train, qa_train, "--max_train_steps",
               "1", "--max_length", "24", "--doc_stride", "8") == 0
    mc = write_jsonl(tmp_path / "mc.jsonl", choice_rows(8, 1))
    assert run("finetune_multiple_choice", tmp_path, task_checkpoint, mc, mc, "--max_train_steps", "1") == 1
    assert "qa_results.json" in capsys.readouterr().err
    assert run("finetune_multiple_choice", tmp_path, task_checkpoint, mc, mc, "--max_train_steps", "1",
               "--overwrite_output_dir") == 0
    out = tmp_path / "out"
    assert (out / "multiple_choice_results.json").is_file() and not (out / "qa_results.json").exists()
