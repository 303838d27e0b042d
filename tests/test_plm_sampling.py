"""Tests for the permutation-LM data layout, sampling and no-leak checker (modeling_xl/data/plm_*.py)."""

import numpy as np
import pytest
import torch

from modeling_xl.data.plm_layout import chunk_sentence_ids, plm_layout, sentence_ids_from_eos, split_a_and_b
from modeling_xl.data.plm_leak_check import assert_no_leak, derive_target_order
from modeling_xl.data.plm_sampling import (
    PLMCollator,
    PLMSamplingConfig,
    build_plm_dataset,
    join_half_masks,
    permutation_mask,
    sample_block_permutation,
    sample_plm_example,
    sample_target_mask,
    sample_target_spans,
    span_length_probs,
    targets_to_mapping,
)

SEP, CLS = 4, 3
OFFSET = 10  # stream token = OFFSET + stream index, so every token tells where it came from
SMALL = dict(sep_id=SEP, cls_id=CLS, seq_len=64, reuse_len=32, num_predict=13, perm_size=16)


def index_stream(n):
    return OFFSET + np.arange(n, dtype=np.int64)


def small_batch(seed=0, batch_size=4, step=0, config=None, bi_data=False):
    config = config or PLMSamplingConfig(**SMALL)
    ds = build_plm_dataset(index_stream(4000), batch_size, config, seed=1, bi_data=bi_data)
    examples = [ds[step * batch_size + b] for b in range(batch_size)]
    return PLMCollator(config, seed=seed)(examples), examples


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(reuse_len=64), ["reuse_len", "64", "seq_len=64"]),
        (dict(reuse_len=60, perm_size=4), ["seq_len - reuse_len", ">= 5", "reuse_len=60"]),
        (dict(perm_size=12), ["perm_size", "12", "reuse_len=32"]),
        (dict(num_predict=70), ["num_predict=70", "35", "reuse_len=32"]),
        (dict(reuse_len=48, perm_size=8, num_predict=30), ["num_predict=30", "15 in the second half", "13 tokens"]),
        (dict(mask_alpha=0), ["mask_alpha", "mask_beta", "mask_alpha=0"]),
        (dict(max_gram=0), ["max_gram", "0"]),
    ],
)
def test_config_errors_name_argument_value_and_expectation(overrides, words):
    with pytest.raises(ValueError) as info:
        PLMSamplingConfig(**{**SMALL, **overrides})
    for word in words:
        assert word in str(info.value)


def test_layout_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"too short: 4 rows need at least seq_len=64 .* >= 256 tokens"):
        plm_layout(index_stream(255), 4, 64, 32, SEP, CLS, 0)
    with pytest.raises(ValueError, match=r"batch_size must be even with bi_data=True.*got 3"):
        plm_layout(index_stream(1000), 3, 64, 32, SEP, CLS, 0, bi_data=True)
    with pytest.raises(ValueError, match=r"reuse_len must satisfy 0 < reuse_len < seq_len=64, got 64"):
        plm_layout(index_stream(1000), 2, 64, 64, SEP, CLS, 0)
    with pytest.raises(ValueError, match=r"stream must be 1-D"):
        plm_layout(index_stream(1000).reshape(2, 500), 2, 64, 32, SEP, CLS, 0)
    with pytest.raises(ValueError, match=r"sentence_ids must have the stream's shape"):
        plm_layout(index_stream(1000), 2, 64, 32, SEP, CLS, 0, sentence_ids=np.zeros(999))
    with pytest.raises(ValueError, match=r"input_ids must have shape \(64,\), got \(63,\)"):
        sample_plm_example(index_stream(63), PLMSamplingConfig(**SMALL), rng)
    with pytest.raises(ValueError, match=r"num_predict=5 is larger than the 4 selectable"):
        sample_target_mask(6, 5, rng, selectable=np.array([1, 1, 0, 1, 0, 1]))


# ---------------------------------------------------------------- layout


def test_sentence_ids_examples():
    assert chunk_sentence_ids(7, 3).tolist() == [0, 0, 0, 1, 1, 1, 0]
    assert sentence_ids_from_eos(np.array([5, 9, 2, 7, 2, 8]), eos_id=2).tolist() == [0, 0, 0, 1, 1, 0]


