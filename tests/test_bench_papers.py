"""benchmarks/bench_papers.py: the pieces its equal-budget claims rest on, at toy sizes (the tables themselves take
hours: docs/papers.md). GPT-2 reads the tokens ours reads; each GPT-2 window gives a target the span of positions
ours' memory gives it; BERT's blocks are the same stream, framed."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import papers_lm  # noqa: E402
import papers_plm  # noqa: E402


@pytest.mark.parametrize("length", [64, 128, 256, 1024])
def test_gpt2_windows_read_the_tokens_ours_streams_read(length):
    from modeling_xl.data.streams import OrderedStreams

    train = np.arange(16 * 64 * 64 + 1)  # a token's id is its position
    steps = 64
    ours = OrderedStreams(train, 16, 64)
    read_by_ours = np.concatenate([ours.batch(i)["input_ids"].reshape(-1).numpy() for i in range(steps)])
    windows = list(papers_lm.gpt2_windows(train, length, steps))
    assert all(inputs.numel() == 16 * 64 for inputs, _ in windows)  # the same tokens per step
    assert all(torch.equal(targets, inputs + 1) for inputs, targets in windows)  # next-token targets
    read_by_gpt2 = np.concatenate([inputs.reshape(-1).numpy() for inputs, _ in windows])
    # after each group of steps both have read the same tokens: GPT-2 never runs ahead by more than one window
    group = max(length // 64, 1)
    for step in (group, steps // 2, steps):
        assert np.array_equal(np.sort(read_by_gpt2[: step * 1024]), np.sort(read_by_ours[: step * 1024])), step


@pytest.mark.parametrize("length", [64, 128, 1024])
def test_gpt2_windows_start_over_after_an_epoch_as_ours_streams_do(length):
    """A corpus shorter than the run (tiny-shakespeare): both read every whole piece of a row, then start over at the
    rows' starts, so after each epoch both have read the same tokens again."""
    from modeling_xl.data.streams import OrderedStreams

    segments = 40  # a row holds 40 segments of 64: an epoch of ours is 40 steps
    train = np.arange(16 * 64 * segments + 1)
    ours = OrderedStreams(train, 16, 64)
    assert len(ours) == segments
    windows = list(papers_lm.gpt2_windows(train, length, 3 * segments))
    group = length // 64
    epoch = segments // group * group  # GPT-2's: every whole window of a row
    assert all(torch.equal(windows[step][0], windows[step % epoch][0]) for step in range(3 * segments))
    read_by_gpt2 = np.concatenate([inputs.reshape(-1).numpy() for inputs, _ in windows[:epoch]])
    read_by_ours = np.concatenate([ours.batch(i)["input_ids"].reshape(-1).numpy() for i in range(epoch)])
    assert np.array_equal(np.sort(read_by_gpt2), np.sort(read_by_ours))


def test_gpt2_windows_refuse_a_stream_shorter_than_one_window():
    with pytest.raises(ValueError, match="length=1024"):
        next(papers_lm.gpt2_windows(np.arange(16 * 1000), 1024, 1))


def test_gpt2_windows_refuse_a_length_that_does_not_split_the_streams():
    with pytest.raises(ValueError, match="length=96"):
        next(papers_lm.gpt2_windows(np.arange(10_000), 96, 1))


def test_each_window_scores_its_targets_from_the_span_ours_memory_covers():
    """Target at position p of segment s (positions [s, s + segment)) is scored from tokens max(0, s - context) .. p:
    the keys ours' memory of `context` and its segment give that query."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=11, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    valid = np.random.default_rng(0).integers(0, 11, size=31)
    segment, context = 4, 8
    expected = 0.0
    with torch.no_grad():
        for p in range(len(valid) - 1):
            first = p - p % segment
            window = torch.from_numpy(valid[max(0, first - context) : p + 1])[None]
            log_probs = model(input_ids=window).logits[0, -1].double().log_softmax(-1)
            expected -= log_probs[valid[p + 1]].item()
    nll, count = papers_lm.score_windows(model, valid, context, segment=segment, batch=3)
    assert count == len(valid) - 1
    assert nll == pytest.approx(expected, rel=1e-6)


def test_bert_blocks_frame_consecutive_pieces_of_each_stream():
    train = np.arange(16 * 620 + 5)
    blocks = list(papers_plm.bert_blocks(train, 12, cls=-1, sep=-2))
    assert all(b.shape == (16, 64) for b in blocks)
    assert all((b[:, 0] == -1).all() and (b[:, -1] == -2).all() for b in blocks)
    row_len = len(train) // 16
    assert blocks[0][3, 1:-1].tolist() == list(range(3 * row_len, 3 * row_len + 62))
    assert blocks[1][3, 1] == 3 * row_len + 62  # the next piece of the same row
    assert torch.equal(blocks[10], blocks[0])  # 620 // 62 = 10 pieces a row, then the rows start over


def test_a_fine_tuning_run_writes_the_file_its_unit_waits_for_whatever_the_model_name(tmp_path, monkeypatch):
    """`plm-vs-bert` skips a unit whose result file exists and runs it again otherwise: the file a run writes must be
    the unit's, also for a model name with a dot in it (`bert_lr0.001`), which `Path.with_suffix` would cut."""
    import bench_papers

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tasks.json").write_text('{"sst2": {"files": []}}')
    monkeypatch.setattr(papers_plm, "finetune", lambda *args, **kwargs: {"eval_accuracy": 0.5})
    units = bench_papers.finetuning_units(tmp_path, {"sst2": ("classify", 8, 1, 16)}, (42,), None, ("bert_lr0.001",))
    path, work, *_ = units[-1]
    work()
    assert path == bench_papers.run_result(tmp_path, "sst2", "bert_lr0.001", 42) and path.exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [path.name]


