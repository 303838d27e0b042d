"""Backbone and causal-LM head: recurrence, heads, loading, generation, input validation."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLModel


def model_for(**overrides):
    cfg = TransformerXLConfig.from_preset("debug", **overrides)
    return TransformerXLForCausalLM(cfg).eval()


def test_shapes_and_memory_growth():
    model = model_for(mem_len=6)
    x = torch.randint(0, 97, (3, 4))
    out = model(x, output_hidden_states=True, output_attentions=True)
    assert out.logits.shape == (3, 4, 97)
    assert len(out.mems) == 2 and out.mems[0].shape == (3, 4, 16), "first segment starts from an empty memory"
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert out.attentions[0].shape == (3, 2, 4, 4)
    out2 = model(x, mems=out.mems, output_attentions=True)
    assert out2.mems[0].shape == (3, 6, 16), "memory is capped at mem_len"
    assert out2.attentions[0].shape == (3, 2, 4, 8)
    assert all(not m.requires_grad for m in model.train()(x).mems), "memory is detached"


def test_memory_is_last_mem_len_layer_inputs():
    model = model_for(mem_len=5)
    x = torch.randint(0, 97, (2, 4))
    first = model(x, output_hidden_states=True)
    second = model(x, mems=first.mems, output_hidden_states=True)
    for layer in range(2):
        want = torch.cat([first.hidden_states[layer], second.hidden_states[layer]], 1)[:, -5:]
        torch.testing.assert_close(second.mems[layer], want)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("overrides", [{}, {"pre_lnorm": True, "untie_r": False}, {"clamp_len": 3, "div_val": 1}])
def test_segment_by_segment_equals_one_pass(attn, overrides):
    model = model_for(mem_len=64, **overrides)
    model.set_attn_implementation(attn)
    x = torch.randint(0, 97, (2, 13))
    full = model(x, labels=x)
    mems, parts = None, []
    for lo, hi in [(0, 5), (5, 6), (6, 13)]:
        out = model(x[:, lo:hi], mems=mems)
        parts.append(out.logits)
        mems = out.mems
    torch.testing.assert_close(torch.cat(parts, 1), model(x).logits, atol=1e-5, rtol=1e-5)
    # the same NLL through pre-shifted stream targets
    nxt = torch.cat([x[:, 1:], torch.full((2, 1), -100)], 1)
    torch.testing.assert_close(model(x, next_token_labels=nxt).loss, full.loss)


def train_copy_model(seed: int = 0, steps: int = 400, mem_len: int = 10) -> dict[str, float]:
    """Train a 2-layer causal LM on rows whose second segment repeats the first (length 10, vocabulary 32); return
    the held-out losses of the first segment, of the second one after the first's memory, and of the same second
    segment after the memory of another random segment. `mem_len=0` removes the memory (the mutation check)."""
    torch.manual_seed(seed)
    vocab, length = 32, 10
    config = TransformerXLConfig(vocab_size=vocab, d_model=64, d_embed=64, n_layer=2, n_head=4, d_head=16,
                                 d_inner=128, mem_len=mem_len, adaptive=False, cutoffs=[], dropout=0.0, dropatt=0.0)
    model = TransformerXLForCausalLM(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def losses(ids, memory_of=None):
        segment = ids if memory_of is None else memory_of
        first = model(input_ids=segment, labels=segment)
        return first.loss, model(input_ids=ids, labels=ids, mems=first.mems).loss  # the second segment: `ids`

    for _ in range(steps):
        first, second = losses(torch.randint(0, vocab, (32, length)))
        (first + second).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ids = torch.randint(0, vocab, (256, length), generator=generator)
        first, second = losses(ids)
        _, after_other = losses(ids, memory_of=torch.randint(0, vocab, (256, length), generator=generator))
    return {"first": float(first), "second": float(second), "after_other": float(after_other),
            "chance": float(torch.log(torch.tensor(float(vocab))))}


@pytest.mark.training_outcome
@pytest.mark.long_training
def test_learns_to_copy_what_only_the_memory_holds(one_thread):
    """Segment-level recurrence is usable, not only exact: each row's second segment repeats its first, which the
    second segment's forward sees only through the cached (detached, as in the paper) memory. After training, the
    repeat is predicted (loss near 0) while the first segment, random, stays at ln V; the same second segment after
    the memory of another random segment is no better than chance. This is the matching a pair task needs
    (docs/finetuning.md, "Pairs"); `benchmarks/bench_copying.py` measures how much of it a pretrained model shows."""
    # the repeat's loss over 10 draws (5 seeds x 2 CPU kernel sets): 0.04-0.12 (0.35-0.40 at 200 steps, 3 seeds);
    # without memory (mem_len 0) it stays at ln V (docs/testing.md)
    losses = train_copy_model()
    chance = losses["chance"]
    assert losses["first"] > chance - 0.2 and losses["after_other"] > chance - 0.2, losses
    assert losses["second"] < 0.5, losses


def test_sdpa_equals_eager_with_same_length_and_memory():
    model = model_for(mem_len=6, same_length=True, clamp_len=4)
    x = torch.randint(0, 97, (2, 5))
    mems = model(x).mems
    sdpa = model(x, mems=mems).logits
    model.set_attn_implementation("eager")
    torch.testing.assert_close(model(x, mems=mems).logits, sdpa, atol=1e-5, rtol=1e-5)


def test_gradient_reaches_every_parameter_and_checkpointing_matches():
    model = model_for(dropout=0.0).train()
    x = torch.randint(0, 97, (2, 6))
    model(x, labels=x).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "cluster" not in n)
    model.zero_grad()
    from modeling_xl.training.models import enable_checkpointing

    enable_checkpointing(model)
    model(x, labels=x).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_with_dropout_recomputes_the_same_masks(reentrant):
    """Reentrant checkpointing runs a layer's forward without gradients and recomputes it with them: both must draw
    the same attention-dropout masks (the no-grad path drew them differently), so gradients equal plain training's."""
    model = model_for(dropout=0.1, dropatt=0.2).train()
    x = torch.randint(0, 97, (2, 6))
    mems = model(x).mems

    def grads():
        torch.manual_seed(3)
        model.zero_grad()
        model(x, mems=mems, labels=x).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    for name, grad in grads().items():
        torch.testing.assert_close(grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_weights_tied_and_round_trip(tmp_path):
    model = model_for()
    emb, head = model.transformer.word_emb, model.lm_head
    assert head.out_layers[2].weight is emb.emb_layers[2].weight
    assert head.out_projs[1].weight is emb.emb_projs[1].weight
    assert head.out_projs[0].weight is not emb.emb_projs[0].weight  # tie_projs[0] is False as in the paper
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert set(auto_map) >= {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
    x = torch.randint(0, 97, (2, 5))
    for cls in (AutoModelForCausalLM, TransformerXLForCausalLM):
        loaded = cls.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(loaded(x).logits, model(x).logits)
        assert loaded.lm_head.out_layers[0].weight is loaded.transformer.word_emb.emb_layers[0].weight
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(base, TransformerXLModel)
    torch.testing.assert_close(base(x).last_hidden_state, model.transformer(x).last_hidden_state)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), TransformerXLConfig)


