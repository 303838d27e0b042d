"""Sequence classification head: pooling, padding, losses, long documents, loading, XLNet parity, bad input."""

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
from modeling_xl.modeling_classification import classification_loss, left_align
from modeling_xl.task_model import pool_hidden
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
    mems = model(docs[:, : doc_len - ids.size(1)], use_mems=True).mems if doc_len > 4 else None
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


def train_long_document_model(mem_len: int, steps: int = 300, seed: int = 0, detach_memory: bool = False) -> float:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    config = TransformerXLConfig(vocab_size=32, d_model=32, n_layer=2, n_head=2, d_head=16, d_inner=64, adaptive=False,
                                 mem_len=mem_len, dropout=0.0, classifier_dropout=0.0, num_labels=2)
    model = TransformerXLForSequenceClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        docs, labels = first_segment_task(32, generator)
        loss = model.forward_long(docs, labels=labels, segment_len=8, detach_memory=detach_memory).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    docs, labels = first_segment_task(512, torch.Generator().manual_seed(1))
    with torch.no_grad():
        predictions = model.eval().forward_long(docs, segment_len=8).logits.argmax(-1)
    return (predictions == labels).float().mean().item()


@pytest.mark.training_outcome
def test_long_document_label_from_first_segment_is_learned_with_memory_only(one_thread):
    """The label is in the first segment, the classifier reads the last: only the memory carries it. 300 steps: the
    accuracy's lowest of 10 draws (5 seeds x 2 CPU kernel sets) 0.996. At 120 steps (until issue 50) the model is
    still finding the cue: this very draw gave 0.875 under AVX2 kernels, 0.945 under AVX-512 (issue 50's machine) and
    0.980 under the scalar ones, against the 0.95 then asserted. Without memory: 0.44-0.54 (docs/testing.md)."""
    assert train_long_document_model(mem_len=8) > 0.9
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


def test_causal_lm_checkpoint_loads_with_only_the_head_new_and_a_warning(tmp_path):
    lm = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug"))
    lm.save_pretrained(tmp_path)
    # transformers' load report, read on its own logger: it reaches the root logger in 5.24, not in 5.13
    report, handler = [], logging.Handler(logging.WARNING)
    handler.emit = lambda record: report.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        model = TransformerXLForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    for name, param in lm.transformer.state_dict().items():
        torch.testing.assert_close(model.transformer.state_dict()[name], param)
    report = "\n".join(report)
    assert "MISSING" in report and "logits_proj" in report and "sequence_summary" in report, report
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
        got = ours(x, token_type_ids=token_type_ids, attention_mask=mask, use_mems=True)
        assert (want.logits - got.logits).abs().max() <= 1e-5
        for theirs, mine in zip(want.mems, got.mems):  # theirs [M, B, d], ours [B, M, d]
            assert (theirs.transpose(0, 1) - mine).abs().max() <= 1e-5
        x2 = torch.randint(5, 50, (3, 5))
        want2, got2 = reference(x2, mems=want.mems, use_mems=True), ours(x2, mems=got.mems)
        assert (want2.logits - got2.logits).abs().max() <= 1e-5


def test_forward_long_gradient_equals_one_long_reads():
    """The memory of `forward_long` keeps its graph: the loss's gradient of every weight (the embeddings of tokens
    only the first segments hold included) equals that of one read of the whole document; `detach_memory=True`
    trains only the last segment (the first tokens' embeddings get no gradient)."""
    from modeling_xl import TransformerXLConfig, TransformerXLForSequenceClassification

    torch.manual_seed(0)
    config = TransformerXLConfig.from_preset("debug", vocab_size=40, cutoffs=[10], mem_len=24, num_labels=3)
    model = TransformerXLForSequenceClassification(config).eval()  # no dropout: the two reads see the same masks
    # ids 0-9 (the adaptive embedding's first cluster, cutoff 10) only in the first (short, 5-token) segment
    ids = torch.cat([torch.randint(0, 10, (2, 5)), torch.randint(10, 40, (2, 16))], dim=1)
    labels = torch.tensor([0, 2])

    def gradients(**kwargs):
        model.zero_grad()
        model(ids, labels=labels, **kwargs).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    whole, long = gradients(), gradients(segment_len=8)
    assert whole.keys() == long.keys()
    for name in whole:
        torch.testing.assert_close(long[name], whole[name], rtol=1e-4, atol=1e-6)
    first_cluster = "transformer.word_emb.emb_layers.0.weight"
    assert whole[first_cluster].abs().sum() > 0
    detached = gradients(segment_len=8, detach_memory=True)
    assert first_cluster not in detached or detached[first_cluster].abs().sum() == 0