def test_split_a_and_b_properties():
    row = index_stream(400)
    sentences = chunk_sentence_ids(400, 7)
    is_next_count = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        begin = int(rng.integers(0, 300))
        a, b, is_next = split_a_and_b(row, sentences, begin, 40, rng)
        assert len(a) + len(b) == 40 and len(a) >= 1 and len(b) >= 1
        assert a[0] == row[begin] and np.all(np.diff(a) == 1)  # A continues the stream from `begin`
        assert np.all(np.diff(b) == 1)  # B is a contiguous window
        if is_next:  # B starts at the sentence boundary where A was cut (A may then lose tokens on its right)
            assert (b[0] - OFFSET) % 7 == 0 and a[-1] < b[0] < row[begin] + 40
            assert b[0] == a[-1] + 1 or len(a) >= len(b) - 1  # A was trimmed only if it was the longer one
        else:
            assert (b[0] - OFFSET) % 7 == 0  # random B starts at a sentence start
        is_next_count += is_next
    assert 110 < is_next_count < 190  # ~50% real continuation


def test_layout_rows_continue_and_specials_placed():
    seq_len, reuse_len, batch_size = 64, 32, 3
    stream = index_stream(3000)
    out = plm_layout(stream, batch_size, seq_len, reuse_len, SEP, CLS, 0, sentence_len=9)
    row_len = len(stream) // batch_size
    num_steps = (row_len - seq_len) // reuse_len + 1
    assert out["input_ids"].shape == (num_steps * batch_size, seq_len)
    for n, (ids, segments) in enumerate(zip(out["input_ids"], out["token_type_ids"])):
        step, row = divmod(n, batch_size)
        assert out["step"][n] == step and out["row"][n] == row
        start = row * row_len + step * reuse_len  # row b owns stream[b * row_len, (b + 1) * row_len)
        assert ids[:reuse_len].tolist() == stream[start : start + reuse_len].tolist()
        assert ids[reuse_len] == stream[start + reuse_len]  # A continues the reuse part
        first_sep = int(np.flatnonzero(ids == SEP)[0])
        assert ids[-3:].tolist() == [ids[-3], SEP, CLS] and (ids == SEP).sum() == 2 and (ids == CLS).sum() == 1
        expected = [0] * (first_sep + 1) + [1] * (seq_len - first_sep - 2) + [2]
        assert segments.tolist() == expected
        b_part = ids[first_sep + 1 : -2]
        if out["is_next"][n]:  # B continues the text right after A's (untrimmed) end
            assert ids[first_sep - 1] < b_part[0] < stream[start] + seq_len
        if step > 0:  # memory from the reuse part of step t is followed by the reuse part of step t + 1
            previous = out["input_ids"][n - batch_size]
            assert ids[0] == previous[reuse_len - 1] + 1


def test_layout_bi_data_reverses_second_half_of_rows():
    out = plm_layout(index_stream(2000), 4, 64, 32, SEP, CLS, 0, bi_data=True)
    assert out["reverse"][:4].tolist() == [0, 0, 1, 1]
    forward, backward = out["input_ids"][0], out["input_ids"][2]
    assert np.all(np.diff(forward[:32]) == 1) and np.all(np.diff(backward[:32]) == -1)
    assert backward[0] == OFFSET + 999  # row 0 read from its end: rows are 1000 tokens


# ---------------------------------------------------------------- span targets


def test_span_lengths_follow_inverse_n():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([np.diff(sample_target_spans(20_000, 20_000, rng), axis=1)[:, 0] for _ in range(8)])
    counts = np.bincount(lengths, minlength=6)[1:]
    expected = span_length_probs(5) * len(lengths)
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert len(lengths) > 8_000
    assert chi_square < 18.5, (counts, expected)  # 4 dof: p ~ 0.001
    assert span_length_probs(2).tolist() == pytest.approx([2 / 3, 1 / 3])