REMOTE = textwrap.dedent("""
    import sys, torch
    sys.modules["modeling_xl"] = None  # the package must not be importable: the code comes from the folder
    try:
        import modeling_xl
        raise SystemExit("modeling_xl importable")
    except ImportError:
        pass
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification
    path, x = sys.argv[1], torch.load(sys.argv[2], weights_only=True)
    lm = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    assert type(lm).__module__.startswith("transformers_modules"), type(lm).__module__
    base = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
    gen = lm.generate(x, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    # fine-tuning from a language model's folder: its backbone under a new head
    classifier = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True, num_labels=3).eval()
    assert type(classifier).__module__.startswith("transformers_modules"), type(classifier).__module__
    torch.save({"logits": lm(x).logits, "hidden": base(x).last_hidden_state, "gen": gen,
                "classifier_hidden": classifier.transformer(x).last_hidden_state}, sys.argv[3])
""")


def test_remote_code_loading_in_fresh_process(tmp_path):
    model = model_for()
    model.save_pretrained(tmp_path / "ckpt")
    x = torch.randint(0, 97, (2, 5))
    torch.save(x, tmp_path / "x.pt")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    script = tmp_path / "remote.py"
    script.write_text(REMOTE)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt"), str(tmp_path / "x.pt"),
                           str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.testing.assert_close(got["logits"], model(x).logits)
    torch.testing.assert_close(got["hidden"], model.transformer(x).last_hidden_state)
    torch.testing.assert_close(got["classifier_hidden"], model.transformer(x).last_hidden_state)
    want = model.generate(x, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(got["gen"], want)


def test_generate_greedy_equals_hand_written_loop():
    model = model_for(mem_len=4)
    x = torch.randint(1, 97, (2, 5))
    gen = model.generate(x, max_new_tokens=7, do_sample=False, pad_token_id=0, eos_token_id=None)
    out = model(x)
    tokens, mems = [x], out.mems
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(7):
        tokens.append(nxt)
        out = model(nxt, mems=mems)
        mems, nxt = out.mems, out.logits[:, -1].argmax(-1, keepdim=True)
    assert torch.equal(gen, torch.cat(tokens, 1))


def spiced(model, std=0.3):
    """Larger random weights (LayerNorm gains near 1), so that greedy choices differ from position to position."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.1 * noise if "layer_norm" in name and name.endswith("weight") else std * noise)
    return model


def greedy_loop(model, prompt, steps, mems=None, carry=True):
    """Greedy decoding written out: the prompt after `mems`, then one token at a time with the memory carried
    (`carry`), or the whole sequence re-read after the same `mems` each step."""
    tokens, feed, state = [prompt], prompt, mems
    for _ in range(steps):
        out = model(feed, mems=state)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        feed, state = (tokens[-1], out.mems) if carry else (torch.cat(tokens, 1), mems)
    return torch.cat(tokens, 1)


def test_generate_reads_the_whole_prompt_after_the_callers_memory_and_without_cache_rereads():
    """`generate(prompt, mems=...)` continues a stream: the first step reads every prompt token (it read only the
    last one); `use_cache=False` carries no memory and re-reads the sequence at every step."""
    model = spiced(model_for(mem_len=3))
    x = torch.randint(1, 97, (2, 9))
    mems = model(x[:, :3]).mems
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    gen = model.generate(x[:, 3:], mems=mems, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    hook.remove()
    assert calls == [(2, 6)] + [(2, 1)] * 3
    want = greedy_loop(model, x[:, 3:], 4, mems)
    assert torch.equal(gen, want)
    assert not torch.equal(want[:, 6:], greedy_loop(model, x[:, -1:], 4, mems)[:, 1:])  # the prompt matters
    no_cache = model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None,
                              use_cache=False)
    assert torch.equal(no_cache, greedy_loop(model, x, 4, carry=False))
    assert not torch.equal(no_cache, greedy_loop(model, x, 4))  # mem_len 3 < context: carrying memory differs


def test_generate_after_the_callers_memory_with_a_padded_mask_and_with_beams():
    """The prompt's mask covers the prompt, not the caller's memory before it (the second step failed on the mask's
    length); the caller's `mems` follow the rows `num_beams` / `num_return_sequences` make (they were not repeated)."""
    model = spiced(model_for(mem_len=16))
    x = torch.randint(1, 97, (2, 9))
    mems = model(x[:, :3]).mems
    prompt, mask = x[:, 3:], torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    gen = model.generate(prompt, attention_mask=mask, mems=mems, **kwargs)
    alone = model.generate(prompt[1:], mems=tuple(m[1:] for m in mems), **kwargs)
    assert torch.equal(gen[1:], alone)  # the unpadded row as if alone
    beams = model.generate(prompt, mems=mems, num_beams=3, num_return_sequences=2, **kwargs)
    for row in range(2):
        want = model.generate(prompt[row:row + 1], mems=tuple(m[row:row + 1] for m in mems), num_beams=3,
                              num_return_sequences=2, **kwargs)
        assert torch.equal(beams[2 * row:2 * row + 2], want)


@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(num_beams=3, do_sample=False),
                                    dict(do_sample=True, top_k=20)])
