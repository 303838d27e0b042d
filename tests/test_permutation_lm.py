"""Permutation-LM (XLNet-style two-stream) head: maths units, parity with transformers XLNet, no leak, memory,
gradients, loading, training on WikiText-2, bad input."""

import json
import math
import time
from collections import Counter

import pytest
import torch
from generated_corpora import wikitext_lines
from transformers import AutoModelForPreTraining, XLNetConfig, XLNetLMHeadModel

from modeling_xl import TransformerXLConfig, TransformerXLForPermutationLM
from modeling_xl.relative_attention import rel_shift
from modeling_xl.two_stream_attention import (
    permutation_masks,
    relative_scores_at,
    segment_mismatch,
    segment_scores,
)
from modeling_xl.xlnet_conversion import from_xlnet

V = 50


def plm_model(**overrides):
    values = dict(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, adaptive=False,
                  attn_type="bi", ff_activation="gelu", mem_len=6, reuse_len=4, dropout=0.0, dropatt=0.0)
    return TransformerXLForPermutationLM(TransformerXLConfig(**{**values, **overrides})).eval()


def order_masks(order: torch.Tensor, num_predict: int):
    """perm_mask and target_mapping from factorization orders [B, T]: position i sees j iff j comes earlier
    (order[j] < order[i]); the last `num_predict` of each order are the targets, in position order."""
    batch, length = order.shape
    perm_mask = (order[:, None, :] >= order[:, :, None]).float()  # [B, i, j]
    target_mapping = torch.zeros(batch, num_predict, length)
    for b in range(batch):
        targets = (order[b] >= length - num_predict).nonzero().flatten()
        target_mapping[b, torch.arange(num_predict), targets] = 1.0
    return perm_mask, target_mapping


# ---------------------------------------------------------------- pure functions against naive loops


def test_relative_scores_at_matches_naive_gather_and_rel_shift():
    scores = torch.randn(2, 3, 4, 9)  # [B, H, P, R]
    pos = torch.tensor([[0, 3, 1, 2], [2, 2, 0, 1]])
    klen, shift = 6, 3
    got = relative_scores_at(scores, pos, klen, shift)
    for b in range(2):
        for m in range(4):
            for j in range(klen):
                torch.testing.assert_close(got[b, :, m, j], scores[b, :, m, j + shift - pos[b, m]])
    content = torch.randn(2, 3, 4, 10)  # T=4 queries at 0..3, K=6, bidirectional R = K + T
    every = torch.arange(4).expand(2, 4)
    torch.testing.assert_close(relative_scores_at(content, every, 6, 4), rel_shift(content, 6, 4))


def test_segment_mismatch_and_scores_naive():
    tt = torch.tensor([[0, 1, 2], [1, 1, 0]])
    mism = segment_mismatch(tt, mlen=2)
    assert mism.shape == (2, 3, 5)
    for b in range(2):
        keys = [0, 0] + tt[b].tolist()
        for i in range(3):
            assert mism[b, i].tolist() == [tt[b, i].item() != k for k in keys]
    q, s, emb = torch.randn(2, 4, 3, 8), torch.randn(4, 8), torch.randn(2, 4, 8)
    got = segment_scores(q, s, emb, mism)
    for b, h, i, j in [(0, 1, 2, 0), (1, 3, 0, 4), (0, 0, 1, 2), (1, 2, 2, 1)]:
        want = (q[b, h, i] + s[h]) @ emb[int(mism[b, i, j]), h]
        torch.testing.assert_close(got[b, h, i, j], want)


def test_permutation_masks_naive():
    perm = (torch.rand(2, 4, 4) > 0.5).float()
    attention = torch.tensor([[0.0, 1, 1, 1], [1, 1, 1, 1]])
    content, query = permutation_masks(perm, attention, mlen=2, causal=True, batch=2, qlen=4, device="cpu")
    for b in range(2):
        for i in range(4):
            for j in range(6):
                hidden = j >= 2 and (perm[b, i, j - 2] > 0 or attention[b, j - 2] == 0 or j - 2 > i)
                assert bool(query[b, i, j]) == hidden
                assert bool(content[b, i, j]) == (hidden and j - 2 != i)
    assert permutation_masks(None, None, 2, False, 2, 4, "cpu") == (None, None)