def test_spans_are_separated_by_their_context_and_avoid_unselectable():
    rng = np.random.default_rng(1)
    selectable = rng.random(3000) > 0.05
    for _ in range(20):
        spans = sample_target_spans(3000, 3000, rng, selectable=selectable)
        assert np.all(spans[:, 1] > spans[:, 0]) and np.all(spans[:, 1] - spans[:, 0] <= 5)
        assert np.all(spans[1:, 0] > spans[:-1, 1])  # at least one context token between spans
        assert spans[-1, 1] < 3000
        assert all(selectable[b:e].all() for b, e in spans)
    # context ~ 6n per span of n tokens: spans cover about 1/7 of the segment
    covered = (spans[:, 1] - spans[:, 0]).sum() / 3000
    assert 0.10 < covered < 0.16


@pytest.mark.parametrize("reverse", [False, True])
def test_target_mask_exact_count_never_unselectable(reverse):
    rng = np.random.default_rng(2)
    for _ in range(200):
        length = int(rng.integers(20, 80))
        selectable = rng.random(length) > 0.2
        goal = int(rng.integers(1, selectable.sum() + 1))
        mask = sample_target_mask(length, goal, rng, selectable=selectable, reverse=reverse)
        assert mask.sum() == goal and not mask[~selectable].any()


# ---------------------------------------------------------------- permutation and masks