def test_a_model_named_with_a_fine_tuning_rate_is_fine_tuned_at_it_from_its_own_folder(tmp_path, monkeypatch):
    import bench_papers

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tasks.json").write_text('{"sst2": {"files": []}}')
    calls = []
    monkeypatch.setattr(papers_plm, "finetune", lambda task, folder, *args, learning_rate=None: calls.append(
        (folder.name, learning_rate)) or {"eval_accuracy": 0.5})
    units = bench_papers.finetuning_units(tmp_path, {"sst2": ("classify", 8, 1, 16)}, (42,), None,
                                          ("bert_lr0.001", "bert_lr0.001@ft0.0003"))
    for path, work, *needs in units[-2:]:
        assert needs[0] == papers_plm.pretrained_marker(tmp_path, "bert_lr0.001")
        work()
        assert path.exists()
    assert calls == [("bert_lr0.001", None), ("bert_lr0.001", 3e-4)]
    assert units[-1][0].name == "sst2_bert_lr0.001@ft0.0003_s42.json"


def test_the_tuned_bert_is_the_grid_rate_with_the_lowest_validation_loss(tmp_path):
    """Only BERT_GRID's rates compete (not the recipe's `bert`, even with a lower loss), named as their folders."""
    import json

    losses = {"bert": 1.0, "bert_lr0.0005": 6.1, "bert_lr0.001": 5.4, "bert_lr0.002": 5.9}
    assert set(losses) == set(papers_plm.BERT_RATES)
    for name, loss in losses.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "valid.json").write_text(json.dumps({"mlm_loss": loss}))
    assert papers_plm.best_bert(tmp_path) == "bert_lr0.001"


def test_bert_validation_loss_is_the_mean_over_masked_positions_on_fixed_masks(tmp_path, monkeypatch):
    """The validation loss reads every piece of the validation stream once, on masks that do not depend on the model
    (so each BERT of the grid is scored on the same masks), and averages over the masked positions."""
    import json

    from tokenizers import Tokenizer, models
    from transformers import BertConfig, BertForMaskedLM

    from tokenization._wrapping import wrap_tokenizer

    vocab = {w: i for i, w in enumerate(["<unk>", "<cls>", "<sep>", "<pad>", "<mask>", *map(str, range(20))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok = wrap_tokenizer(backend, unk_token="<unk>", cls_token="<cls>", sep_token="<sep>", pad_token="<pad>",
                         mask_token="<mask>")
    valid = np.random.default_rng(0).integers(5, len(vocab), size=16 * 62 * 3 + 7)
    monkeypatch.setattr(papers_plm, "bert_tokenizer", lambda folder: tok)
    monkeypatch.setattr(papers_lm, "token_streams", lambda corpus, folder: (None, valid))
    blocks_read = []
    real_blocks = papers_plm.bert_blocks
    monkeypatch.setattr(papers_plm, "bert_blocks", lambda *args, **kwargs: (
        blocks_read.append(block) or block for block in real_blocks(*args, **kwargs)))
    scored = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        folder = tmp_path / f"bert{seed}"
        BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32)).save_pretrained(folder)
        scored.append(papers_plm.bert_validation_loss(tmp_path, folder))
        assert json.loads((folder / "valid.json").read_text()) == scored[-1]
    # every piece once: the 3 pieces of each of the 16 rows, in 3 blocks per model
    assert len(blocks_read) == 2 * 3
    assert sorted(torch.cat(blocks_read[:3])[:, 1:-1].reshape(-1).tolist()) == sorted(valid[: 16 * 62 * 3].tolist())
    # about 15% of the 62 tokens of each block masked, the same count for both models (one seed)
    assert scored[0]["masked_positions"] == scored[1]["masked_positions"]
    assert 0.10 * 3 * 16 * 62 < scored[0]["masked_positions"] < 0.20 * 3 * 16 * 62
    assert scored[0]["mlm_loss"] != scored[1]["mlm_loss"]
    assert abs(scored[0]["mlm_loss"] - np.log(len(vocab))) < 1.0  # an untrained model: near the uniform loss


def test_the_scratch_model_is_the_permutation_lm_with_fresh_weights(tmp_path):
    """`plm_scratch` loads as the pretrained folder does (same config and tokenizer, remote code), with none of its
    weights, so that the table shows what pretraining adds."""
    import json

    from safetensors.torch import load_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from modeling_xl import TransformerXLConfig, TransformerXLForPermutationLM
    from tokenization._wrapping import wrap_tokenizer

    config = TransformerXLConfig(vocab_size=40, d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32, adaptive=False,
                                 attn_type="bi", ff_activation="gelu")
    torch.manual_seed(7)
    TransformerXLForPermutationLM(config).save_pretrained(tmp_path / "plm")
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "<pad>": 1, "a": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrap_tokenizer(backend, unk_token="<unk>", pad_token="<pad>").save_pretrained(tmp_path / "plm")
    papers_plm.scratch_copy(tmp_path)
    assert json.loads(papers_plm.pretrained_marker(tmp_path, "plm_scratch").read_text())["seed"] == 42
    pretrained, scratch = (load_file(tmp_path / m / "model.safetensors") for m in ("plm", "plm_scratch"))
    assert pretrained.keys() == scratch.keys()
    assert not any(torch.equal(pretrained[k], scratch[k]) for k in pretrained if pretrained[k].std() > 0)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "plm_scratch", num_labels=2,
                                                               trust_remote_code=True)
    assert type(model).__name__ == "TransformerXLForSequenceClassification"
    assert AutoTokenizer.from_pretrained(tmp_path / "plm_scratch")("a a")["input_ids"][:2] == [2, 2]


