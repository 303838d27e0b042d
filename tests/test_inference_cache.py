"""Reuse of memory keys/values and position projections without gradients (modeling_xl.inference_cache).

The cache must never change a result: every test compares against the same computation made to miss (the memory
handed back as a copy, so that no cached projection can belong to it)."""

import copy

import pytest
import torch

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
from modeling_xl.inference_cache import ProjectionCache


def make_model(**overrides):
    torch.manual_seed(0)
    config = dict(vocab_size=97, d_model=32, d_embed=32, n_layer=2, n_head=2, d_head=16, d_inner=64, cutoffs=[40],
                  div_val=2, mem_len=12, same_length=True)
    config.update(overrides)
    return TransformerXLForCausalLM(TransformerXLConfig(**config)).eval()


def assert_identical(outputs, expected):
    for a, b in zip(outputs, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def hits(model):
    layers = model.transformer.layers
    return (sum(layer.attn.memory_cache.hits for layer in layers),
            sum(layer.attn.position_cache.hits for layer in layers))


def stored_hits(model):
    """Lookups answered from projections an earlier call kept: the memory's keys and values, and the backbone's
    projection of the whole position table (`PositionTable.offer_projections`; a layer's position-cache hit on rows
    offered from a table projected in the same call is no reuse)."""
    return (hits(model)[0], sum(cache.hits for cache in model.transformer.position_table.projections))


def read(model, ids, seg_len=8, copy_mems=False, between=None):
    """Log-probs of every segment, memory carried (as is, or as a copy that cannot hit the cache)."""
    mems, outputs = None, []
    with torch.no_grad():
        for step, start in enumerate(range(0, ids.size(1), seg_len)):
            if between is not None and mems is not None:
                between(step, mems)
            if copy_mems and mems is not None:
                mems = tuple(m.clone() for m in mems)
            out = model(input_ids=ids[:, start:start + seg_len], mems=mems)
            mems = out.mems
            outputs.append(out.logits)
    return outputs


@pytest.mark.parametrize("pre_lnorm", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_reused_projections_equal_recomputed_ones(pre_lnorm, attn):
    model = make_model(pre_lnorm=pre_lnorm)
    model.set_attn_implementation(attn)
    ids = torch.randint(0, 97, (2, 40))
    recomputed = read(model, ids, copy_mems=True)
    before = hits(model)
    reused = read(model, ids)
    memory_hits, position_hits = (a - b for a, b in zip(hits(model), before))
    # 5 segments: segments 2-5 reuse the memory's projections in each of the 2 layers; klen is 8, 16, 20, 20, 20:
    # segments 1-2 take rows of the 20-row table projected in the first read (offer_position_projections), 4 and 5
    # repeat segment 3's
    assert (memory_hits, position_hits) == (8, 8)
    assert_identical(reused, recomputed)


def test_weights_changed_in_place_are_not_served_stale():
    model = make_model()
    ids = torch.randint(0, 97, (2, 32))

    def nudge(step, mems):  # e.g. an optimizer step between two evaluation segments
        with torch.no_grad():
            for layer in model.transformer.layers:
                layer.attn.qkv_net.weight.mul_(1.01)
                layer.attn.r_net.weight.mul_(0.99)

    torch.manual_seed(1)
    state = copy.deepcopy(model.state_dict())
    before = stored_hits(model)
    served = read(model, ids, between=nudge)
    assert stored_hits(model) == before  # every lookup of a kept projection missed
    model.load_state_dict(state)
    expected = read(model, ids, copy_mems=True, between=nudge)
    assert_identical(served, expected)


def test_memory_edited_in_place_is_recomputed():
    model = make_model()
    ids = torch.randint(0, 97, (2, 24))

    def edit(step, mems):
        mems[0][:, 0].zero_()

    before = hits(model)
    served = read(model, ids, between=edit)
    assert hits(model)[0] == before[0] + 2  # layer 1's memory is untouched and reused; layer 0's is not
    expected = read(model, ids, copy_mems=True, between=edit)
    assert_identical(served, expected)


def test_nothing_is_kept_with_gradients_or_without_memory():
    model = make_model()
    ids = torch.randint(0, 97, (2, 16))
    mems = model(input_ids=ids[:, :8]).mems  # gradients on
    model(input_ids=ids[:, 8:], mems=mems)
    assert hits(model) == (0, 0)
    for layer in model.transformer.layers:
        assert layer.attn.memory_cache._entry is None and layer.attn.memory_cache.pending is None
    no_memory = make_model(mem_len=0)
    read(no_memory, ids)
    assert all(layer.attn.memory_cache.pending is None for layer in no_memory.transformer.layers)


def test_autocast_state_is_part_of_the_key():
    model = make_model()
    ids = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        mems = model(input_ids=ids[:, :8]).mems  # float32 projections kept
        with torch.autocast("cpu", dtype=torch.bfloat16):
            served = model(input_ids=ids[:, 8:], mems=mems).logits
            expected = model(input_ids=ids[:, 8:], mems=tuple(m.clone() for m in mems)).logits
    assert hits(model)[0] == 0
    torch.testing.assert_close(served, expected, rtol=0, atol=0)


def test_copies_and_pickles_start_empty():
    model = make_model()
    read(model, torch.randint(0, 97, (2, 16)))
    assert model.transformer.layers[0].attn.memory_cache._entry is not None
    twin = copy.deepcopy(model)
    assert twin.transformer.layers[0].attn.memory_cache._entry is None
    cache = copy.copy(model.transformer.layers[0].attn.memory_cache)  # through __getstate__, as pickle goes
    assert isinstance(cache, ProjectionCache) and cache._entry is None and cache.hits == 0


def test_use_cache_false_keeps_nothing_and_gives_the_same_result():
    model = make_model()
    ids = torch.randint(0, 97, (2, 24))
    cached = read(model, ids)
    with torch.no_grad():
        mems, plain = None, []
        for start in range(0, 24, 8):
            out = model(input_ids=ids[:, start:start + 8], mems=mems, use_cache=False)
            mems = out.mems
            plain.append(out.logits)
            for layer in model.transformer.layers:
                assert layer.attn.memory_cache._entry is None and layer.attn.memory_cache.pending is None
    assert_identical(cached, plain)


def test_training_forward_drops_what_evaluation_kept():
    model = make_model()
    ids = torch.randint(0, 97, (2, 16))
    read(model, ids)
    assert model.transformer.layers[0].attn.memory_cache._entry is not None
    assert model.transformer.position_table.kept is not None
    model.train()
    model(input_ids=ids[:, :8], labels=ids[:, :8]).loss.backward()
    for layer in model.transformer.layers:
        assert layer.attn.memory_cache._entry is None and layer.attn.position_cache._entry is None
    assert model.transformer.position_table.kept is None


def test_inference_mode_runs_without_the_cache():
    """Tensors made under inference_mode have no version counter: the cache stays off there (it used to crash)."""
    model = make_model()
    ids = torch.randint(0, 97, (2, 24))
    expected = read(model, ids, copy_mems=True)
    before = hits(model)
    with torch.inference_mode():
        mems, outputs = None, []
        for start in range(0, 24, 8):
            out = model(input_ids=ids[:, start:start + 8], mems=mems)
            mems = out.mems
            outputs.append(out.logits)
    assert hits(model) == before
    assert_identical(outputs, expected)


@pytest.mark.parametrize("change", ["vector_to_parameters", "half_then_float", "data_assignment"])
def test_weights_replaced_through_data_are_not_served_stale(change):
    """`p.data = ...` and dtype round trips keep the parameter objects and their version counters: the cache key
    also holds storage pointers and dtypes, so these are misses."""
    model = make_model()
    ids = torch.randint(0, 97, (2, 16))

    def replace(step, mems):
        if change == "vector_to_parameters":
            params = list(model.parameters())
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params) * 1.1, params)
        elif change == "half_then_float":
            model.half().float()
        else:
            for layer in model.transformer.layers:
                layer.attn.qkv_net.weight.data = layer.attn.qkv_net.weight.data * 1.1
                layer.attn.r_net.weight.data = layer.attn.r_net.weight.data * 0.9

    torch.manual_seed(3)
    state = copy.deepcopy(model.state_dict())
    before = stored_hits(model)
    served = read(model, ids, between=replace)
    assert stored_hits(model) == before
    model.load_state_dict(state)
    model.float()
    assert_identical(served, read(model, ids, copy_mems=True, between=replace))