def test_generate_with_memory_equals_generate_without(kwargs):
    """With a memory covering the whole history, carrying memory is exact: same tokens as re-reading everything."""
    with_mem = model_for(mem_len=64)
    no_mem = model_for(mem_len=0)
    no_mem.load_state_dict(with_mem.state_dict())
    x = torch.randint(1, 97, (2, 5))
    torch.manual_seed(1)
    a = with_mem.generate(x, max_new_tokens=8, pad_token_id=0, eos_token_id=None, **kwargs)
    torch.manual_seed(1)
    b = no_mem.generate(x, max_new_tokens=8, pad_token_id=0, eos_token_id=None, **kwargs)
    assert torch.equal(a, b)


@pytest.mark.parametrize("mem_len", [3, 64])
def test_left_padded_batch_forward_and_generate_equal_each_row_alone(mem_len):
    """`attention_mask` reaches the causal LM: the real positions of a left-padded row score and generate exactly as
    the row alone, also once the padding is in memory (mem_len 3: it leaves memory again)."""
    model = model_for(mem_len=mem_len)
    x = torch.randint(1, 97, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    alone = model(x[:1, 2:]).logits
    torch.testing.assert_close(model(x, attention_mask=mask).logits[:1, 2:], alone, rtol=0, atol=1e-5)
    assert not torch.allclose(model(x).logits[:1, 2:], alone, rtol=0, atol=1e-5)  # the padding matters unmasked
    gen = model.generate(x, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                         eos_token_id=None)
    for row, start in ((0, 2), (1, 0)):
        want = model.generate(x[row : row + 1, start:], max_new_tokens=6, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
        assert torch.equal(gen[row : row + 1, start:], want)


def test_generate_returns_attentions_and_hidden_states():
    model = model_for()
    x = torch.randint(1, 97, (1, 4))
    out = model.generate(x, max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None,
                         output_attentions=True, output_hidden_states=True, return_dict_in_generate=True)
    n_layer = model.config.n_layer
    assert len(out.attentions) == len(out.hidden_states) == 2
    assert len(out.attentions[0]) == n_layer and out.attentions[0][0].shape[-2:] == (4, 4)
    assert len(out.hidden_states[1]) == n_layer + 1 and out.hidden_states[1][0].shape[:2] == (1, 1)


@pytest.mark.parametrize("overrides", [dict(div_val=1), dict(div_val=2), dict(cutoffs=[], adaptive=False)])
def test_resize_token_embeddings_keeps_every_kept_token(overrides, tmp_path):
    """Tokens are added to / cut from the end of the last cluster: the kept tokens' vectors stay, the softmax stays
    tied and normalises over the new vocabulary, training and save / load work, shrinking back restores the model."""
    model = model_for(**overrides)
    x = torch.randint(0, 97, (2, 5))
    before = model(x, labels=x).losses
    old_table = model.transformer.word_emb.emb_layers[-1].weight.detach().clone()
    assert model.resize_token_embeddings(120, pad_to_multiple_of=8) is model.get_input_embeddings()
    table = model.transformer.word_emb.emb_layers[-1].weight
    assert model.config.vocab_size == 120 and model.lm_head.out_layers[-1].weight is table
    assert torch.equal(table[: old_table.size(0)], old_table)
    assert torch.allclose(table[old_table.size(0):], old_table.mean(0).expand(table.size(0) - old_table.size(0), -1))
    log_probs = model(x).logits
    assert log_probs.shape == (2, 5, 120)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 5))
    y = torch.randint(100, 120, (2, 5))
    model.train()
    model(y, labels=y).loss.backward()
    assert table.grad[old_table.size(0):].abs().sum() > 0
    model.eval().save_pretrained(tmp_path / "ckpt")
    reloaded = TransformerXLForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    torch.testing.assert_close(reloaded(y).logits, model(y).logits)
    model.resize_token_embeddings(97)
    torch.testing.assert_close(model(x, labels=x).losses, before)
    too_small = 10 if overrides.get("cutoffs", True) else 0  # at or below the last cluster's first token (50 or 0)
    with pytest.raises(ValueError, match=f"new_num_tokens={too_small} is invalid"):
        model_for(**overrides).resize_token_embeddings(too_small)


