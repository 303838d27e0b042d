"""Generation with the memory as ring buffers of fixed size (`static_decoding.DecodeState`): each step equals the
backbone's forward with the memory as mems, `generate` gives the tokens of the step-by-step forward in every mode,
and the step compiles to one graph that is never recompiled, whatever the step."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.debugging import aot_eager

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
from modeling_xl.static_decoding import DecodeState, ring_distances

VOCAB = 300


def small_lm(**overrides) -> TransformerXLForCausalLM:
    torch.manual_seed(0)
    config = dict(vocab_size=VOCAB, d_model=32, d_embed=32, n_layer=2, n_head=4, d_head=8, d_inner=64,
                  cutoffs=[60, 200], mem_len=6, dropout=0.0, dropatt=0.0)
    return TransformerXLForCausalLM(TransformerXLConfig(**{**config, **overrides})).eval()


def test_ring_distances_count_back_from_the_newest_slot():
    """M = 4: after writing slots 0..3 and then slot 0 again, the next slot is 1 (the oldest, 4 steps back)."""
    assert ring_distances(torch.tensor(1), 4).tolist() == [1, 4, 3, 2]
    assert ring_distances(torch.tensor(0), 4).tolist() == [4, 3, 2, 1]


@pytest.mark.parametrize("overrides", [{}, {"pre_lnorm": True, "untie_r": False}, {"clamp_len": 3},
                                       {"div_val": 2, "d_embed": 64}, {"ff_activation": "gelu"}])
def test_every_step_equals_the_forward_with_the_memory_as_mems(overrides):
    """12 one-token steps after a 4-token prompt (the ring of 6 slots wraps twice): the log-probabilities of every
    step, and the memory read back, equal the backbone's forward with mems to float rounding."""
    model = small_lm(**overrides)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        mems = model(torch.randint(0, VOCAB, (3, 4), generator=g)).mems
        state = DecodeState.from_mems(model.transformer, mems, keep_hiddens=True)
        for _ in range(12):
            token = torch.randint(0, VOCAB, (3, 1), generator=g)
            eager = model(token, mems=mems, use_cache=False)
            mems = eager.mems
            step = model(token, mems=state)
            assert step.mems is state
            torch.testing.assert_close(step.logits, eager.logits, rtol=1e-5, atol=1e-5)
            for ring, want in zip(state.to_mems(), mems):
                torch.testing.assert_close(ring, want)


def generations(model, ids, **kwargs):
    """(tokens without static decoding, tokens with it), from the same seed."""
    out = []
    for mode in (None, "eager"):
        model.static_decoding = mode
        torch.manual_seed(0)
        out.append(model.generate(ids, max_new_tokens=14, pad_token_id=0, **kwargs))
    model.static_decoding = "eager"
    return out


@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(do_sample=True, top_k=20, temperature=0.8),
                                    dict(do_sample=True, top_p=0.9), dict(do_sample=False, repetition_penalty=1.3),
                                    dict(num_beams=3, do_sample=False), dict(num_beams=2, num_return_sequences=2)],
                         ids=["greedy", "top-k", "top-p", "processor", "beams", "beams-returned"])
def test_generate_gives_the_step_by_step_tokens(kwargs):
    model = small_lm()
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    plain, static = generations(model, ids, **kwargs)
    assert torch.equal(plain, static)


def test_left_padding_and_a_callers_memory_stay_hidden_and_used():
    """A left-padded batch hides its padding in the ring too; a memory passed to `generate` is continued."""
    model = small_lm(mem_len=8)
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    plain, static = generations(model, ids, attention_mask=mask, do_sample=False)
    assert torch.equal(plain, static)
    with torch.no_grad():
        mems = model(torch.randint(1, VOCAB, (2, 3))).mems
    plain, static = generations(model, ids, mems=mems, do_sample=False)
    assert torch.equal(plain, static)


def test_a_decode_state_takes_one_token_per_row_and_nothing_to_train():
    model = small_lm()
    with torch.no_grad():
        state = DecodeState.from_mems(model.transformer, model(torch.randint(0, VOCAB, (2, 3))).mems)
        with pytest.raises(ValueError, match=r"input_ids has shape \(2, 2\); expected \[batch=2, 1\]"):
            model(torch.zeros(2, 2, dtype=torch.long), mems=state)
        with pytest.raises(ValueError, match="labels, next_token_labels and inputs_embeds are not taken"):
            model(torch.zeros(2, 1, dtype=torch.long), mems=state, labels=torch.zeros(2, 1, dtype=torch.long))


def counting_compiler():
    """(the list of compilations so far, a torch.compile backend that appends to it and traces with aot_eager)."""
    compiled_at = []

    def counting_backend(graph, example_inputs):
        compiled_at.append(len(compiled_at))
        return aot_eager(graph, example_inputs)

    return compiled_at, counting_backend