def test_use_cache_false_reuses_nothing():
    model = make_model()
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        mems = None
        for start in range(0, 40, 8):
            mems = model(input_ids=ids[:, start:start + 8], mems=mems, use_cache=False).mems
    assert hits(model) == (0, 0)
    assert model.transformer.position_table.kept is None


def test_append_room_writes_in_place_only_at_its_frontier():
    """`AppendRoom`: appending at the end written last writes into the same buffers; appending to an older room (its
    end behind the frontier) or past the capacity copies; no view handed out earlier ever changes."""
    from modeling_xl.inference_cache import AppendRoom

    a, b = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    room = AppendRoom.of((a, b), dim=2)
    assert torch.equal(room.views()[0], a) and torch.equal(room.views()[1], b)
    one = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    longer = room.append(one)
    assert longer.buffers[0] is room.buffers[0]  # in place
    assert torch.equal(longer.views()[0], torch.cat([a, one[0]], dim=2))
    kept = longer.tail(4)
    snapshot = [v.clone() for v in kept.views()]
    other = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    branch = room.append(other)  # `room` ends behind the frontier: a copy, `longer` keeps its entries
    assert branch.buffers[0] is not room.buffers[0]
    assert torch.equal(branch.views()[1], torch.cat([b, other[1]], dim=2))
    assert torch.equal(longer.views()[0], torch.cat([a, one[0]], dim=2))
    grown, buffers = kept, set()
    for step in range(9):  # past the capacity (6 entries, then 7): copied into new buffers, the old views intact
        new = torch.full((2, 3, 1, 5), float(step)), torch.full((2, 3, 1, 5), -float(step))
        grown = grown.append(new)
        buffers.add(id(grown.buffers[0]))
        assert torch.equal(grown.views()[0][:, :, -1:], new[0]) and grown.views()[0].size(2) == 5
        grown = grown.tail(4)
    assert all(torch.equal(v, s) for v, s in zip(kept.views(), snapshot))
    assert 2 <= len(buffers) <= 5  # appends mostly in place: a copy every 2-3 steps at most, not at every step
    half = room.append((one[0].double(), one[1].double()))  # another dtype: joined as torch.cat would
    assert half.buffers[0].dtype == torch.float64 and torch.equal(half.views()[0][:, :, :4], a.double())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_generation_with_appended_keys_values_equals_recomputing_them(attn):
    """One token at a time past the memory's length (the rooms fill, are copied and fill again), and a memory
    continued twice (the second continuation cannot append where the first one wrote): every output equals the one
    computed with the memory handed back as a copy (no cache), to the last bit of float32 rounding: the reused keys
    were projected one row at a time, the recomputed ones in one product over the memory's rows, and the product's
    rounding may depend on its row count (a bit or two of a few entries here)."""
    model = make_model(same_length=False, mem_len=5)
    model.set_attn_implementation(attn)
    ids = torch.randint(0, 97, (3, 30))
    for reused, recomputed in zip(read(model, ids, seg_len=1), read(model, ids, seg_len=1, copy_mems=True),
                                  strict=True):
        torch.testing.assert_close(reused, recomputed, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        start = model(input_ids=ids[:, :6]).mems
        first = model(input_ids=ids[:, 6:7], mems=start)
        second = model(input_ids=ids[:, 7:8], mems=start)  # the same memory again, another token
        again = model(input_ids=ids[:, 7:8], mems=tuple(m.clone() for m in start))
        after_first = model(input_ids=ids[:, 8:9], mems=first.mems)
        after_first_copy = model(input_ids=ids[:, 8:9], mems=tuple(m.clone() for m in first.mems))
    assert_identical([second.logits, after_first.logits], [again.logits, after_first_copy.logits])


def test_beam_search_reorders_the_kept_projections_with_the_memory():
    """Beam search reorders the memory's rows at every step; the keys and values kept for it follow them (a hit at
    every step instead of projecting the whole memory again), and the beams equal those of a run that keeps nothing
    (`use_cache=False`: every step reads the whole sequence). Generation's steps through the backbone's forward
    (`static_decoding = None`; the default decodes from ring buffers, tests/test_static_decoding.py)."""
    model = make_model(same_length=False, mem_len=6, cutoffs=[20, 50], div_val=1)
    model.static_decoding = None
    ids = torch.randint(1, 97, (2, 5))
    kwargs = dict(max_new_tokens=9, num_beams=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        before = hits(model)[0]
        kept = model.generate(ids, **kwargs)
        reused = hits(model)[0] - before
        recomputed = model.generate(ids, use_cache=False, **kwargs)
    assert reused >= model.config.n_layer * (kwargs["max_new_tokens"] - 2)
    assert torch.equal(kept, recomputed)