# ---------------------------------------------------------------- parity with transformers' XLNetLMHeadModel


def xlnet_pair(**xlnet_kwargs):
    config = XLNetConfig(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_inner=32, ff_activation="gelu", mem_len=6,
                         reuse_len=4, clamp_len=5, dropout=0.0, use_mems_eval=True, initializer_range=0.3,
                         **xlnet_kwargs)
    reference = XLNetLMHeadModel(config).eval()
    return reference, from_xlnet(TransformerXLForPermutationLM, reference)


@pytest.mark.parametrize("bi_data", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_parity_with_transformers_xlnet_over_two_steps_with_memory(bi_data, attn):
    reference, ours = xlnet_pair(bi_data=bi_data)
    ours.set_attn_implementation(attn)
    batch, length, num_predict = 4, 8, 3
    ref_mems = our_mems = None
    for _ in range(2):
        x = torch.randint(0, V, (batch, length))
        perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(length) for _ in range(batch)]),
                                                num_predict)
        target_mapping[0, -1] = 0.0  # a padded prediction row
        token_type_ids = torch.randint(0, 3, (batch, length))
        attention_mask = torch.ones(batch, length)
        attention_mask[1, :2] = 0.0  # left padding
        ref = reference(x, perm_mask=perm_mask, target_mapping=target_mapping, token_type_ids=token_type_ids,
                        attention_mask=attention_mask, mems=ref_mems, use_mems=True)
        out = ours(x, perm_mask, target_mapping, token_type_ids, attention_mask, mems=our_mems)
        assert out.logits.shape == (batch, num_predict, V) and ref.logits.abs().max() > 0.1
        torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=0)
        assert len(out.mems) == 2 and all(m.shape[1] == (4 if our_mems is None else 6) for m in out.mems)
        for mine, theirs in zip(out.mems, ref.mems):
            torch.testing.assert_close(mine, theirs.transpose(0, 1), atol=1e-5, rtol=0)
        ref_mems, our_mems = ref.mems, out.mems


def test_parity_content_stream_only_and_causal_table():
    """Without target_mapping both score every position from the content stream; attn_type 'uni' uses XLNet's
    causal table (K ... 0). (transformers' XLNet fails on 'uni' with a perm_mask, so none is given here.)"""
    for attn_type in ("bi", "uni"):
        reference, ours = xlnet_pair(attn_type=attn_type)
        x, tt = torch.randint(0, V, (2, 7)), torch.randint(0, 2, (2, 7))
        ref = reference(x, token_type_ids=tt, use_mems=True)
        out = ours(x, token_type_ids=tt)
        torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=0)
        _, target_mapping = order_masks(torch.stack([torch.randperm(7) for _ in range(2)]), 2)
        ref2 = reference(x, target_mapping=target_mapping, mems=ref.mems, use_mems=True)
        torch.testing.assert_close(ours(x, target_mapping=target_mapping, mems=out.mems).logits, ref2.logits,
                                   atol=1e-5, rtol=0)


# ---------------------------------------------------------------- no leak


@pytest.mark.parametrize("bi_data", [False, True])
def test_no_leak_a_target_never_depends_on_itself_or_later_targets(bi_data):
    """For random orders: target t's logits ignore its own token and every later-ordered token, and depend on every
    earlier-ordered one (earlier targets included), with memory and segments. Row 0 is the unchanged input, row
    1 + j has token j replaced; with bi_data the batch is doubled so both position tables are checked. Float64, so
    that "ignores" can mean 1e-9: in float32 rows of one batch may round differently at the 1e-6 level."""
    torch.manual_seed(1)
    model = plm_model(bi_data=bi_data, init_std=0.3, n_layer=3).double()
    length, num_predict, copies = 9, 4, 2 if bi_data else 1
    for _ in range(3):
        x = torch.randint(0, V, (1, length))
        order = torch.randperm(length)[None]
        perm_mask, target_mapping = order_masks(order, num_predict)
        rows = x.repeat(length + 1, 1)
        for j in range(length):
            rows[1 + j, j] = (x[0, j] + torch.randint(1, V, ())) % V
        n = copies * (length + 1)
        previous = torch.randint(0, V, (1, length)).expand(n, -1)  # the same memory in every row
        mems = model(previous, perm_mask.expand(n, -1, -1), target_mapping.expand(n, -1, -1)).mems
        token_type_ids = torch.tensor([[0] * 5 + [1] * 4]).expand(n, -1)
        logits = model(rows.repeat(copies, 1), perm_mask.expand(n, -1, -1), target_mapping.expand(n, -1, -1),
                       token_type_ids, mems=mems).logits
        for half in logits.view(copies, length + 1, num_predict, V):
            for m, t in enumerate(target_mapping[0].argmax(-1).tolist()):
                for j in range(length):
                    diff = (half[1 + j, m] - half[0, m]).abs().max().item()
                    if order[0, j] >= order[0, t]:  # the target itself or later in the order
                        assert diff < 1e-9, (t, j, diff)
                    else:
                        assert diff > 1e-4, (t, j, diff)