def test_memory_of_another_dtype_continues_the_model():
    """Memory is detached state: float32 memory continues a bfloat16 model (and the reverse) as that model's own."""
    model = model_for()
    x = torch.randint(0, 97, (2, 5))
    mems = model(x).mems
    half = model_for().to(torch.bfloat16)
    half.load_state_dict(model.state_dict())
    own = tuple(m.to(torch.bfloat16) for m in mems)
    assert torch.equal(half(x, mems=mems).logits, half(x, mems=own).logits)
    assert torch.equal(model(x, mems=own).logits, model(x, mems=tuple(m.float() for m in own)).logits)


@pytest.mark.parametrize("make_kwargs,match", [
    (lambda x, m: dict(input_ids=x + 200), "input_ids contains 2"),
    (lambda x, m: dict(input_ids=x - 100), "input_ids contains -"),
    (lambda x, m: dict(input_ids=x[:0]), "non-empty"),
    (lambda x, m: dict(input_ids=x[:, :0]), "non-empty"),
    (lambda x, m: dict(input_ids=x[0]), r"expected \[batch, seq_len\]"),
    (lambda x, m: dict(input_ids=x.float()), "integer token ids"),
    (lambda x, m: dict(input_ids=x.to(torch.int16)), "dtype torch.int16; expected integer token ids"),
    (lambda x, m: dict(input_ids=x, attention_mask=torch.ones(3, 4)), r"attention_mask has shape \(3, 4\)"),
    (lambda x, m: dict(input_ids=x, mems=m[:1]), "mems has 1 tensors; expected one per layer"),
    (lambda x, m: dict(input_ids=x, mems=(m[0], m[1][:, :2])), r"mems\[1\] has shape"),
    (lambda x, m: dict(input_ids=x, mems=tuple(t[:1] for t in m)), "batch=2"),
    (lambda x, m: dict(input_ids=x, mems=tuple(t[..., :3] for t in m)), "d_model=16"),
    (lambda x, m: dict(input_ids=x, labels=x[:, :3]), "labels has shape"),
    (lambda x, m: dict(input_ids=x, next_token_labels=x + 100), "next_token_labels has ids outside"),
    (lambda x, m: dict(input_ids=x, labels=x, next_token_labels=x), "at most one of"),
])
def test_bad_input_raises_value_error_naming_the_argument(make_kwargs, match):
    model = model_for()
    x = torch.randint(0, 97, (2, 4))
    mems = model(x).mems
    with pytest.raises(ValueError, match=match):
        model(**make_kwargs(x, mems))


@pytest.mark.parametrize("bad,match", [
    (dict(cutoffs=[50, 20]), "cutoffs"), (dict(cutoffs=[20, 97]), "below vocab_size"), (dict(div_val=0), "div_val"),
    (dict(d_model=0), "d_model"), (dict(n_head=-1), "n_head"), (dict(mem_len=-2), "mem_len"),
    (dict(clamp_len=-5), "clamp_len"), (dict(dropout=1.5), "dropout"), (dict(div_val=64), "div_val"),
    (dict(tie_projs=[True]), "tie_projs"), (dict(attn_type="sideways"), "attn_type"),
    (dict(classifier_dropout=None), "classifier_dropout=None"), (dict(dropout="0.1"), "dropout='0.1'"),
    (dict(mem_len=True), "mem_len=True"), (dict(div_val=True), "div_val=True"), (dict(cutoffs=[True, 50]), "cutoffs"),
    (dict(layer_norm_epsilon="x"), "layer_norm_epsilon='x'"), (dict(init_std=0), "init_std=0"),
    (dict(n_token_type=-1), "n_token_type=-1"), (dict(d_model=15), "d_model=15 is invalid; expected an even"),
    (dict(cutoffs=5), "cutoffs=5 is invalid; expected a list"), (dict(same_length="yes"), "same_length='yes'"),
    (dict(pad_token_id=200), r"pad_token_id=200 is invalid; expected None or a token id in \[0, vocab_size=97\)"),
])
def test_invalid_config_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        TransformerXLConfig.from_preset("debug", **bad)