def test_block_permutation_shares_one_shuffle_across_blocks():
    for seed in range(20):
        rank = sample_block_permutation(12, 4, np.random.default_rng(seed))
        assert sorted(rank.tolist()) == list(range(12))
        blocks = rank.reshape(3, 4)
        assert np.all(blocks // 4 == np.arange(3)[:, None])  # blocks keep their order
        assert np.all(blocks - blocks[:1] == 4 * np.arange(3)[:, None])  # same offsets in every block
    with pytest.raises(ValueError, match=r"perm_size must be >= 1 and divide length=10, got 4"):
        sample_block_permutation(10, 4, np.random.default_rng(0))


def naive_permutation_mask(rank, is_target, is_functional):
    length = len(rank)
    mask = np.zeros((length, length), dtype=bool)
    for i in range(length):
        for j in range(length):
            if not is_target[j] and not is_functional[j]:
                continue  # context: visible to all
            i_is_context = not is_target[i] and not is_functional[i]
            earlier = rank[j] < rank[i] or (i == j and is_functional[i])
            mask[i, j] = i_is_context or not earlier
    return mask


def test_permutation_mask_matches_docstring_and_naive_loop():
    example = permutation_mask(np.arange(4), np.array([1, 0, 0, 1]), np.array([0, 0, 1, 0]))
    assert example.astype(int).tolist() == [[1, 0, 1, 1], [1, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1]]
    rng = np.random.default_rng(3)
    for _ in range(50):
        rank = rng.permutation(16)
        kind = rng.integers(0, 3, size=16)  # 0 context, 1 target, 2 functional
        got = permutation_mask(rank, kind == 1, kind == 2)
        assert np.array_equal(got, naive_permutation_mask(rank, kind == 1, kind == 2))


def test_join_half_masks_and_targets_to_mapping_examples():
    assert join_half_masks(np.ones((1, 1), bool), np.zeros((1, 1), bool)).astype(int).tolist() == [[1, 1], [0, 0]]
    mapping, target_mask = targets_to_mapping(np.array([0, 1, 0, 1], bool), 3)
    assert mapping.tolist() == [[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert target_mask.tolist() == [1, 1, 0] and mapping.dtype == np.float32
    with pytest.raises(ValueError, match=r"num_predict=1 is smaller than the 2 targets"):
        targets_to_mapping(np.array([1, 1], bool), 1)


# ---------------------------------------------------------------- full samples: statistics over many draws


@pytest.mark.parametrize("reverse", [False, True])
def test_sample_statistics_over_many_draws(reverse):
    config = PLMSamplingConfig(**SMALL)
    layout = plm_layout(index_stream(4000), 2, 64, 32, SEP, CLS, 0)
    rng = np.random.default_rng(4)
    reuse, half0, half1 = config.reuse_len, *config.num_predict_per_half
    for n in range(300):
        ids = layout["input_ids"][n % len(layout["input_ids"])]
        sample = sample_plm_example(ids, config, rng, reverse=reverse)
        target, mask = sample["is_target"], sample["perm_mask"].astype(bool)
        context = ~target & (ids != SEP) & (ids != CLS)
        assert target[:reuse].sum() == half0 and target[reuse:].sum() == half1  # exact counts per half
        assert not target[(ids == SEP) | (ids == CLS)].any()  # <sep>/<cls> never predicted
        assert mask[:reuse, reuse:].all()  # the reuse half never sees the second half
        assert not mask[reuse:, :reuse].any()  # the second half sees the whole reuse half
        for lo, hi in ((0, reuse), (reuse, 64)):  # context sees no target of its half, all context of its half
            block_mask, block_target, block_context = mask[lo:hi, lo:hi], target[lo:hi], context[lo:hi]
            assert block_mask[np.ix_(block_context, block_target)].all()
            assert not block_mask[:, block_context].any()
        assert np.all(np.diag(mask)[target])  # targets never see themselves
        assert sample["labels"].tolist() == ids[target].tolist()  # labels are the real tokens, in position order
        assert sample["target_mask"].sum() == config.num_predict


def test_batch_shapes_dtypes_and_no_leak():
    batch, examples = small_batch()
    expected = {
        "input_ids": ((4, 64), torch.long),
        "token_type_ids": ((4, 64), torch.long),
        "attention_mask": ((4, 64), torch.float32),
        "perm_mask": ((4, 64, 64), torch.float32),
        "target_mapping": ((4, 13, 64), torch.float32),
        "target_mask": ((4, 13), torch.float32),
        "labels": ((4, 13), torch.long),
    }
    assert {key: (tuple(value.shape), value.dtype) for key, value in batch.items()} == expected
    assert torch.equal(batch["input_ids"], torch.as_tensor(np.stack([e["input_ids"] for e in examples])))
    picked = torch.einsum("bkl,bl->bk", batch["target_mapping"], batch["input_ids"].float()).long()
    assert torch.equal(picked, batch["labels"])
    ranks = assert_no_leak(batch["perm_mask"], batch["target_mapping"], batch["target_mask"])
    assert torch.equal(ranks.sort(-1).values, torch.arange(13).expand(4, -1))
    # every reuse-half target comes before every second-half target in the order
    positions = batch["target_mapping"].argmax(-1)
    reuse_ranks, rest_ranks = ranks[positions < 32].view(4, -1), ranks[positions >= 32].view(4, -1)
    assert torch.all(reuse_ranks.max(-1).values < rest_ranks.min(-1).values)


def test_xlnet_large_sizes():
    config = PLMSamplingConfig(sep_id=SEP, cls_id=CLS)  # seq 512, reuse 256, K 85, perm 256
    assert config.num_predict_per_half == (43, 42)
    stream = index_stream(4000)
    ds = build_plm_dataset(stream, 2, config, seed=0, sentence_ids=sentence_ids_from_eos(stream % 23, eos_id=0))
    batch = PLMCollator(config, seed=0)([ds[0], ds[1]])
    positions = batch["target_mapping"].argmax(-1)
    assert torch.equal((positions < 256).sum(-1), torch.tensor([43, 43]))
    assert_no_leak(batch["perm_mask"], batch["target_mapping"], batch["target_mask"])


def test_bi_data_batch_has_no_leak_and_exact_counts():
    batch, examples = small_batch(batch_size=4, bi_data=True)
    assert [int(e["reverse"]) for e in examples] == [0, 0, 1, 1]
    assert_no_leak(batch["perm_mask"], batch["target_mapping"], batch["target_mask"])


# ---------------------------------------------------------------- determinism and pipeline


def test_same_seed_same_batch_and_batch_independent_of_composition():
    first, _ = small_batch(seed=7)
    again, _ = small_batch(seed=7)
    other, _ = small_batch(seed=8)
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not torch.equal(first["perm_mask"], other["perm_mask"])
    config = PLMSamplingConfig(**SMALL)
    ds = build_plm_dataset(index_stream(4000), 4, config, seed=1)
    alone = PLMCollator(config, seed=7)([ds[2]])
    assert torch.equal(alone["perm_mask"][0], first["perm_mask"][2])
    collator = PLMCollator(config, seed=7)
    collator.set_epoch(1)
    assert not torch.equal(collator([ds[2]])["perm_mask"][0], first["perm_mask"][2])  # fresh draw per epoch


def test_dataloader_rows_continue_across_steps():
    config = PLMSamplingConfig(**SMALL)
    ds = build_plm_dataset(index_stream(4000), 4, config, seed=1)
    again = build_plm_dataset(index_stream(4000), 4, config, seed=1)
    assert np.array_equal(ds[:]["input_ids"], again[:]["input_ids"])  # A/B layout is seeded too
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False, collate_fn=PLMCollator(config, seed=0))
    previous = None
    for batch in loader:
        if previous is not None:  # row b of step t + 1 continues the reuse part of row b of step t
            assert torch.equal(batch["input_ids"][:, 0], previous["input_ids"][:, 31] + 1)
        previous = batch


# ---------------------------------------------------------------- no-leak checker


def test_leak_checker_catches_leaks():
    batch, _ = small_batch()
    perm_mask, mapping, target_mask = batch["perm_mask"], batch["target_mapping"], batch["target_mask"]
    ranks = derive_target_order(perm_mask, mapping, target_mask)
    positions = mapping.argmax(-1)
    first, last = positions[0, ranks[0] == 0].item(), positions[0, ranks[0] == 12].item()

    sees_itself = perm_mask.clone()
    sees_itself[0, last, last] = 0
    with pytest.raises(AssertionError, match="may see itself"):
        assert_no_leak(sees_itself, mapping, target_mask)

    sees_later = perm_mask.clone()
    sees_later[0, first, last] = 0
    with pytest.raises(AssertionError, match="sample 0"):
        assert_no_leak(sees_later, mapping, target_mask)

    # indirect: a context token of the second half sees the last target; every later position sees that context
    through_context = perm_mask.clone()
    context = next(j for j in range(32, 61) if j not in positions[0].tolist())
    through_context[0, context, last] = 0
    with pytest.raises(AssertionError, match="through the content stream"):
        assert_no_leak(through_context, mapping, target_mask)

    with pytest.raises(ValueError, match=r"perm_mask must have shape \[B, L, L\], got \(4, 64, 63\)"):
        assert_no_leak(perm_mask[:, :, :63], mapping, target_mask)
    with pytest.raises(ValueError, match=r"target_mapping must have shape \[B=4, K, L=64\]"):
        assert_no_leak(perm_mask, mapping[:, :, :60], target_mask)


def test_padded_target_rows_are_ignored_by_the_checker():
    batch, _ = small_batch()
    mapping = torch.cat([batch["target_mapping"], torch.zeros(4, 2, 64)], dim=1)
    target_mask = torch.cat([batch["target_mask"], torch.zeros(4, 2)], dim=1)
    ranks = assert_no_leak(batch["perm_mask"], mapping, target_mask)
    assert torch.all(ranks[:, -2:] == -1)


def test_masks_follow_transformers_xlnet_convention():
    """Our batch in transformers' XLNetLMHeadModel: a target's logits ignore its own token and later targets."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(vocab_size=5000, d_model=32, n_layer=2, n_head=2, d_inner=64)).eval()
    batch, _ = small_batch(batch_size=2)
    batch.pop("target_mask")
    labels = batch.pop("labels")
    ranks = derive_target_order(batch["perm_mask"], batch["target_mapping"])
    positions = batch["target_mapping"].argmax(-1)
    with torch.no_grad():
        base = model(**batch).logits  # [B, K, V]
        for k in range(13):
            changed = dict(batch, input_ids=batch["input_ids"].clone())
            changed["input_ids"][0, positions[0, k]] = (labels[0, k] + 1) % 5000
            diff = (model(**changed).logits[0] - base[0]).abs().amax(-1)  # [K]
            not_after = ranks[0] <= ranks[0, k]
            assert torch.all(diff[not_after] == 0)  # k's token reaches no target ranked <= k (itself included)
            assert torch.all(diff[~not_after] > 0)  # and reaches every target ranked after it