# ---------------------------------------------------------------- memory, loss, gradients, loading


def test_memory_is_reuse_part_of_each_layer_input():
    model = plm_model(mem_len=6, reuse_len=3)
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 2)
    first = model(x, perm_mask, target_mapping, output_hidden_states=True)
    content = [h for h, _ in first.hidden_states[:-1]]  # each layer's content-stream input
    for mem, h in zip(first.mems, content):
        torch.testing.assert_close(mem, h[:, :3])
    second = model(x, perm_mask, target_mapping, mems=first.mems, output_hidden_states=True)
    for old, mem, (h, _) in zip(first.mems, second.mems, second.hidden_states[:-1]):
        torch.testing.assert_close(mem, torch.cat([old, h[:, :3]], 1)[:, -6:])
        assert not mem.requires_grad
    # the forward argument overrides config.reuse_len
    assert model(x, perm_mask, target_mapping, reuse_len=5).mems[0].shape == (2, 5, 16)


def test_a_saved_reuse_len_longer_than_the_input_keeps_every_token():
    # a model pretrained with reuse_len 12 (config) still reads an 8-token input: its memory is all 8 tokens, as
    # transformers' XLNet gives; an explicit reuse_len must fit
    model = plm_model(mem_len=10, reuse_len=12)
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 2)
    out = model(x, perm_mask, target_mapping, output_hidden_states=True)
    for mem, (h, _) in zip(out.mems, out.hidden_states[:-1]):
        torch.testing.assert_close(mem, h)
    assert model(x[:, :6], perm_mask[:, :6, :6], target_mapping[:, :, :6]).mems[0].shape == (2, 6, 16)
    with pytest.raises(ValueError, match=r"reuse_len=12 does not fit seq_len=8"):
        model(x, perm_mask, target_mapping, reuse_len=12)


def test_loss_is_masked_mean_of_target_cross_entropy():
    model = plm_model()
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    labels = torch.randint(0, V, (2, 3))
    target_mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    out = model(x, perm_mask, target_mapping, labels=labels, target_mask=target_mask)
    ce = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), labels, reduction="none")
    torch.testing.assert_close(out.loss, (ce * target_mask).sum() / target_mask.sum())
    torch.testing.assert_close(out.losses, ce * target_mask)
    ignored = labels.masked_fill(target_mask == 0, -100)
    torch.testing.assert_close(model(x, perm_mask, target_mapping, labels=ignored).loss, out.loss)
    int32 = model(x, perm_mask, target_mapping, labels=labels.int(), target_mask=target_mask)  # as a collator may give
    torch.testing.assert_close(int32.loss, out.loss)


def test_gradient_reaches_every_parameter_and_checkpointing_matches():
    model = plm_model(bi_data=True, n_token_type=0).train()
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    kwargs = dict(token_type_ids=torch.randint(0, 2, (2, 8)), labels=torch.randint(0, V, (2, 3)))
    mems = model(x, perm_mask, target_mapping).mems
    model(x, perm_mask, target_mapping, mems=mems, **kwargs).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), [n for n, g in grads.items()
                                                                                if g is None or not g.abs().sum()]
    model.zero_grad()
    from modeling_xl.training.models import enable_checkpointing

    enable_checkpointing(model)
    model(x, perm_mask, target_mapping, mems=mems, **kwargs).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-6, rtol=1e-5)


