"""Corpora larger than memory: the token cache (`--token_cache_dir`), `--streaming`, permutation-LM rows read lazily,
and word counts made batch by batch. Each path must give the in-memory path's batches, bit for bit."""

import bz2
import gzip
import json
import os
import signal
import textwrap
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import warm_launch

from modeling_xl.data import plm_rows
from modeling_xl.data.cached_corpus import cache_identity
from modeling_xl.data.plm_layout import plm_layout, sentence_ids_from_eos
from modeling_xl.data.plm_rows import PLMRowLayout, trim_lengths
from modeling_xl.data.token_cache import cache_key, open_cache
from modeling_xl.training import parse_args
from modeling_xl.training.data_sources import build_data, corpus_source, token_cache, tokenizer_recipe
from tokenization.word_level import WordCounter, count_words, train_word_level_tokenizer

WORDS = [f"w{i}" for i in range(150)]


def write_corpus(folder: Path, lines: int, seed: int, name: str) -> Path:
    """Zipf-ish words, 1-20 per line, some blank lines (which give a lone <eos>)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(WORDS) + 1)
    text = [" ".join(rng.choice(WORDS, size=rng.integers(0, 20), p=weights / weights.sum())) for _ in range(lines)]
    path = folder / name
    path.write_text("\n".join(text) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return write_corpus(folder, 700, 0, "train.txt"), write_corpus(folder, 150, 1, "valid.txt")


def args_for(corpus, *extra, objective="clm", tgt_len=16):
    """Arguments of a run on `corpus`: in memory (`--token_cache false`) unless `extra` asks for the cache or a
    stream, so that the in-memory path stays the reference the other paths are compared with."""
    train, valid = corpus
    source = [] if {"--token_cache_dir", "--streaming", "--token_cache"} & set(extra) else ["--token_cache", "false"]
    return parse_args(["--train_file", str(train), "--validation_file", str(valid), "--tgt_len", str(tgt_len),
                       "--train_batch_size", "4", "--tokenizer_vocab_size", "120", "--objective", objective,
                       "--disable_tqdm", "--max_train_steps", "1000", *source, *extra])


def assert_same_batches(a, b, steps):
    for step in steps:
        x, y = a.train.batch(step), b.train.batch(step)
        assert x.keys() == y.keys()
        for key in x:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), (step, key)
    for x, y in zip(a.validation, b.validation):
        assert all(torch.equal(x[key], y[key]) for key in x)


@pytest.mark.parametrize("objective", ["clm", "plm"])
@pytest.mark.parametrize("world", [1, 2])
def test_cache_batches_equal_in_memory_batches(corpus, tmp_path, objective, world):
    cache_args = args_for(corpus, "--token_cache_dir", str(tmp_path / "cache"), "--preprocessing_num_workers", "2",
                          objective=objective)
    memory_args = args_for(corpus, objective=objective)
    for rank in range(world):
        memory = build_data(memory_args, rank, world, 4 // world)
        cached = build_data(cache_args, rank, world, 4 // world)  # built by rank 0, opened by rank 1
        assert cached.tokenizer.get_vocab() == memory.tokenizer.get_vocab()
        steps = range(min(len(memory.train), 12))
        assert_same_batches(memory, cached, steps)
        # across a resume: a fresh process's data at step k gives what the uninterrupted run reads at step k
        resumed = build_data(cache_args, rank, world, 4 // world)
        start = len(steps) // 2
        for (step, x), (_, y) in zip(resumed.train_batches(start, start + 3, "cpu"),
                                     memory.train_batches(start, start + 3, "cpu")):
            assert all(torch.equal(x[key], y[key]) for key in x if key != "new_epoch"), step
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / "COMPLETE").is_file()
    meta = json.loads((entries[0] / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and set(meta["splits"]) == {"train", "validation"}


def identity(args) -> dict:
    return cache_identity(corpus_source(args), tokenizer_recipe(args))


def test_cache_key_follows_corpus_and_tokenizer(corpus, tmp_path):
    base = cache_key(identity(args_for(corpus)))
    assert cache_key(identity(args_for(corpus))) == base
    assert cache_key(identity(args_for(corpus, "--tokenizer_vocab_size", "100"))) != base
    assert cache_key(identity(args_for(corpus, objective="plm"))) != base
    edited = tmp_path / "train.txt"
    edited.write_text(corpus[0].read_text() + "one more line\n")
    assert cache_key(identity(args_for((edited, corpus[1])))) != base


KILLED_BUILD = textwrap.dedent('''
    import os, signal, sys
    from modeling_xl.data import token_cache
    from modeling_xl.training import parse_args
    from modeling_xl.training import data_sources

    write = token_cache.write_split_tokens

    def write_then_die(data, tokenizer, path, **kwargs):  # the train split is on disk, the entry is not complete
        write(data, tokenizer, path, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    token_cache.write_split_tokens = write_then_die
    import modeling_xl.data.cached_corpus as cached_corpus
    cached_corpus.write_split_tokens = write_then_die
    from modeling_xl.data import text_file_build  # the build that reads text files directly

    encode = text_file_build.encode_pieces

    def encode_then_die(*args, **kwargs):  # train.bin and validation.bin are on disk, the entry is not complete
        encode(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    text_file_build.encode_pieces = encode_then_die
    data_sources.token_cache(parse_args(sys.argv[1:]))
''')


def test_killed_build_is_never_used(corpus, tmp_path):
    cache_dir = tmp_path / "cache"
    argv = ["--train_file", str(corpus[0]), "--validation_file", str(corpus[1]), "--token_cache_dir", str(cache_dir),
            "--tokenizer_vocab_size", "120", "--disable_tqdm"]
    (tmp_path / "killed_build.py").write_text(KILLED_BUILD)
    run = warm_launch.run(tmp_path / "killed_build.py", argv, env=dict(os.environ), cwd=tmp_path, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    key = cache_key(identity(parse_args(argv)))
    assert (cache_dir / f"{key}.partial" / "train.bin").is_file()  # what the killed build left
    assert not (cache_dir / key).exists() and open_cache(cache_dir / f"{key}.partial") is None
    rebuilt = build_data(parse_args(argv + ["--tgt_len", "16", "--train_batch_size", "4"]), 0, 1, 4)
    assert not (cache_dir / f"{key}.partial").exists() and open_cache(cache_dir / key) is not None
    memory = build_data(parse_args([a for a in argv if a not in ("--token_cache_dir", str(cache_dir))]
                                   + ["--tgt_len", "16", "--train_batch_size", "4", "--token_cache", "false"]), 0, 1, 4)
    assert_same_batches(memory, rebuilt, range(len(memory.train)))


def test_damaged_entry_is_rebuilt(corpus, tmp_path):
    args = args_for(corpus, "--token_cache_dir", str(tmp_path))
    build_data(args, 0, 1, 4)  # its memmaps are dropped before the file is truncated (reading them would SIGBUS)
    entry = next(p for p in tmp_path.iterdir() if p.is_dir())
    with open(entry / "train.bin", "r+b") as handle:  # a truncated token file (a disk incident, a bad copy)
        handle.truncate(10)
    assert open_cache(entry) is None
    again = build_data(args, 0, 1, 4)
    assert_same_batches(build_data(args_for(corpus), 0, 1, 4), again, range(5))


# ---- streaming ---------------------------------------------------------------------------------------------------


def _rewrite(path: Path, folder: Path, kind: str) -> Path:
    lines = path.read_text().splitlines()
    stem = path.stem
    if kind == "gz":
        out = folder / f"{stem}.txt.gz"
        out.write_bytes(gzip.compress(path.read_bytes()))
    elif kind == "bz2":
        out = folder / f"{stem}.txt.bz2"
        out.write_bytes(bz2.compress(path.read_bytes()))
    elif kind == "jsonl":
        out = folder / f"{stem}.jsonl"
        out.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    else:
        out = folder / f"{stem}.parquet"
        datasets.Dataset.from_dict({"text": lines}).to_parquet(str(out))
    return out


@pytest.mark.parametrize("kind", ["txt", "gz", "bz2", "jsonl", "parquet"])
def test_streaming_equals_in_memory(corpus, tmp_path, kind):
    files = corpus if kind == "txt" else tuple(_rewrite(p, tmp_path, kind) for p in corpus)
    memory = build_data(args_for(corpus), 1, 2, 2)
    count = ["--num_train_tokens", str(memory.info["train_tokens"])] if kind == "gz" else []  # else: counted
    streamed = build_data(args_for(files, "--streaming", *count), 1, 2, 2)
    assert streamed.tokenizer.get_vocab() == memory.tokenizer.get_vocab()
    assert streamed.info["train_tokens"] == memory.info["train_tokens"] and len(streamed.train) == len(memory.train)
    assert_same_batches(memory, streamed, range(len(memory.train)))
    assert_same_batches(memory, streamed, [7, 3, 4])  # a resume jumps back: the rows re-open at their position


def test_streaming_hub_name_goes_through_load_dataset(corpus, monkeypatch):
    real, calls = datasets.load_dataset, []

    def fake_load_dataset(name, config=None, **kwargs):  # the Hub boundary: the name resolves to these files
        if name != "someone/corpus":
            return real(name, config, **kwargs)
        calls.append((name, config, kwargs))
        return real("text", data_files={"train": str(corpus[0]), "validation": str(corpus[1])}, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    streamed = build_data(parse_args(["--dataset_name", "someone/corpus", "--dataset_config_name", "en",
                                      "--streaming", "--tgt_len", "16", "--train_batch_size", "4",
                                      "--tokenizer_vocab_size", "120", "--disable_tqdm"]), 0, 1, 4)
    assert calls == [("someone/corpus", "en", {"streaming": True})]
    assert_same_batches(build_data(args_for(corpus), 0, 1, 4), streamed, range(6))


def test_streaming_argument_errors(corpus):
    with pytest.raises(ValueError, match="streaming=True and token_cache_dir='x' are both set"):
        args_for(corpus, "--streaming", "--token_cache_dir", "x")
    with pytest.raises(ValueError, match="streaming=True with objective='plm' is not supported.*token_cache_dir"):
        args_for(corpus, "--streaming", objective="plm")
    with pytest.raises(ValueError, match="num_train_tokens=5 is set without streaming=True"):
        args_for(corpus, "--num_train_tokens", "5")
    with pytest.raises(ValueError, match="no validation split; expected --validation_file"):
        build_data(parse_args(["--train_file", str(corpus[0]), "--streaming", "--tgt_len", "16"]), 0, 1, 4)
    wrong = build_data(args_for(corpus, "--streaming", "--num_train_tokens", "100000"), 0, 1, 4)
    with pytest.raises(ValueError, match="num_tokens=100000 but open_chunks\\(\\) holds only"):
        wrong.train.batch(len(wrong.train) - 1)


# ---- word counts, batch by batch --------------------------------------------------------------------------------


def test_streamed_word_counts_equal_in_memory_counts(shared_data):
    lines = (shared_data / "wikitext-2" / "train.txt").read_text(encoding="utf-8").splitlines()
    counter = WordCounter()
    for start in range(0, len(lines), 997):
        counter.update(lines[start : start + 997])
    words, counts = count_words(lines)
    assert counter.result()[0] == words and np.array_equal(counter.result()[1], counts)
    streamed = train_word_level_tokenizer(lines)  # the vocabulary the in-memory path builds (267,735 on WT103)
    from tokenization.word_level import build_vocab

    assert build_vocab(*counter.result()) == list(dict(sorted(streamed.get_vocab().items(), key=lambda kv: kv[1])))


# ---- permutation-LM rows read lazily ----------------------------------------------------------------------------


def test_trim_lengths_matches_the_reference_loop():
    def loop(a, b, total):
        while a + b > total:
            if a > b:
                a -= 1
            else:
                b -= 1
        return a, b

    assert all(trim_lengths(a, b, t) == loop(a, b, t) for a in range(12) for b in range(12) for t in range(25))


@pytest.mark.parametrize("eos", [None, 2])
@pytest.mark.parametrize("bi_data", [False, True])
def test_lazy_plm_rows_equal_the_eager_layout(tmp_path, monkeypatch, eos, bi_data):
    monkeypatch.setattr(plm_rows, "SCAN", 16)  # boundary scans then take several reads
    rng = np.random.default_rng(0)
    stream = rng.integers(3, 30, 3000)
    if eos is not None:
        stream[rng.random(3000) < 0.05] = eos
    stream[1500:2200] = 7  # a sentence longer than a scan window would see in one read
    sentences = sentence_ids_from_eos(stream, eos) if eos is not None else None
    eager = plm_layout(stream, 4, 64, 32, 40, 41, 5, sentence_ids=sentences, sentence_len=9, bi_data=bi_data)
    stream.astype(np.uint16).tofile(tmp_path / "ids.bin")
    mapped = np.memmap(tmp_path / "ids.bin", dtype=np.uint16, mode="r")
    lazy = PLMRowLayout(mapped, 4, 64, 32, 40, 41, 5, eos_id=eos, sentence_len=9, bi_data=bi_data)
    samples = [lazy.sample(row, step) for step in range(lazy.num_steps) for row in range(4)]
    assert len(samples) == len(eager["input_ids"])
    for key in eager:
        assert np.array_equal(np.stack([np.asarray(s[key]) for s in samples]), eager[key]), key


# ---- through the training loop ------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["clm", "plm"])
def test_run_from_cache_has_the_in_memory_run_losses(corpus, tmp_path, objective):
    from modeling_xl.training import run_pretraining
    from modeling_xl.training.feedback import read_log

    def run(name, *extra):
        args = ["--preset", "debug", "--train_file", str(corpus[0]), "--validation_file", str(corpus[1]),
                "--tokenizer_vocab_size", "120", "--objective", objective, "--tgt_len", "16", "--mem_len", "8",
                "--max_train_steps", "4", "--eval_steps", "4", "--max_eval_segments", "2", "--disable_tqdm",
                "--output_dir", str(tmp_path / name), *extra]
        results = run_pretraining(parse_args(args))
        return [r["loss"] for r in read_log(tmp_path / name / "train_log.jsonl") if "loss" in r], results

    cached = run("cached", "--token_cache_dir", str(tmp_path / "cache"))
    assert run("memory", "--token_cache", "false") == cached


# ---- the token cache by default (issue 35 item 6) -------------------------------------------------------------------


def test_token_cache_is_on_by_default_for_local_files(corpus, tmp_path, monkeypatch, wikitext_folder):
    """Local files (and a local dataset folder) use the cache in the user's cache folder; the built-in corpus, a
    stream and `--token_cache false` do not; a folder given with `--token_cache false` is refused by name."""
    monkeypatch.setenv("MODELING_XL_CACHE", str(tmp_path / "home"))
    default = str(tmp_path / "home" / "token_cache")
    files = ["--train_file", str(corpus[0]), "--validation_file", str(corpus[1])]
    assert parse_args(files).token_cache_dir == default
    assert parse_args(["--dataset_name", str(wikitext_folder)]).token_cache_dir == default
    assert parse_args(files + ["--token_cache", "false"]).token_cache_dir is None
    assert parse_args(files + ["--streaming"]).token_cache_dir is None
    assert parse_args([]).token_cache_dir is None  # the built-in corpus: in memory, as before
    assert parse_args(["--token_cache", "true"]).token_cache_dir == default
    assert parse_args(files + ["--token_cache_dir", str(tmp_path / "mine")]).token_cache_dir == str(tmp_path / "mine")
    monkeypatch.delenv("MODELING_XL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert parse_args(files).token_cache_dir == str(tmp_path / "xdg" / "modeling_xl" / "token_cache")
    with pytest.raises(ValueError, match="token_cache=False and token_cache_dir='x' are both set"):
        parse_args(files + ["--token_cache", "false", "--token_cache_dir", "x"])


@pytest.mark.parametrize("objective", ["clm", "plm"])
def test_rerun_with_the_first_runs_saved_tokenizer_opens_the_same_entry(corpus, tmp_path, monkeypatch, objective):
    """A run trains its tokenizer and builds the entry (no cache flag: the default folder); a second run that loads
    the tokenizer saved in the first run's output folder opens that entry without building anything (the key follows
    the tokenizer's content, not how it was obtained), and the run record names the folder."""
    from modeling_xl.data import cached_corpus
    from modeling_xl.training import run_pretraining

    monkeypatch.setenv("MODELING_XL_CACHE", str(tmp_path / "home"))
    common = ["--preset", "debug", "--train_file", str(corpus[0]), "--validation_file", str(corpus[1]),
              "--objective", objective, "--tgt_len", "16", "--mem_len", "8", "--max_train_steps", "1",
              "--eval_steps", "1", "--max_eval_segments", "1", "--disable_tqdm"]
    run_pretraining(parse_args(common + ["--tokenizer_vocab_size", "120", "--output_dir", str(tmp_path / "first")]))
    record = json.loads((tmp_path / "first" / "training_config.json").read_text())
    assert record["token_cache_dir"] == str(tmp_path / "home" / "token_cache")
    entries = [p for p in (tmp_path / "home" / "token_cache").iterdir() if (p / "COMPLETE").is_file()]
    assert len(entries) == 1

    def no_build(*args, **kwargs):
        raise AssertionError("the second run built a cache entry")

    monkeypatch.setattr(cached_corpus, "build_from_text_files", no_build)
    monkeypatch.setattr(cached_corpus, "build_through_datasets", no_build)
    again = token_cache(parse_args(common + ["--tokenizer_name", str(tmp_path / "first"),
                                             "--output_dir", str(tmp_path / "second")]))
    assert again.path == entries[0]
