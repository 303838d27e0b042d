"""Sequence classification head: pooling, padding, losses, long documents, loading, XLNet parity, bad input."""

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForSequenceClassification

from modeling_xl import (
    TransformerXLConfig,
    TransformerXLForCausalLM,
    TransformerXLForSequenceClassification,
)
from modeling_xl.modeling_classification import classification_loss, left_align, pool_hidden
from modeling_xl.xlnet_conversion import from_xlnet

REPO = Path(__file__).resolve().parents[1]


def model_for(**overrides):
    config = TransformerXLConfig.from_preset("debug", **{"num_labels": 3, "classifier_dropout": 0.0, **overrides})
    return TransformerXLForSequenceClassification(config).eval()


def naive_pool(hidden, mask, summary_type):
    rows = []
    for b in range(hidden.size(0)):
        real = [t for t in range(hidden.size(1)) if mask[b, t]]
        if summary_type == "last":
            rows.append(hidden[b, real[-1]])
        elif summary_type == "first":
            rows.append(hidden[b, real[0]])
        else:
            rows.append(sum(hidden[b, t] for t in real) / len(real))
    return torch.stack(rows)


@pytest.mark.parametrize("summary_type", ["last", "first", "mean"])
def test_pool_hidden_equals_naive_loop(summary_type):
    hidden = torch.randn(4, 6, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1]])
    torch.testing.assert_close(pool_hidden(hidden, mask, summary_type), naive_pool(hidden, mask, summary_type))
    full = torch.ones(4, 6, dtype=torch.long)
    torch.testing.assert_close(pool_hidden(hidden, None, summary_type), naive_pool(hidden, full, summary_type))


def test_left_align_moves_real_tokens_to_the_end_in_order():
    ids, mask = left_align(torch.tensor([[5, 6, 0, 0], [7, 8, 9, 1]]), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
    assert ids.tolist() == [[0, 0, 5, 6], [7, 8, 9, 1]]
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize("summary_type", ["last", "first", "mean"])
def test_padded_batch_equals_each_sequence_alone(summary_type):
    """Left padding (XLNet style) and right padding give each sequence the logits it has alone."""
    model = model_for(summary_type=summary_type)
    seqs = [torch.randint(1, 97, (n,)) for n in (7, 4, 2)]
    alone = torch.cat([model(s[None]).logits for s in seqs])
    for side in ("left", "right"):
        ids = torch.zeros(3, 7, dtype=torch.long)
        mask = torch.zeros(3, 7, dtype=torch.long)
        for b, s in enumerate(seqs):
            cols = slice(7 - len(s), 7) if side == "left" else slice(0, len(s))
            ids[b, cols], mask[b, cols] = s, 1
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, alone, atol=1e-5, rtol=1e-5)


def test_losses_match_transformers_conventions():
    model = model_for()
    x = torch.randint(0, 97, (4, 5))
    labels = torch.tensor([0, 2, 1, 2])
    out = model(x, labels=labels)
    assert model.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    multi = torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    multi_model = model_for()
    out = multi_model(x, labels=multi)
    assert multi_model.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, multi))
    reg = model_for(num_labels=1)
    target = torch.randn(4)
    out = reg(x, labels=target)
    assert reg.config.problem_type == "regression" and out.logits.shape == (4, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), target))
    out.loss.backward()
    assert all(p.grad is not None for p in reg.parameters() if p.requires_grad)


@pytest.mark.parametrize("labels, problem_type, match", [
    (torch.tensor([0, 3]), "single_label_classification",
     r"labels contains 3; expected class ids in \[0, num_labels=3\)"),
    (torch.tensor([-2, 0]), "single_label_classification", r"labels contains -2"),
    (torch.tensor([0, 1, 2]), "single_label_classification", r"labels has shape \(3,\); expected one class id"),
    (torch.ones(2, 2), "multi_label_classification", r"labels has shape \(2, 2\); expected \[batch=2, num_labels=3\]"),
    (torch.ones(2), "bogus", r"problem_type='bogus' is invalid"),
])
def test_bad_labels_raise(labels, problem_type, match):
    with pytest.raises(ValueError, match=match):
        classification_loss(torch.zeros(2, 3), labels, problem_type)


