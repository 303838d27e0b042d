"""Ordered streams: row continuity (1 and 2 processes, across save/restore), eval coverage, streaming, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modeling_xl.data.streams import EvalStreams, OrderedStreams, StreamingOrderedStreams


def naive_rows(tokens, batch_size):
    """The reference layout written as a loop: row b = tokens[b*n : (b+1)*n + 1] (inputs plus one lookahead)."""
    n = (len(tokens) - 1) // batch_size
    return [tokens[b * n:(b + 1) * n + 1] for b in range(batch_size)]


def collect(streams):
    return [(b["input_ids"].clone(), b["next_token_labels"].clone()) for b in streams]


def test_docstring_example_and_naive_layout():
    batches = collect(OrderedStreams(torch.arange(11), batch_size=2, tgt_len=2))
    assert batches[0][0].tolist() == [[0, 1], [5, 6]] and batches[0][1].tolist() == [[1, 2], [6, 7]]
    tokens = np.random.default_rng(0).integers(0, 1000, size=1003)
    streams = OrderedStreams(tokens, batch_size=4, tgt_len=7)
    rows = naive_rows(tokens, 4)
    for t, batch in enumerate(streams):
        for b in range(4):
            assert batch["input_ids"][b].tolist() == list(rows[b][t * 7:(t + 1) * 7])
            assert batch["next_token_labels"][b].tolist() == list(rows[b][t * 7 + 1:(t + 1) * 7 + 1])
    assert t + 1 == len(streams) == (1002 // 4) // 7


def test_rows_continue_across_batches():
    tokens = torch.arange(10_000)  # token value = corpus position, so continuity is arithmetic
    batches = collect(OrderedStreams(tokens, batch_size=6, tgt_len=16))
    for (x0, y0), (x1, _) in zip(batches, batches[1:]):
        assert torch.equal(x1[:, 0], y0[:, -1])  # last target of batch t = first input of batch t+1, row by row
        assert torch.equal(x1[:, 0], x0[:, -1] + 1)
        assert torch.equal(y0, x0 + 1)


def test_two_processes_split_rows_and_cover_one_process():
    tokens = np.random.default_rng(1).integers(0, 50, size=5_000)
    single = collect(OrderedStreams(tokens, batch_size=4, tgt_len=10))
    ranks = [collect(OrderedStreams(tokens, batch_size=4, tgt_len=10, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(single)
    for t, (x, y) in enumerate(single):
        assert ranks[0][t][0].shape == (2, 10)
        assert torch.equal(torch.cat([ranks[0][t][0], ranks[1][t][0]]), x)  # rank 0 rows 0-1, rank 1 rows 2-3
        assert torch.equal(torch.cat([ranks[0][t][1], ranks[1][t][1]]), y)


def test_save_restore_resumes_exactly_mid_epoch_and_across_epochs():
    tokens = torch.arange(2_000)
    for world_size in (1, 2):
        reference = OrderedStreams(tokens, batch_size=4, tgt_len=9, rank=world_size - 1, world_size=world_size)
        expected = collect(reference) + collect(reference)  # two epochs
        assert reference.epoch == 1
        run = OrderedStreams(tokens, batch_size=4, tgt_len=9, rank=world_size - 1, world_size=world_size)
        seen = []
        for batch in run:
            seen.append((batch["input_ids"].clone(), batch["next_token_labels"].clone()))
            if len(seen) == 5:
                state = run.state_dict()
                break
        resumed = OrderedStreams(tokens, batch_size=4, tgt_len=9, rank=world_size - 1, world_size=world_size)
        resumed.load_state_dict(state)
        assert resumed.position == 5
        seen += collect(resumed) + collect(resumed)
        assert resumed.epoch == 1 and len(seen) == len(expected)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(seen, expected))


def test_eval_covers_every_target_once_with_right_borders():
    tokens = np.arange(1, 1_000)  # 999 tokens -> 998 (input, target) pairs, labels are the positions + 1
    for batch_size, tgt_len, world_size in ((1, 7, 1), (3, 16, 1), (4, 10, 2), (7, 1000, 1)):
        seen = []
        for rank in range(world_size):
            streams = EvalStreams(tokens, batch_size=batch_size, tgt_len=tgt_len, rank=rank, world_size=world_size)
            for batch in streams:
                x, y = batch["input_ids"], batch["next_token_labels"]
                assert x.shape == (batch_size // world_size, tgt_len)
                real = y != -100
                assert torch.equal(y[real], x[real] + 1)  # every target is the token right after its input
                seen += y[real].tolist()
        assert sorted(seen) == list(range(2, 1_000))  # every target exactly once
    docstring = collect(EvalStreams(np.arange(7), batch_size=2, tgt_len=2))
    assert docstring[1][0].tolist() == [[2, 0], [5, 0]] and docstring[1][1].tolist() == [[3, -100], [6, -100]]


def test_eval_rows_continue_across_segments():
    batches = collect(EvalStreams(torch.arange(500), batch_size=3, tgt_len=8))
    for (_, y0), (x1, _) in zip(batches, batches[1:]):
        real = y0[:, -1] != -100
        assert torch.equal(x1[real, 0], y0[real, -1])


def test_streaming_streams_equal_in_memory_and_resume():
    tokens = np.random.default_rng(2).integers(0, 100, size=3_001)

    def open_chunks():  # uneven chunks, as rows of a tokenized IterableDataset would be
        sizes = np.random.default_rng(3).integers(1, 40, size=500)
        edges = np.concatenate([[0], np.cumsum(sizes)])
        return (tokens[a:b] for a, b in zip(edges[:-1], edges[1:]) if a < tokens.size)

    memory = collect(OrderedStreams(tokens, batch_size=4, tgt_len=11, rank=1, world_size=2))
    streaming = StreamingOrderedStreams(open_chunks, batch_size=4, tgt_len=11, rank=1, world_size=2)
    assert streaming.num_tokens == tokens.size
    got = collect(streaming)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, memory))
    assert len(got) == len(memory)
    resumed = OrderedStreams.from_iterable(open_chunks, 4, 11, num_tokens=tokens.size, rank=1, world_size=2)
    resumed.load_state_dict({**streaming.state_dict(), "position": 10})
    rest = collect(resumed)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(rest, memory[10:])) and len(rest) == len(memory) - 10


def test_streaming_with_a_wrong_num_tokens_is_a_value_error():
    chunks = [np.arange(0, 50), np.arange(50, 100)]  # a 100-token corpus

    def read(num_tokens, tgt_len=10, **kwargs):
        return collect(StreamingOrderedStreams(lambda: iter(chunks), 2, tgt_len, num_tokens=num_tokens, **kwargs))

    assert len(read(100)) == 4 and len(read(None)) == 4
    with pytest.raises(ValueError, match=r"num_tokens=150 but open_chunks\(\) holds only 100 tokens"):
        read(150)  # a row runs out of chunks (was "RuntimeError: generator raised StopIteration")
    with pytest.raises(ValueError, match=r"num_tokens=101 but open_chunks\(\) holds only 100 tokens"):
        read(101, tgt_len=7)  # only the dropped tail is missing: found at the end of the epoch
    with pytest.raises(ValueError, match=r"num_tokens=60 but open_chunks\(\) holds more than 60"):
        read(60)  # was: 2 rows of 29 tokens, the last 40 tokens silently dropped
    with pytest.raises(ValueError, match=r"num_tokens=60 but open_chunks\(\) holds more than 60"):
        read(60, rank=1, world_size=2)  # the process that owns the last row checks
    # the last row's final window already read the last chunk past num_tokens: nothing is left for check_end to read
    tokens = np.arange(100)
    for open_chunks in (lambda: (tokens[i:i + 10] for i in range(0, 100, 10)), lambda: iter([tokens])):
        with pytest.raises(ValueError, match=r"num_tokens=\d+ but open_chunks\(\) holds more than"):
            collect(OrderedStreams.from_iterable(open_chunks, 2, 4, num_tokens=95))
    with pytest.raises(ValueError, match=r"open_chunks\(\) gave a chunk of shape \(5,\) and dtype float64"):
        collect(StreamingOrderedStreams(lambda: iter([np.arange(5.0)]), 1, 2, num_tokens=5))
    with pytest.raises(ValueError, match=r"open_chunks\(\) gave a chunk of shape \(2, 3\)"):
        collect(StreamingOrderedStreams(lambda: iter([np.zeros((2, 3), dtype=np.int64)]), 1, 2, num_tokens=6))


def test_memmap_tokens(tmp_path):
    tokens = np.arange(1_000, dtype=np.int32)
    tokens.tofile(tmp_path / "ids.bin")
    mapped = np.memmap(tmp_path / "ids.bin", dtype=np.int32, mode="r")
    a, b = collect(OrderedStreams(mapped, 2, 5)), collect(OrderedStreams(tokens, 2, 5))
    assert all(torch.equal(x[0], y[0]) and x[0].dtype == torch.long for x, y in zip(a, b))


def test_bad_input():
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by world_size=4"):
        OrderedStreams(np.arange(100), batch_size=6, tgt_len=2, world_size=4)
    with pytest.raises(ValueError, match="batch_size=3 is not divisible by world_size=2"):
        EvalStreams(np.arange(100), batch_size=3, tgt_len=2, world_size=2)
    with pytest.raises(ValueError, match="shorter than one segment of tgt_len=50"):
        OrderedStreams(np.arange(100), batch_size=4, tgt_len=50)
    with pytest.raises(ValueError, match="0 tokens"):
        OrderedStreams(np.zeros(0, dtype=np.int64), batch_size=1, tgt_len=1)
    with pytest.raises(ValueError, match="expected at least 2"):
        EvalStreams([5], batch_size=1, tgt_len=1)
    with pytest.raises(ValueError, match="expected a 1-D stream"):
        OrderedStreams(np.zeros((4, 4), dtype=np.int64), batch_size=1, tgt_len=1)
    streams = OrderedStreams(np.arange(100), batch_size=2, tgt_len=5)
    with pytest.raises(ValueError, match="state has tgt_len=6"):
        streams.load_state_dict({**streams.state_dict(), "tgt_len": 6})
    with pytest.raises(ValueError, match="state lacks epoch, batch_size, tgt_len, num_tokens"):
        streams.load_state_dict({"position": 1})
    for name, value in (("batch_size", "4"), ("batch_size", True), ("tgt_len", 2.0), ("tgt_len", 0), ("rank", -1),
                        ("world_size", 0)):
        with pytest.raises(ValueError, match=rf"{name}={value!r} is invalid; expected (a positive integer|an "
                                             r"integer >= 0)"):
            OrderedStreams(np.arange(100), **{"batch_size": 2, "tgt_len": 5, name: value})
    with pytest.raises(ValueError, match="pad_token_id=None is invalid; expected an integer >= 0"):
        EvalStreams(np.arange(100), batch_size=2, tgt_len=5, pad_token_id=None)


def test_at_epoch_start_marks_the_first_batch_of_every_epoch():
    streams = OrderedStreams(np.arange(11), batch_size=2, tgt_len=2)
    for _ in range(3):
        assert [streams.at_epoch_start for _ in streams] == [True, False]
    streams.load_state_dict({**streams.state_dict(), "position": 1})  # resumed after the first batch
    assert [streams.at_epoch_start for _ in streams] == [False]