def test_the_step_compiles_once_and_is_never_recompiled():
    """fullgraph (no graph break) and one compilation for every step: before the ring is full, across its wrap, and
    after a beam reorder; the compiled steps give the eager steps' log-probabilities."""
    torch._dynamo.reset()
    model = small_lm()
    compiled_at, counting_backend = counting_compiler()

    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        mems = model(torch.randint(0, VOCAB, (3, 2), generator=g)).mems
        eager, compiled = DecodeState.from_mems(model.transformer, mems), DecodeState.from_mems(model.transformer, mems)
        compiled.compiled_step = torch.compile(compiled._step, backend=counting_backend, fullgraph=True)
        for step in range(10):
            token = torch.randint(0, VOCAB, (3, 1), generator=g)
            torch.testing.assert_close(model(token, mems=compiled).logits, model(token, mems=eager).logits)
            if step == 5:
                order = torch.tensor([2, 0, 0])
                eager.reorder_(order), compiled.reorder_(order)
    torch._dynamo.reset()
    assert compiled_at == [0]


def test_compiled_generation_captures_once_for_every_generate_call():
    """The model keeps its compiled decode state: later `generate` calls of the same rows load their memory into the
    same buffers (a CUDA graph reads fixed addresses) and compile nothing more. Each call gives eager's tokens,
    with another prompt, a padded one, and after the weights changed; other rows get a state of their own."""
    torch._dynamo.reset()
    model = small_lm()
    compiled_at, counting_backend = counting_compiler()

    model.static_decoding_options = {"backend": counting_backend}
    g = torch.Generator().manual_seed(5)
    first, second = (torch.randint(1, VOCAB, (2, length), generator=g) for length in (5, 3))
    mask = torch.ones_like(second)
    mask[1, 0] = 0
    addresses = []
    for ids, kwargs in ((first, {}), (second, {"attention_mask": mask}), (first, {"weights_changed": True})):
        if kwargs.pop("weights_changed", False):
            with torch.no_grad():
                model.transformer.layers[0].attn.r_net.weight.mul_(1.5)  # the projected distance table changes
        tokens = {}
        for mode in ("eager", "compiled"):
            model.static_decoding = mode
            tokens[mode] = model.generate(ids, max_new_tokens=9, do_sample=False, pad_token_id=0, **kwargs)
        assert torch.equal(tokens["compiled"], tokens["eager"])
        addresses.append(model._compiled_decoding[1].keys[0].data_ptr())
    assert compiled_at == [0] and len(set(addresses)) == 1
    model.static_decoding = "compiled"
    model.generate(first[:1], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert model._compiled_decoding[1].real.size(0) == 1
    model.config.mem_len = 9  # a longer memory: a state of its own, and the tokens of eager decoding
    longer = model.generate(first, max_new_tokens=9, do_sample=False, pad_token_id=0)
    assert model._compiled_decoding[1].slots == 9
    model.static_decoding = "eager"
    assert torch.equal(longer, model.generate(first, max_new_tokens=9, do_sample=False, pad_token_id=0))
    torch._dynamo.reset()


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [0, 0, 2, 3], [1, 0, 2, 3], [0, 0, 1, 3], [1, 0, 2, 2], [3, 3, 0, 1],
                                   [2, 3, 0, 1]],
                         ids=["unchanged", "one-row", "swap", "chain", "three-rows", "three-rows-again", "every-row"])
def test_a_beam_reorder_moves_every_buffer_row_to_its_source(order):
    """Rows follow `order` (row r takes row order[r], a source used twice too, a source overwritten by another
    move) in keys, values, hidden states and the written mask, whether a few rows move (in place) or most do (new
    buffers); the steps after it equal the forward with the reordered memory."""
    model = small_lm()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        mems = model(torch.randint(0, VOCAB, (4, 3), generator=g)).mems
        state = DecodeState.from_mems(model.transformer, mems, keep_hiddens=True)
        state.real[1, 0] = False  # a padded slot in one row: the mask moves with it
        before = [b.clone() for b in state.rows()]
        index = torch.tensor(order)
        state.reorder_(index)
        for moved, original in zip(state.rows(), before):
            assert torch.equal(moved, original.index_select(0, index))
        token = torch.randint(0, VOCAB, (4, 1), generator=g)
        reordered = tuple(m.index_select(0, index) for m in mems)
        real = torch.ones(4, 3, dtype=torch.bool)
        real[1, 0] = False
        want = model(token, mems=DecodeState.from_mems(model.transformer, reordered, real.index_select(0, index)))
        torch.testing.assert_close(model(token, mems=state).logits, want.logits)