def test_forward_long_with_full_memory_equals_one_pass():
    """mem_len covering the document: the last token read segment by segment = the last token of one pass, also
    for documents of different lengths padded on either side."""
    model = model_for(mem_len=32)
    docs = [torch.randint(1, 97, (n,)) for n in (13, 9, 5)]
    ids = torch.zeros(3, 13, dtype=torch.long)
    mask = torch.zeros(3, 13, dtype=torch.long)
    for b, d in enumerate(docs):
        ids[b, : len(d)], mask[b, : len(d)] = d, 1  # right padding: forward_long re-aligns
    long = model.forward_long(ids, attention_mask=mask, segment_len=4).logits
    one_pass = torch.cat([model(d[None]).logits for d in docs])
    torch.testing.assert_close(long, one_pass, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("doc_len", [7, 8, 3])
def test_forward_long_bidirectional_any_length_equals_one_pass(doc_len):
    """The bidirectional backbone (its memory cannot hide padding) reads a document of any length: the first segment
    is the short one, nothing is padded; with a memory covering the document it equals one pass."""
    model = model_for(mem_len=16, attn_type="bi", cutoffs=[], adaptive=False)
    docs = torch.randint(1, 97, (2, doc_len))
    long = model.forward_long(docs, segment_len=4).logits
    ids = docs[:, -4:]
    mems = model(docs[:, : doc_len - ids.size(1)]).mems if doc_len > 4 else None
    want = model(ids, mems=mems).logits
    torch.testing.assert_close(long, want, atol=1e-5, rtol=1e-5)


def test_forward_long_trains_only_the_last_segment_and_reports_loss():
    model = model_for(mem_len=8).train()
    out = model.forward_long(torch.randint(1, 97, (2, 20)), labels=torch.tensor([0, 1]), segment_len=6)
    out.loss.backward()
    assert model.logits_proj.weight.grad is not None and out.logits.shape == (2, 3)


def first_segment_task(n, generator, segment_len=8):
    """Documents of two segments; the label (0/1) is written as token 1/2 at a random place in the FIRST segment."""
    first = torch.randint(3, 32, (n, segment_len), generator=generator)
    labels = torch.randint(0, 2, (n,), generator=generator)
    first[torch.arange(n), torch.randint(0, segment_len, (n,), generator=generator)] = labels + 1
    return torch.cat([first, torch.randint(3, 32, (n, segment_len), generator=generator)], 1), labels


@pytest.fixture
def one_thread():
    """Small models train faster on one thread than on two contended ones (the machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_long_document_model(mem_len: int, steps: int = 120) -> float:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    config = TransformerXLConfig(vocab_size=32, d_model=32, n_layer=2, n_head=2, d_head=16, d_inner=64, adaptive=False,
                                 mem_len=mem_len, dropout=0.0, classifier_dropout=0.0, num_labels=2)
    model = TransformerXLForSequenceClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        docs, labels = first_segment_task(32, generator)
        loss = model.forward_long(docs, labels=labels, segment_len=8).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    docs, labels = first_segment_task(512, torch.Generator().manual_seed(1))
    with torch.no_grad():
        predictions = model.eval().forward_long(docs, segment_len=8).logits.argmax(-1)
    return (predictions == labels).float().mean().item()


def test_long_document_label_from_first_segment_is_learned_with_memory_only(one_thread):
    assert train_long_document_model(mem_len=8) > 0.95
    assert train_long_document_model(mem_len=0) < 0.6  # the last segment alone carries no information: chance


@pytest.mark.parametrize("make_mask, match", [
    (lambda: torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), r"documents \[1\] are empty"),
    (lambda: torch.ones(2, 3), r"attention_mask has shape \(2, 3\); expected the shape of input_ids"),
])
def test_forward_long_bad_input(make_mask, match):
    with pytest.raises(ValueError, match=match):
        model_for().forward_long(torch.randint(1, 97, (2, 4)), attention_mask=make_mask(), segment_len=2)
    with pytest.raises(ValueError, match=r"segment_len=0 is invalid"):
        model_for().forward_long(torch.randint(1, 97, (2, 4)), segment_len=0)
    with pytest.raises(ValueError, match=r"input_ids has shape \(2, 0\)"):
        model_for().forward_long(torch.zeros(2, 0, dtype=torch.long), segment_len=2)


def test_forward_bad_attention_mask():
    model = model_for()
    with pytest.raises(ValueError, match=r"attention_mask marks no real token in sequences \[1\]"):
        model(torch.randint(1, 97, (2, 3)), attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(3, 3\); expected \[batch=2"):
        model(torch.randint(1, 97, (2, 3)), attention_mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\); expected \[batch, seq_len=3\]"):
        model(torch.randint(1, 97, (2, 3)), attention_mask=torch.ones(2, 5))


def test_causal_lm_checkpoint_loads_with_only_the_head_new_and_a_warning(tmp_path, caplog):
    lm = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug"))
    lm.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        model = TransformerXLForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    for name, param in lm.transformer.state_dict().items():
        torch.testing.assert_close(model.transformer.state_dict()[name], param)
    assert "MISSING" in caplog.text and "logits_proj" in caplog.text and "sequence_summary" in caplog.text
    assert model.logits_proj.out_features == 2


def test_permutation_lm_checkpoint_loads_into_a_bidirectional_classifier(tmp_path):
    from modeling_xl.modeling_permutation_lm import TransformerXLForPermutationLM

    config = TransformerXLConfig.from_preset("debug", cutoffs=[], adaptive=False, attn_type="bi", n_token_type=3)
    plm = TransformerXLForPermutationLM(config)
    plm.save_pretrained(tmp_path)
    model = TransformerXLForSequenceClassification.from_pretrained(tmp_path, num_labels=2).eval()
    for name, param in plm.transformer.state_dict().items():
        torch.testing.assert_close(model.transformer.state_dict()[name], param)
    x = torch.randint(0, 97, (2, 6))
    hidden = plm.transformer.eval()(x, token_type_ids=torch.zeros_like(x)).last_hidden_state
    want = model.logits_proj(model.sequence_summary(hidden[:, -1]))
    torch.testing.assert_close(model(x, token_type_ids=torch.zeros_like(x)).logits, want)


def test_round_trip_auto_class_and_auto_map(tmp_path):
    model = model_for()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, TransformerXLForSequenceClassification)
    x = torch.randint(0, 97, (2, 5))
    torch.testing.assert_close(loaded(x).logits, model(x).logits)
    auto_map = AutoConfig.from_pretrained(tmp_path).auto_map
    assert auto_map["AutoModelForSequenceClassification"] == (
        "modeling_classification.TransformerXLForSequenceClassification")
    assert (tmp_path / "modeling_classification.py").exists()


REMOTE = textwrap.dedent("""
    import sys, torch
    sys.modules["modeling_xl"] = None  # the code must come from the checkpoint folder
    from transformers import AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    x = torch.load(sys.argv[2], weights_only=True)
    torch.save(model(x, attention_mask=(x > 0).long()).logits, sys.argv[3])
""")


def test_remote_code_loading_in_fresh_process(tmp_path):
    model = model_for()
    model.save_pretrained(tmp_path / "ckpt")
    x = torch.randint(1, 97, (2, 5))
    x[0, :2] = 0
    torch.save(x, tmp_path / "x.pt")
    (tmp_path / "remote.py").write_text(REMOTE)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "remote.py"), str(tmp_path / "ckpt"), str(tmp_path / "x.pt"),
                           str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.testing.assert_close(got, model(x, attention_mask=(x > 0).long()).logits)


def test_xlnet_sequence_classification_logits_match_transformers():
    """Random-weight transformers 5 `XLNetForSequenceClassification` imported: equal logits and memories
    (left padding, segments A <sep> B <sep> <cls>, then a second segment with memory)."""
    from transformers import XLNetConfig, XLNetForSequenceClassification

    config = XLNetConfig(vocab_size=50, d_model=16, n_layer=2, n_head=2, d_inner=32, num_labels=3, mem_len=6,
                         attn_type="bi", dropout=0.0, summary_last_dropout=0.0)
    reference = XLNetForSequenceClassification(config).eval()
    with torch.no_grad():
        for param in reference.parameters():  # larger than the default init, so every term matters
            param.normal_(0.0, 0.3)
    ours = from_xlnet(TransformerXLForSequenceClassification, reference)
    assert ours.config.attn_type == "bi" and ours.config.num_labels == 3
    x = torch.randint(5, 50, (3, 7))
    x[:, -1] = 3  # <cls> last
    token_type_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 2]] * 3)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :2], mask[2, :4] = 0, 0  # left padding
    with torch.no_grad():
        want = reference(x, token_type_ids=token_type_ids, attention_mask=mask.float(), use_mems=True)
        got = ours(x, token_type_ids=token_type_ids, attention_mask=mask)
        assert (want.logits - got.logits).abs().max() <= 1e-5
        for theirs, mine in zip(want.mems, got.mems):  # theirs [M, B, d], ours [B, M, d]
            assert (theirs.transpose(0, 1) - mine).abs().max() <= 1e-5
        x2 = torch.randint(5, 50, (3, 5))
        want2, got2 = reference(x2, mems=want.mems, use_mems=True), ours(x2, mems=got.mems)
        assert (want2.logits - got2.logits).abs().max() <= 1e-5


# ---- fine-tuning library and script (modeling_xl.training.classification, scripts/finetune_classification.py) ----

POSITIVE, NEGATIVE = ("good", "great", "fine", "nice"), ("bad", "awful", "poor", "dull")


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


def write_tsv(path, rows, header=("sentence", "label")):
    path.write_text("\t".join(header) + "\n" + "".join(f"{text}\t{label}\n" for text, label in rows))
    return path


@pytest.fixture
def lm_checkpoint(tmp_path):
    from tokenization import train_word_level_tokenizer

    tokenizer = train_word_level_tokenizer([text for text, _ in sentiment_rows(200, 0)])
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), cutoffs=[10])
    TransformerXLForCausalLM(config).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    return tmp_path / "lm"


def finetune_args(tmp_path, checkpoint, **overrides):
    from modeling_xl.training.classification import FinetuneArguments

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(256, 1))
    dev = write_tsv(tmp_path / "dev.tsv", sentiment_rows(64, 2))
    values = dict(model_name_or_path=str(checkpoint), output_dir=str(tmp_path / "out"), train_file=str(train),
                  validation_file=str(dev), per_device_train_batch_size=16, learning_rate=3e-3, num_train_epochs=3,
                  eval_steps=24, checkpointing_steps=40, disable_tqdm=True)
    return FinetuneArguments(**{**values, **overrides})


def test_finetuning_learns_and_writes_model_card_checkpoints_and_results(tmp_path, lm_checkpoint, one_thread):
    from modeling_xl.training.classification import run_finetuning

    results = run_finetuning(finetune_args(tmp_path, lm_checkpoint))
    out = tmp_path / "out"
    assert results["train_steps"] == 48 and len(results["history"]) == 2
    assert results["dev"]["accuracy"] > 0.9, results["dev"]
    saved = json.loads((out / "classification_results.json").read_text())
    assert saved["dev"]["accuracy"] == pytest.approx(results["dev"]["accuracy"])
    assert (out / "checkpoint-40").is_dir()
    card = (out / "README.md").read_text()
    assert f"{results['dev']['accuracy']:.4f}" in card and "model-index" in card and "accuracy" in card
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.id2label == {0: "0", 1: "1"}


def test_finetune_script_from_scratch_with_comparison_in_the_card(tmp_path, lm_checkpoint, one_thread):
    spec = importlib.util.spec_from_file_location("finetune", REPO / "scripts" / "finetune_classification.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = finetune_args(tmp_path, lm_checkpoint)
    write_json = tmp_path / "base.json"
    write_json.write_text(json.dumps({"initialisation": "pretrained elsewhere", "train_steps": 5,
                                      "train_seconds": 1.0, "dev": {"accuracy": 0.5, "f1": 0.25}}))
    code = script.main(["--model_name_or_path", str(lm_checkpoint), "--output_dir", str(tmp_path / "scratch"),
                        "--train_file", args.train_file, "--validation_file", args.validation_file,
                        "--from_scratch", "--max_train_steps", "3", "--disable_tqdm", "--compare_with",
                        str(write_json)])
    assert code == 0
    card = (tmp_path / "scratch" / "README.md").read_text()
    assert "| from scratch |" in card and "| pretrained elsewhere | 0.5000 | 0.2500 | 5 | 1 |" in card


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a, p: write_tsv(p / "dev.tsv", [("fine film", 7)]), ValueError,
     r"label_column='label' of the validation split has unknown label values \[7\]; expected one of \[0, 1\]"),
    (lambda a, p: setattr(a, "text_column", "text"), ValueError,
     r"text_column='text' is not a column of the train split; expected one of \['sentence', 'label'\]"),
    (lambda a, p: write_tsv(p / "dev.tsv", [("fine film", 1), ("  ", 0)]), ValueError,
     r"the validation split has empty texts in 'sentence' at rows \[1\]"),
    (lambda a, p: setattr(a, "validation_file", str(p / "nope.tsv")), FileNotFoundError, r"validation_file="),
    (lambda a, p: setattr(a, "dataset_name", "glue"), ValueError, r"expected exactly one of them"),
])
def test_finetuning_bad_input(tmp_path, lm_checkpoint, mutate, error, match):
    from modeling_xl.training.classification import run_finetuning

    args = finetune_args(tmp_path, lm_checkpoint)
    mutate(args, tmp_path)
    with pytest.raises(error, match=match):
        run_finetuning(args)


def test_hub_dataset_goes_through_load_dataset_and_fails_offline_with_a_clear_message(tmp_path, monkeypatch):
    import datasets

    from modeling_xl.training.classification import FinetuneArguments, load_raw_datasets

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
    from modeling_xl.training.classification import FinetuneArguments, load_raw_datasets

    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("index\tsentence\tlabel\n7\tfine\t1\n", encoding="utf-8")
    args = FinetuneArguments(model_name_or_path="unused", output_dir=str(tmp_path / "out"),
                             train_file=str(tmp_path / "train.tsv"), validation_file=str(tmp_path / "dev.tsv"))
    raw = load_raw_datasets(args)
    assert raw["train"]["label"] == [1, 0] and raw["validation"]["sentence"] == ["fine"]


def test_offline_metric_modules_match_definitions():
    import evaluate

    from modeling_xl.metrics import METRICS_DIR

    metrics = evaluate.combine([str(METRICS_DIR / "accuracy"), str(METRICS_DIR / "f1")])
    assert metrics.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0]) == pytest.approx(
        {"accuracy": 0.75, "f1": 2 / 3})
    f1 = evaluate.load(str(METRICS_DIR / "f1"))
    # per class F1: class 0: 1.0, class 1: 2/3, class 2: 2/3 -> macro 7/9
    assert f1.compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2], average="macro")["f1"] == pytest.approx(7 / 9)


@pytest.mark.parametrize("overrides, match", [
    ({"max_length": 0}, r"max_length=0 is invalid; expected a positive integer"),
    ({"max_length": -5}, r"max_length=-5 is invalid; expected a positive integer"),
    ({"per_device_train_batch_size": 0}, r"per_device_train_batch_size=0 is invalid; expected a positive integer"),
    ({"overwrite_output_dir": True, "resume_from_checkpoint": "latest"}, r"overwrite_output_dir=True and "
     r"resume_from_checkpoint='latest' are both set; expected one"),
    ({"learning_rate": 0.0}, r"learning_rate=0.0 is invalid; expected a positive number"),
    ({"max_train_time": -5.0}, r"max_train_time=-5.0 is invalid; expected a positive number of seconds"),
    ({"summary_type": "bogus"}, r"summary_type='bogus' is invalid; expected 'last', 'first' or 'mean'"),
    ({"compare_with": "/nonexistent"}, r"compare_with='/nonexistent' is invalid; expected a "
     r"classification_results.json file"),
    ({"model_name_or_path": "/nonexistent/model"}, r"model_name_or_path='/nonexistent/model' does not exist; "
     r"expected a local folder"),
])
def test_finetuning_bad_arguments_are_named_before_anything_is_written(tmp_path, lm_checkpoint, overrides, match):
    from modeling_xl.training.classification import run_finetuning

    with pytest.raises(ValueError, match=match):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, **overrides))
    assert not (tmp_path / "out").exists()


def test_finetuning_never_writes_over_the_model_it_starts_from_and_checks_the_tokenizer(tmp_path, lm_checkpoint):
    """--overwrite_output_dir into the pretrained model's own folder replaced its weights, config and card; a
    tokenizer larger than the model failed at the first batch, naming neither (and left a log that blocked a retry)."""
    from modeling_xl.training.classification import run_finetuning
    from tokenization import train_word_level_tokenizer

    before = {p.name: p.read_bytes() for p in lm_checkpoint.iterdir()}
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"output_dir=.* is the folder of model_name_or_path=.*; the fine-tuned "
                                             "model would be saved over it"):
            run_finetuning(finetune_args(tmp_path, lm_checkpoint, output_dir=str(lm_checkpoint),
                                         overwrite_output_dir=overwrite))
    assert {p.name: p.read_bytes() for p in lm_checkpoint.iterdir()} == before
    big = train_word_level_tokenizer([f"w{i}" for i in range(300)])
    big.save_pretrained(tmp_path / "big")
    with pytest.raises(ValueError, match=r"tokenizer_name=.*big' does not fit model_name_or_path=.*tokenizer "
                                         r"vocabulary has 302 tokens but config.vocab_size="):
        run_finetuning(finetune_args(tmp_path, lm_checkpoint, tokenizer_name=str(tmp_path / "big")))
    assert not (tmp_path / "out" / "train_log.jsonl").exists()  # a retry in the same folder is not refused


def step_losses(out) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_finetuning_resumed_from_a_checkpoint_trains_on_the_same_batches(tmp_path, lm_checkpoint, one_thread):
    """4 batches per epoch, a checkpoint at step 6 (in the middle of the second epoch), dropout on: the resumed run
    logs the losses of the uninterrupted one. A new run in a folder with checkpoints is refused unless it overwrites."""
    import shutil

    from modeling_xl.training.classification import run_finetuning

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
    assert second["dev"] == pytest.approx(first["dev"], rel=1e-6)
    assert [h["step"] for h in second["history"]] == [5, 10] and second["train_steps"] == 10
    with pytest.raises(ValueError, match=r"output_dir=.* already holds an earlier run \(checkpoint-6, train_log.jsonl, "
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
    from modeling_xl.training.classification import build_metrics, evaluate_model, left_pad_collate

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = TransformerXLForSequenceClassification(TransformerXLConfig.from_preset("debug", num_labels=2))
    generator = torch.Generator().manual_seed(1)  # 13 examples of different lengths: the last batch is uneven
    dev = [{"input_ids": torch.randint(1, 97, (int(n),), generator=generator).tolist(), "labels": i % 2}
           for i, n in enumerate(torch.randint(2, 9, (13,), generator=generator))]
    loader = accelerator.prepare(DataLoader(dev, batch_size=4, collate_fn=left_pad_collate(0)))
    metrics, kwargs = build_metrics(2)
    result = evaluate_model(accelerator, accelerator.prepare(model), loader, metrics, kwargs)
    with open(f"{sys.argv[1]}/rank{accelerator.process_index}.json", "w") as handle:
        json.dump(result, handle)
""")