def test_shared_biases_and_tied_output_layer(tmp_path):
    model = plm_model(untie_r=False)
    assert model.lm_head.weight is model.transformer.word_emb.weight
    assert "r_s_bias" in dict(model.transformer.named_parameters())
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    model.save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForPreTraining"] == "modeling_permutation_lm.TransformerXLForPermutationLM"
    assert auto_map["AutoModel"] == "modeling_permutation_lm.TransformerXLPermutationModel"
    assert "AutoModelForCausalLM" not in auto_map
    for cls in (AutoModelForPreTraining, TransformerXLForPermutationLM):
        loaded = cls.from_pretrained(tmp_path).eval()
        assert isinstance(loaded, TransformerXLForPermutationLM)
        assert loaded.lm_head.weight is loaded.transformer.word_emb.weight
        torch.testing.assert_close(loaded(x, perm_mask, target_mapping).logits,
                                   model(x, perm_mask, target_mapping).logits)


def test_xlnet_presets_match_transformers_xlnet_sizes():
    for name, reference in (("xlnet-base", dict(d_model=768, n_layer=12, n_head=12, d_inner=3072)),
                            ("xlnet-large", dict(d_model=1024, n_layer=24, n_head=16, d_inner=4096))):
        config = TransformerXLConfig.from_preset(name)
        with torch.device("meta"):
            ours = TransformerXLForPermutationLM(config)
            theirs = XLNetLMHeadModel(XLNetConfig(vocab_size=32000, ff_activation="gelu", **reference))
        count = sum(p.numel() for p in ours.parameters())
        assert count == sum(p.numel() for p in theirs.parameters()), name
        assert (config.attn_type, config.reuse_len, config.mem_len) == ("bi", 256, 384)


# ---------------------------------------------------------------- bad input


def _bad_inputs():
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    return x, perm_mask, target_mapping


@pytest.mark.parametrize("change,match", [
    (lambda x, pm, tm: dict(perm_mask=pm[:, :7]), r"perm_mask has shape \(2, 7, 8\); expected \[batch=2, seq_len=8"),
    (lambda x, pm, tm: dict(target_mapping=tm[:, :, :7]), r"target_mapping has shape \(2, 3, 7\); expected"),
    (lambda x, pm, tm: dict(target_mapping=tm[0]), r"target_mapping has shape \(3, 8\)"),
    (lambda x, pm, tm: dict(target_mapping=tm * 2), "not one-hot"),
    (lambda x, pm, tm: dict(target_mapping=tm + tm.roll(1, -1)), "not one-hot"),
    (lambda x, pm, tm: dict(token_type_ids=x[:, :5]), r"token_type_ids has shape \(2, 5\)"),
    (lambda x, pm, tm: dict(attention_mask=torch.ones(2, 9)), r"attention_mask has shape \(2, 9\)"),
    (lambda x, pm, tm: dict(reuse_len=8), r"reuse_len=8 does not fit seq_len=8"),
    (lambda x, pm, tm: dict(labels=x), r"labels has shape \(2, 8\); expected \[batch, num_predict\]"),
    (lambda x, pm, tm: dict(labels=x[:, :3] + V), "labels has ids outside"),
    (lambda x, pm, tm: dict(labels=x[:, :3], target_mask=torch.ones(2, 4)), r"target_mask has shape \(2, 4\)"),
])
def test_bad_input_raises_value_error_naming_the_argument(change, match):
    x, perm_mask, target_mapping = _bad_inputs()
    kwargs = dict(input_ids=x, perm_mask=perm_mask, target_mapping=target_mapping)
    with pytest.raises(ValueError, match=match):
        plm_model()(**{**kwargs, **change(x, perm_mask, target_mapping)})