@pytest.mark.parametrize("bad,match", [
    (dict(mem_len=-3), "mem_len=-3"), (dict(clamp_len=-7), "clamp_len=-7"), (dict(cutoffs=[80, 10]), "cutoffs"),
    (dict(d_model=15), "d_model=15"),
])
def test_config_fields_set_after_construction_are_validated(tmp_path, bad, match):
    """`from_pretrained(path, **fields)` sets the fields after the config was built and checked; so does
    `config.field = value`: the config and the model check them again (a negative mem_len used to slice memory)."""
    model_for().save_pretrained(tmp_path)
    for load in (AutoConfig.from_pretrained, TransformerXLConfig.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=match):
            load(tmp_path, **bad)
    config = TransformerXLConfig.from_preset("debug")
    setattr(config, *next(iter(bad.items())))
    with pytest.raises(ValueError, match=match):
        TransformerXLForCausalLM(config)


def test_numpy_values_pass_and_resizing_keeps_the_special_ids_loadable(tmp_path):
    import numpy as np

    config = TransformerXLConfig.from_preset("debug", pad_token_id=np.int64(3), same_length=np.bool_(True))
    assert config.pad_token_id == 3 and config.same_length
    model = model_for(pad_token_id=90)
    with pytest.raises(ValueError, match=r"new_num_tokens=60 would drop config.pad_token_id=90; expected more than 90"):
        model.resize_token_embeddings(60)  # it resized, then the saved config no longer loaded
    assert model.config.vocab_size == 97
    model.resize_token_embeddings(91)
    model.save_pretrained(tmp_path)
    assert TransformerXLForCausalLM.from_pretrained(tmp_path).config.vocab_size == 91


def test_float64_model_keeps_float64_and_passes_gradcheck():
    """Log-probabilities and losses were cast to float32 (`.float()`), also for a float64 model."""
    torch.manual_seed(0)
    model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", dropout=0.0)).double().eval()
    x = torch.randint(0, 97, (1, 3))
    out = model(x, labels=x)
    assert out.losses.dtype == out.loss.dtype == model(x).logits.dtype == torch.float64
    embeds = torch.randn(1, 3, model.config.d_embed, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda e: model(inputs_embeds=e).logits, (embeds,), eps=1e-6, atol=1e-5)


def test_set_attn_implementation_reaches_the_layers():
    model = model_for()
    model.set_attn_implementation("eager")
    assert all(layer.attn.config._attn_implementation == "eager" for layer in model.transformer.layers)
    model.set_attn_implementation("sdpa")
    assert all(layer.attn.config._attn_implementation == "sdpa" for layer in model.transformer.layers)


def test_presets_build_and_unknown_preset_errors():
    big = TransformerXLConfig.from_preset("wt103-base")
    assert (big.n_layer, big.d_model, big.n_head, big.d_inner, big.cutoffs) == (16, 410, 10, 2100, [20000, 40000, 200000])
    large = TransformerXLConfig.from_preset("enwik8-large")
    assert (large.n_layer, large.d_model, large.d_head, large.cutoffs) == (24, 1024, 128, [])
    with pytest.raises(ValueError, match="preset='nope'"):
        TransformerXLConfig.from_preset("nope")


def test_new_memory_is_exact_size_and_never_aliases_a_hidden_state():
    """The memory never holds more storage than its own size (not a slice of a longer concatenation) and never shares
    storage with a hidden state or the caller's `inputs_embeds`: refilling that buffer in place for the next segment,
    or resetting a memory row in place before backward, must be safe."""
    for mem_len, seg in [(4, 4), (6, 4), (3, 4)]:
        model = model_for(mem_len=mem_len)
        x = torch.randint(0, 97, (2, seg))
        first = model(x, output_hidden_states=True)
        second = model(x, mems=first.mems, output_hidden_states=True)
        for m, h in zip(second.mems, second.hidden_states):
            assert m.shape == (2, mem_len, 16)
            assert m.untyped_storage().nbytes() == m.numel() * m.element_size()
            assert m.untyped_storage().data_ptr() != h.untyped_storage().data_ptr()
    model = model_for(mem_len=4, dropout=0.0)
    segments = [torch.randint(0, 97, (2, 4)) for _ in range(3)]
    buffer, mems, reused = torch.empty(2, 4, 16), None, []
    for ids in segments:
        buffer.copy_(model.transformer.word_emb(ids))
        out = model.transformer(inputs_embeds=buffer, mems=mems)
        mems = out.mems
        reused.append(out.last_hidden_state.clone())
    mems = None
    for ids, want in zip(segments, reused):
        out = model.transformer(inputs_embeds=model.transformer.word_emb(ids), mems=mems)
        mems = out.mems
        torch.testing.assert_close(out.last_hidden_state, want)
    model.train()
    out = model(segments[0], mems=mems, labels=segments[0])
    for m in out.mems:
        m[0].zero_()  # a finished document's memory row, reset before backward
    out.loss.backward()