def test_dev_loss_of_two_processes_is_the_loss_over_the_whole_dev_set(tmp_path):
    import socket

    from modeling_xl.training.classification import build_metrics, evaluate_model, left_pad_collate

    (tmp_path / "driver.py").write_text(TWO_PROCESS_EVAL)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(port), str(tmp_path / "driver.py"), str(tmp_path)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # the same whole-set numbers in one process, and the mean of the per-example losses by hand
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = TransformerXLForSequenceClassification(TransformerXLConfig.from_preset("debug", num_labels=2)).eval()
    generator = torch.Generator().manual_seed(1)
    dev = [{"input_ids": torch.randint(1, 97, (int(n),), generator=generator).tolist(), "labels": i % 2}
           for i, n in enumerate(torch.randint(2, 9, (13,), generator=generator))]
    with torch.no_grad():
        by_hand = sum(float(model(torch.tensor([e["input_ids"]]), labels=torch.tensor([e["labels"]])).loss)
                      for e in dev) / len(dev)
    one = evaluate_model(Accelerator(cpu=True), model, DataLoader(dev, batch_size=4, collate_fn=left_pad_collate(0)),
                         *build_metrics(2))
    assert one["eval_loss"] == pytest.approx(by_hand, rel=1e-5)
    for result in ranks:
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
def test_finetuning_train_loop_resumed_anywhere_reads_the_uninterrupted_batches(num_processes):
    """Resumed from a checkpoint in the middle of an epoch or at its end, the loop reads the batches (and RNG draws)
    of the uninterrupted run, in that epoch and the next ones. With several processes the order comes from the
    generator Accelerate shares between them (here process 0 of 2), which Accelerate's own state does not save."""
    import types

    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    from modeling_xl.training.classification import train_loop

    def loader():
        set_seed(0)
        plain = DataLoader([{"x": i} for i in range(12)], batch_size=2, shuffle=True)
        if num_processes == 1:
            return plain
        return prepare_data_loader(plain, num_processes=2, process_index=0, put_on_device=False,
                                   rng_types=["generator"])

    Accelerator(cpu=True)
    args = types.SimpleNamespace(disable_tqdm=True, eval_steps=None, checkpointing_steps=1, max_train_time=None)
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