def test_bad_config_and_odd_batch_with_bi_data():
    x, perm_mask, target_mapping = _bad_inputs()
    with pytest.raises(ValueError, match="batch size 1 is odd; bi_data=True expects an even batch"):
        plm_model(bi_data=True)(x[:1], perm_mask[:1], target_mapping[:1])
    with pytest.raises(ValueError, match=r"reuse_len=12 does not fit seq_len=8"):
        plm_model()(x, perm_mask, target_mapping, reuse_len=12)
    with pytest.raises(ValueError, match="reuse_len=0 is invalid"):
        TransformerXLConfig(reuse_len=0)
    with pytest.raises(ValueError, match=r"cutoffs=\[20, 40\].*expected adaptive=False"):
        TransformerXLForPermutationLM(TransformerXLConfig.from_preset("debug", cutoffs=[20, 40], div_val=1))


# ---------------------------------------------------------------- training on WikiText-like text


def wikitext_stream(lines, num_tokens: int, vocab: int):
    """Word ids of the first `num_tokens` words (one <eos> per line): the `vocab` most frequent words, then <unk>,
    <sep>, <cls>. Returns (stream, sep_id, cls_id, vocab_size)."""
    words = []
    for line in lines:
        words.extend(line.split() + ["<eos>"])
        if len(words) >= num_tokens:
            break
    itos = [w for w, _ in Counter(words).most_common(vocab)]
    stoi = {w: i for i, w in enumerate(itos)}
    unk, sep, cls = len(itos), len(itos) + 1, len(itos) + 2
    return [stoi.get(w, unk) for w in words[:num_tokens]], sep, cls, len(itos) + 3


def train_plm(steps: int, batch_size: int = 16, seed: int = 0, learning_rate: float = 2e-3):
    """Train a tiny permutation LM on generated WikiText-like text with the paper's sampling and memory; returns the
    losses and the vocabulary size."""
    from torch.utils.data import DataLoader

    from modeling_xl.data.plm_sampling import PLMCollator, PLMSamplingConfig, build_plm_dataset

    torch.manual_seed(seed)
    stream, sep, cls, vocab_size = wikitext_stream(wikitext_lines(6000), 60_000, 2000)
    sampling = PLMSamplingConfig(sep_id=sep, cls_id=cls, seq_len=32, reuse_len=16, num_predict=6, perm_size=16)
    data = build_plm_dataset(stream, batch_size, sampling, seed=seed)
    model = plm_model(vocab_size=vocab_size, d_model=64, n_head=4, d_head=16, d_inner=128, mem_len=16, reuse_len=16,
                      init_std=0.02).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    collator, losses, epoch = PLMCollator(sampling, seed=seed), [], 0
    while len(losses) < steps:
        collator.set_epoch(epoch)
        mems = None
        for batch in DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=collator):
            out = model(**{k: batch[k] for k in ("input_ids", "perm_mask", "target_mapping", "token_type_ids",
                                                 "attention_mask", "labels", "target_mask")}, mems=mems)
            optimizer.zero_grad()
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            mems, losses = out.mems, losses + [out.loss.item()]
            if len(losses) == steps:
                break
        epoch += 1
    return losses, vocab_size


def plm_loss_drop(seed: int = 0, steps: int = 150, window: int = 20) -> dict[str, float]:
    """`train_plm` on one thread; the first loss, the mean of the first and of the last `window` steps, ln V."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is ~10x faster than several fighting over a shared CPU
    try:
        losses, vocab_size = train_plm(steps=steps, seed=seed)
    finally:
        torch.set_num_threads(threads)
    return {"initial": losses[0], "first": sum(losses[:window]) / window, "last": sum(losses[-window:]) / window,
            "uniform": math.log(vocab_size)}


@pytest.mark.training_outcome
@pytest.mark.long_training
def test_tiny_model_trained_on_wikitext_like_text_lowers_its_permutation_lm_loss():
    """150 steps (300 until issue 50): over 10 draws (5 seeds x 2 CPU kernel sets) the mean loss of the last 20 steps
    was 0.97-1.12 below that of the first 20 and 1.93-2.09 below the first step's (1.76-2.07 and 2.79-2.99 at 300
    steps), against the 0.5 and 1.5 asserted; without learning both stay near 0 (docs/testing.md)."""
    start = time.perf_counter()
    result = plm_loss_drop()
    print(f"plm loss: step 1 {result['initial']:.3f}, mean of steps 1-20 {result['first']:.3f}, of steps 131-150 "
          f"{result['last']:.3f} ({time.perf_counter() - start:.1f} s)")
    assert abs(result["initial"] - result["uniform"]) < 0.3  # uniform over the vocabulary at initialisation
    assert result["last"] < result["first"] - 0.5 and result["last"] < result["initial"] - 1.5, result


REMOTE = """
import sys, torch
sys.modules["modeling_xl"] = None  # the code must come from the saved folder
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification
path, inputs = sys.argv[1], torch.load(sys.argv[2], weights_only=True)
lm = AutoModelForPreTraining.from_pretrained(path, trust_remote_code=True).eval()
assert type(lm).__module__.startswith("transformers_modules"), type(lm).__module__
base = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
assert type(base).__name__ == "TransformerXLPermutationModel", type(base)
classifier = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True, num_labels=2).eval()
assert type(classifier).__module__.startswith("transformers_modules"), type(classifier).__module__
torch.save({"logits": lm(**inputs).logits, "hidden": base(**inputs).last_hidden_state,
            "classifier_hidden": classifier.transformer(inputs["input_ids"]).last_hidden_state,
            "base_hidden": base(inputs["input_ids"]).last_hidden_state}, sys.argv[3])