def test_a_summary_variant_is_its_source_reading_the_mean_and_runs_only_where_a_head_reads_a_summary(
        tmp_path, monkeypatch):
    """`plm_mean`: the pretrained folder with `summary_type` "mean" (same weights); its classifier pools the mean of
    the real tokens; fine-tuned on SST-2, ud-genre and ARC only, and the table shows "-" for the other tasks."""
    import json

    import bench_papers
    from transformers import AutoModelForSequenceClassification

    from modeling_xl import TransformerXLConfig, TransformerXLForPermutationLM

    config = TransformerXLConfig(vocab_size=40, d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=32, adaptive=False,
                                 attn_type="bi", ff_activation="gelu")
    TransformerXLForPermutationLM(config).save_pretrained(tmp_path / "plm")
    papers_plm.summary_copy(tmp_path, "plm_mean")
    assert json.loads(papers_plm.pretrained_marker(tmp_path, "plm_mean").read_text())["summary_type"] == "mean"
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "plm_mean", num_labels=2,
                                                               trust_remote_code=True)
    assert model.config.summary_type == "mean"
    assert (tmp_path / "plm_mean" / "model.safetensors").read_bytes() == (tmp_path / "plm" /
                                                                         "model.safetensors").read_bytes()

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tasks.json").write_text('{"sst2": {"files": []}, "upos": {"files": []}}')
    budget = {"sst2": ("classify", 8, 1, 16), "upos": ("token-classification/run_ner.py", 8, 1, 16)}
    units = bench_papers.finetuning_units(tmp_path, budget, (42,), None, ("plm", "plm_mean"))
    assert [path.name for path, *_ in units[3:]] == ["sst2_plm_s42.json", "sst2_plm_mean_s42.json",
                                                     "upos_plm_s42.json"]
    results = {("sst2", "plm", 42): {"eval_accuracy": 0.5}, ("sst2", "plm_mean", 42): {"eval_accuracy": 0.75},
               ("upos", "plm", 42): {"eval_accuracy": 0.25}}
    tasks = {t: {"train_rows": 8, "dev_rows": 8, "baseline": {"name": "b", "accuracy": 0.1}} for t in budget}
    monkeypatch.setattr(bench_papers, "METRICS", {t: ("eval_accuracy", "accuracy") for t in budget})
    table = bench_papers.plm_table(results, tasks, (42,), ("plm", "plm_mean")).splitlines()
    sst2, upos = (next(line for line in table if line.startswith(f"| {t} ")) for t in budget)
    assert "0.750" in sst2 and sst2.rstrip(" |").endswith("plm_mean")
    assert [cell.strip() for cell in upos.split("|")][4:6] == ["0.250", "-"]


def test_a_marker_is_written_whole_or_not_at_all(tmp_path):
    """The files whose existence says a unit is done: a failed write leaves the earlier file and no stray file."""
    import json

    from common import write_marker

    path = tmp_path / "valid.json"
    write_marker(path, {"mlm_loss": 5.3})
    with pytest.raises(TypeError):
        write_marker(path, {"mlm_loss": object()})
    assert json.loads(path.read_text()) == {"mlm_loss": 5.3}
    assert [p.name for p in tmp_path.iterdir()] == ["valid.json"]