def _graph_nodes(tensor) -> set[str]:
    seen, stack, names = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def test_training_step_gradients_equal_with_and_without_the_deferred_table_gradient():
    """The causal LM defers the tied table's gradient (div_val 1) to the embedding lookup; `inputs_embeds` takes the
    softmax's own path. Same weights, same memory: every parameter's gradient must agree."""
    model = model_for(div_val=1, mem_len=4, dropout=0.0).double().train()
    x = torch.randint(0, 97, (2, 5))
    mems = model(x).mems
    grads = []
    for use_embeds in (False, True):
        model.zero_grad()
        if use_embeds:
            out = model(inputs_embeds=model.transformer.word_emb(x), mems=mems, labels=x)
        else:
            out = model(x, mems=mems, labels=x)
        assert ("TiedEmbeddingLookupBackward" in _graph_nodes(out.loss)) == (not use_embeds)
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


@pytest.mark.parametrize("mem_len,seg,old", [(4, 4, 4), (4, 4, None), (6, 4, 6), (6, 4, 2), (6, 4, None),
                                             (3, 4, 3), (3, 4, None), (4, 8, 4)])
@pytest.mark.parametrize("view", [False, True])
def test_update_memory_equals_its_definition(mem_len, seg, old, view):
    """update_memory against `cat([mem, hidden])[:, -mem_len:]`, for hidden states that own their storage or are views
    of a longer tensor (the permutation LM's reuse part), memory shorter than, equal to or longer than the segment:
    same values, never longer than mem_len, never holding more storage than its own size."""
    from modeling_xl.memory import update_memory

    full = torch.randn(2, seg + 3, 5)
    h = full[:, :seg] if view else full[:, :seg].clone()
    m = None if old is None else torch.randn(2, old, 5)
    (new,) = update_memory(None if m is None else [m], [h], mem_len)
    want = (h if m is None else torch.cat([m, h], 1))[:, -mem_len:]
    torch.testing.assert_close(new, want)
    assert new.untyped_storage().nbytes() == new.numel() * new.element_size()


def _layer_call(head: str, dropout: float):
    """(layer 0 of a small model in training mode, the positional and keyword arguments of its call in a forward with
    memory), for the causal LM or the permutation LM."""
    from small_lms import lm_batch, small_lm

    torch.manual_seed(0)
    model, inputs = small_lm(head, dropout=dropout), lm_batch(head)
    inputs["mems"] = model(**inputs).mems
    layer = model.transformer.layers[0]
    captured = []
    handle = layer.register_forward_pre_hook(lambda module, args, kwargs: captured.append((args, kwargs)),
                                             with_kwargs=True)
    model(**inputs)
    handle.remove()
    args, kwargs = captured[0]
    args = [a.detach().requires_grad_() if torch.is_tensor(a) and a.is_floating_point() and a.dim() == 3 else a
            for a in args]
    return layer, args, kwargs