"""


def test_remote_code_loading_in_fresh_process(tmp_path):
    import os
    import subprocess
    import sys

    model = plm_model(bi_data=True)
    model.save_pretrained(tmp_path / "ckpt")
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    inputs = dict(input_ids=x, perm_mask=perm_mask, target_mapping=target_mapping)
    torch.save(inputs, tmp_path / "inputs.pt")
    (tmp_path / "remote.py").write_text(REMOTE)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "remote.py"), str(tmp_path / "ckpt"),
                           str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.testing.assert_close(got["logits"], model(**inputs).logits)
    torch.testing.assert_close(got["hidden"], model.transformer(**inputs).last_hidden_state)
    torch.testing.assert_close(got["classifier_hidden"], got["base_hidden"])


def test_training_gradients_match_transformers_xlnet():
    """Training gradients against transformers' XLNet, same weights and batches (the second step with memory and
    segment ids): every weight, mapped to XLNet's layout by the conversion's key map, and the tied table (whose
    gradient our model builds once, in the embedding lookup's backward, from both of its uses). `inputs_embeds` (no
    deferral) must give the same table gradient."""
    from modeling_xl.xlnet_conversion import BACKBONE_KEY_MAP, LM_HEAD_KEY_MAP

    reference, ours = xlnet_pair()
    reference.train(), ours.train()
    batch, length, num_predict = 3, 8, 3
    ref_mems = our_mems = None
    for _ in range(2):
        reference.zero_grad(), ours.zero_grad()
        x = torch.randint(0, V, (batch, length))
        perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(length) for _ in range(batch)]),
                                                num_predict)
        token_type_ids = torch.randint(0, 2, (batch, length))
        labels = torch.randint(0, V, (batch, num_predict))
        ref = reference(x, perm_mask=perm_mask, target_mapping=target_mapping, token_type_ids=token_type_ids,
                        labels=labels, mems=ref_mems, use_mems=True)
        ref.loss.backward()
        last_mems = our_mems
        out = ours(x, perm_mask, target_mapping, token_type_ids, mems=last_mems, labels=labels)
        out.loss.backward()
        ref_mems, our_mems = ref.mems, out.mems
    assert last_mems[0].size(1) == 4  # the second step attended to a memory
    key_map = {name.replace("{}", str(i)): (tuple(key.replace("{}", str(i)) for key in keys), transform)
               for name, (keys, transform) in {**BACKBONE_KEY_MAP, **LM_HEAD_KEY_MAP}.items() for i in range(2)}
    theirs = dict(reference.named_parameters())
    assert ours.lm_head.weight is ours.transformer.word_emb.weight  # tied: named_parameters lists it once
    for name, param in ours.named_parameters():
        keys, transform = key_map[name]
        want = transform(*(theirs[key].grad for key in keys))
        assert want.abs().sum() > 0, name
        torch.testing.assert_close(param.grad, want, atol=1e-6, rtol=1e-4, msg=f"gradient of {name}")
    deferred = ours.transformer.word_emb.weight.grad.clone()
    ours.zero_grad()
    ours(None, perm_mask, target_mapping, token_type_ids, mems=last_mems, labels=labels,
         inputs_embeds=ours.transformer.word_emb(x)).loss.backward()
    torch.testing.assert_close(ours.transformer.word_emb.weight.grad, deferred)


def test_last_layer_content_stream_skipped_only_when_unused():
    """The last layer's content stream is left uncomputed when the query stream is the output; asking for hidden
    states or attentions computes it, and the logits are the same either way."""
    model = plm_model()
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    plain = model(x, perm_mask, target_mapping)
    full = model(x, perm_mask, target_mapping, output_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(plain.logits, full.logits)
    last_h, last_g = full.hidden_states[-1]
    assert last_h.shape == (2, 8, 16) and last_g.shape == (2, 3, 16)
    assert all(p is not None for p in full.attentions[-1])


def test_hooked_embedding_and_output_layer_run_as_modules():
    """The deferred table gradient computes the lookup and the output product itself; with a hook on either module
    (an adapter, NEFTune's embedding noise) the modules run as they are, in training and in evaluation."""
    model = plm_model(dropout=0.1).train()
    x = torch.randint(0, V, (2, 8))
    perm_mask, target_mapping = order_masks(torch.stack([torch.randperm(8) for _ in range(2)]), 3)
    labels = torch.randint(0, V, (2, 3))
    calls = []
    model.lm_head.register_forward_hook(lambda *_: calls.append("lm_head"))
    model.transformer.word_emb.register_forward_hook(lambda *_: calls.append("word_emb"))
    model(x, perm_mask, target_mapping, labels=labels).loss.backward()
    assert sorted(calls) == ["lm_head", "word_emb"] and model.transformer.word_emb.weight.grad.abs().sum() > 0
    calls.clear()
    with torch.no_grad():
        model.eval()(x, perm_mask, target_mapping)
    assert sorted(calls) == ["lm_head", "word_emb"]


BACKBONE_FROM_FOLDER = """
import sys, torch
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
print(type(model).__name__)
torch.save(model(torch.load(sys.argv[2], weights_only=True)).last_hidden_state, sys.argv[3])
"""


@pytest.mark.parametrize("head", ["permutation_lm", "classifier"])
def test_auto_model_loads_the_bidirectional_backbone(head, tmp_path):
    """AutoModel maps the one config class to the causal backbone's class, which hands an attn_type="bi" checkpoint
    (or config) to TransformerXLPermutationModel, installed or as remote code; building the causal backbone from a
    bidirectional config is an error."""
    import os
    import subprocess
    import sys

    from transformers import AutoModel

    from modeling_xl import TransformerXLForSequenceClassification, TransformerXLModel, TransformerXLPermutationModel

    model = plm_model() if head == "permutation_lm" else TransformerXLForSequenceClassification(
        plm_model().config).eval()
    model.save_pretrained(tmp_path / "ckpt")
    auto_map = json.loads((tmp_path / "ckpt" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModel"] == "modeling_permutation_lm.TransformerXLPermutationModel"
    assert "AutoModelForCausalLM" not in auto_map
    x = torch.randint(0, V, (2, 5))
    want = model.transformer(x).last_hidden_state
    loaded = AutoModel.from_pretrained(tmp_path / "ckpt").eval()
    assert type(loaded) is TransformerXLPermutationModel
    torch.testing.assert_close(loaded(x).last_hidden_state, want, rtol=0, atol=0)
    assert type(AutoModel.from_config(model.config)) is TransformerXLPermutationModel
    with pytest.raises(ValueError, match="attn_type='bi'"):
        TransformerXLModel(model.config)
    with pytest.raises(ValueError, match="attn_type='bi'"):  # AutoModel chooses the backbone (backbones.py)
        TransformerXLModel.from_pretrained(tmp_path / "ckpt")
    if head == "classifier":  # remote code in a fresh process
        torch.save(x, tmp_path / "x.pt")
        (tmp_path / "load.py").write_text(BACKBONE_FROM_FOLDER)
        env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path / "ckpt"), str(tmp_path / "x.pt"),
                               str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["TransformerXLPermutationModel"]
        torch.testing.assert_close(torch.load(tmp_path / "out.pt", weights_only=True), want, rtol=0, atol=0)