@pytest.mark.parametrize("head", ["causal", "plm"])
def test_layers_compile_without_graph_breaks(head):
    """torch.compile traces a whole layer in training, dropout included, as one graph (the fused autograd nodes and
    the `random_` dropout masks step aside for plain ops under compilation), and the compiled layer (AOT autograd,
    forward and backward) gives the eager layer's output and input gradient (dropout off for that check)."""
    import torch._dynamo

    layer, args, kwargs = _layer_call(head, dropout=0.1)
    explained = torch._dynamo.explain(layer)(*args, **kwargs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    layer, args, kwargs = _layer_call(head, dropout=0.0)
    eager = layer(*args, **kwargs)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(*args, **kwargs)
    out_eager = eager[0] if isinstance(eager, tuple) else eager
    out_compiled = compiled[0] if isinstance(compiled, tuple) else compiled
    torch.testing.assert_close(out_compiled, out_eager)
    h = args[0]
    # a random cotangent: the sum of squares of a post-LayerNorm output does not depend on the layer's input (with
    # LayerNorm's initial gamma = 1, beta = 0), so its gradient would be rounding noise
    cotangent = torch.randn(out_eager.shape, generator=torch.Generator().manual_seed(0))
    (grad_eager,) = torch.autograd.grad(out_eager, h, cotangent)
    (grad_compiled,) = torch.autograd.grad(out_compiled, h, cotangent)
    assert grad_eager.abs().max() > 0.1
    torch.testing.assert_close(grad_compiled, grad_eager)


def test_projections_stay_tied_by_tie_projs_without_tied_word_embeddings(tmp_path):
    """tie_word_embeddings=False unties the cluster weights only; the projections follow tie_projs alone (the authors'
    code), through save and load."""
    for div_val, d_embed in ((2, 16), (1, 32)):
        model = model_for(tie_word_embeddings=False, div_val=div_val, d_embed=d_embed)
        emb, head = model.transformer.word_emb, model.lm_head
        assert head.out_layers[0].weight is not emb.emb_layers[0].weight
        tied_to = 0 if div_val == 1 else 1
        assert head.out_projs[1].weight is emb.emb_projs[tied_to].weight
        assert head.out_projs[0].weight is not emb.emb_projs[0].weight  # tie_projs[0] is False
        model.save_pretrained(tmp_path / str(div_val))
        loaded = TransformerXLForCausalLM.from_pretrained(tmp_path / str(div_val)).eval()
        assert loaded.lm_head.out_projs[1].weight is loaded.transformer.word_emb.emb_projs[tied_to].weight
        assert loaded.lm_head.out_layers[0].weight is not loaded.transformer.word_emb.emb_layers[0].weight
        x = torch.randint(0, 97, (2, 5))
        torch.testing.assert_close(loaded(x).logits, model(x).logits)


def test_float64_model_builds_its_position_table_in_float64():
    from modeling_xl import TransformerXLForPermutationLM
    from modeling_xl.relative_attention import relative_positions, sinusoid_table

    model = model_for(clamp_len=-1).double()
    table = model.transformer.position_embeddings(7, torch.float64, "cpu")
    assert table.dtype == torch.float64
    assert torch.equal(table, sinusoid_table(relative_positions(7), model.config.d_model, torch.float64))
    assert (table - sinusoid_table(relative_positions(7), model.config.d_model).double()).abs().max() > 0
    plm = TransformerXLForPermutationLM(TransformerXLConfig.from_preset("debug", adaptive=False, cutoffs=[],
                                                                        tie_projs=[False], attn_type="bi")).double()
    tables = plm.transformer.position_embeddings(7, 3, torch.float64, "cpu")
    want = sinusoid_table(relative_positions(7, 3, bidirectional=True), plm.config.d_model, torch.float64)
    assert torch.equal(tables[0], want)


def tails_biased_lm(cluster_bias: float):
    """A causal LM of two tail clusters whose cluster logits are shifted by `cluster_bias`: below 0 the tails are
    mostly skipped by decoding that reads only the best tokens, above 0 mostly computed."""
    model = spiced(model_for(mem_len=6, cutoffs=[20, 50]))
    with torch.no_grad():
        model.lm_head.cluster_bias.fill_(cluster_bias)
    return model


@pytest.mark.parametrize("cluster_bias", [-4.0, 0.0, 2.0])
@pytest.mark.parametrize("sampling", [dict(top_k=10), dict(top_k=6, temperature=0.7, top_p=0.9)],
                         ids=["top-k", "temperature-top-k-top-p"])
def test_top_k_sampling_with_skipped_tails_draws_the_plain_paths_tokens(sampling, cluster_bias, monkeypatch):
    """Sampling whose processors start with a temperature and a top-k filter runs in the "top_k_decoding" context
    (tails that cannot hold one of a row's k best tokens are not computed) and draws, from the same seed, the tokens
    of the plain path (taken when scores are returned), with tails skipped and computed."""
    model = tails_biased_lm(cluster_bias)
    from modeling_xl import adaptive_softmax_fused as softmax_kernels

    calls = []
    fast = softmax_kernels.top_k_log_probs
    monkeypatch.setattr(softmax_kernels, "top_k_log_probs",
                        lambda softmax, hidden, k, *rest: calls.append((k, *rest)) or fast(softmax, hidden, k, *rest))
    x = torch.randint(1, 97, (3, 5))
    kwargs = dict(max_new_tokens=12, do_sample=True, pad_token_id=0, eos_token_id=None, **sampling)
    k = sampling["top_k"]
    for extra, read in (({}, (k, 1.0, False)), ({"repetition_penalty": 1.3}, (k, 1.3, False))):
        calls.clear()
        torch.manual_seed(0)
        skipping = model.generate(x, **kwargs, **extra)
        assert calls == [read] * 12
        torch.manual_seed(0)
        plain = model.generate(x, output_scores=True, return_dict_in_generate=True, **kwargs, **extra)
        assert len(calls) == 12 and torch.equal(skipping, plain.sequences)
    model.generate(x, **dict(kwargs, top_k=None, top_p=0.9))  # transformers' default top-k (50) > the shortlist
    model.generate(x, **dict(kwargs, repetition_penalty=0.8))  # a penalty below 1 raises scores: the plain path
    assert len(calls) == 12


def test_tokens_read_by_a_processor_list():
    """(k, penalty) for greedy decoding (k = 1), beam search (the beams kept) and for processors that start with
    order-preserving temperatures, repetition penalties of at least 1 (their product) and a top-k filter; None when a
    processor may raise or reorder the scores otherwise, or when nothing filters a sample."""
    from transformers.generation.logits_process import (
        NoBadWordsLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from modeling_xl.memory_generation import tokens_read

    assert tokens_read([], do_sample=False) == (1, 1.0) and tokens_read([], do_sample=True) is None
    assert tokens_read([], do_sample=False, kept=8) == (8, 1.0)  # beam search keeps 2 x beams
    assert tokens_read([TemperatureLogitsWarper(0.8), TopKLogitsWarper(40), TopPLogitsWarper(0.9)], True) == (40, 1.0)
    assert tokens_read([TopKLogitsWarper(3, min_tokens_to_keep=5)], True) == (5, 1.0)
    assert tokens_read([RepetitionPenaltyLogitsProcessor(1.2), TopKLogitsWarper(40)], True) == (40, 1.2)
    assert tokens_read([RepetitionPenaltyLogitsProcessor(1.5), RepetitionPenaltyLogitsProcessor(2.0)], False) == (
        1, 3.0)  # penalties multiply
    assert tokens_read([RepetitionPenaltyLogitsProcessor(0.8), TopKLogitsWarper(40)], True) is None  # raises scores
    assert tokens_read([NoBadWordsLogitsProcessor([[5]], eos_token_id=0)], False) is None  # may drop the best token
    assert tokens_read([TemperatureLogitsWarper(0.8), TopPLogitsWarper(0.9)], True) is None
    assert tokens_read([TemperatureLogitsWarper(0.8)], False) == (1, 1.0)


@pytest.mark.parametrize("cluster_bias", [-4.0, -1.0, 2.0])  # -1: tails near a row's k best
@pytest.mark.parametrize("extra,read", [
    (dict(), (6, 1.0, True)), (dict(repetition_penalty=1.3), (6, 1.3, True)),
    (dict(eos_token_id=[3, 4]), (9, 1.0, True)), (dict(do_sample=True, top_k=8), (8, 1.0, True))],
    ids=["beams", "penalty", "two-eos", "beam-sampling"])
def test_beam_search_with_skipped_tails_keeps_the_plain_paths_beams(extra, read, cluster_bias, monkeypatch):
    """Beam search runs in the "top_k_decoding" context with k = the continuations it keeps ((1 + end-of-sequence
    ids, at least 2) x beams; with sampling the top-k filter's k), the penalty's bound, and skipped tails'
    probability spread over their tokens; its sequences equal the plain path's (taken when scores are returned), over
    steps where the tails are skipped and steps where they are computed."""
    model = tails_biased_lm(cluster_bias)
    from modeling_xl import adaptive_softmax_fused as softmax_kernels

    calls, scores = [], []
    fast = softmax_kernels.top_k_log_probs
    monkeypatch.setattr(softmax_kernels, "top_k_log_probs", lambda softmax, hidden, *rest: calls.append(rest) or (
        scores.append(fast(softmax, hidden, *rest)) or scores[-1]))
    x = torch.randint(5, 97, (2, 5))
    kwargs = dict(dict(max_new_tokens=10, num_beams=3, do_sample=False, pad_token_id=0, eos_token_id=None), **extra)
    torch.manual_seed(0)
    skipping = model.generate(x, **kwargs)
    assert calls and set(calls) == {read}
    steps = len(calls)
    torch.manual_seed(0)
    plain = model.generate(x, output_logits=True, return_dict_in_generate=True, **kwargs)
    assert len(calls) == steps and torch.equal(skipping, plain.sequences)
    for ours, theirs in zip(scores, plain.logits):  # step by step: each row's k best after beam search's log-softmax
        ours, theirs = torch.log_softmax(ours, -1).topk(read[0]), torch.log_softmax(theirs, -1).topk(read[0])
        assert torch.equal(ours.indices.sort(-1).values, theirs.indices.sort(-1).values)
        torch.testing.assert_close(ours.values, theirs.values, rtol=1e-5, atol=1e-5)
    model.skip_unread_tails = False  # the switch: every log-probability, the same beams
    torch.manual_seed(0)
    assert torch.equal(model.generate(x, **kwargs), skipping) and len(calls) == steps


@pytest.mark.parametrize("cluster_bias", [-4.0, 0.0, 2.0])
def test_greedy_generate_with_argmax_only_log_probs_equals_the_plain_path(cluster_bias, monkeypatch):
    """Greedy `generate` runs in the "greedy_decoding" context (tail clusters that cannot hold the best token are not
    computed); the tokens equal the plain path's (taken when scores are returned) and the hand-written loop's, over
    steps where the tails are skipped and steps where they are computed."""
    model = tails_biased_lm(cluster_bias)
    from modeling_xl import adaptive_softmax_fused as softmax_kernels

    calls = []
    fast = softmax_kernels.top_k_log_probs
    monkeypatch.setattr(softmax_kernels, "top_k_log_probs",
                        lambda softmax, hidden, k, *rest: calls.append((hidden.size(0), k)) or fast(softmax, hidden, k,
                                                                                                   *rest))
    x = torch.randint(1, 97, (3, 5))
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    gen = model.generate(x, **kwargs)
    assert calls == [(3, 1)] * 12  # every step: 3 rows, the best token alone
    plain = model.generate(x, output_scores=True, return_dict_in_generate=True, **kwargs)
    assert len(calls) == 12  # scores returned: the plain path, every logit computed
    assert torch.equal(gen, plain.sequences)
    assert torch.equal(gen, greedy_loop(model, x, 12))
    assert all(torch.isfinite(s).all() for s in plain.scores)
    torch.manual_seed(0)
    sampled = model.generate(x, **dict(kwargs, do_sample=True, top_k=10))  # not greedy: the top-k path, k = 10
    assert calls[12:] == [(3, 10)] * 12 and sampled.shape == gen.shape
    penalized = model.generate(x, repetition_penalty=1.3, **kwargs)  # the penalty's bound: still the best alone
    assert calls[24:] == [(3, 1)] * 12
    plain = model.generate(x, repetition_penalty=1.3, output_scores=True, return_dict_in_generate=True, **kwargs)
    assert len(calls) == 36 and torch.equal(penalized, plain.sequences)
