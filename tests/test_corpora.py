"""Corpora and tokenization pipeline: WikiText-2 from files, local formats, built-in corpus, Hub path, caching, errors."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from generated_corpora import wikitext_lines

from modeling_xl.data import corpora
from modeling_xl.data.corpora import builtin_corpus, load_corpus
from modeling_xl.data.streams import OrderedStreams
from modeling_xl.data.tokenize import tokenize_corpus
from tokenization import train_word_level_tokenizer


def tokenized_folder(folder, cache):
    corpus = load_corpus(folder, cache_dir=cache)
    tokenizer = train_word_level_tokenizer(corpus["train"].data.column("text"))
    return corpus, tokenizer, tokenize_corpus(corpus, tokenizer)


@pytest.fixture(scope="module")
def wt2(tmp_path_factory, shared_data):
    return tokenized_folder(shared_data / "wikitext-2", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def generated(tmp_path_factory, wikitext_folder):
    return tokenized_folder(wikitext_folder, str(tmp_path_factory.mktemp("cache")))


def test_wikitext2_pipeline_counts(wt2):
    corpus, tokenizer, ids = wt2
    assert sorted(corpus) == ["test", "train", "validation"] and corpus["train"].num_rows == 36718
    assert len(tokenizer) == 33278
    assert {split: v.size for split, v in ids.items()} == {"train": 2088628, "validation": 217646, "test": 245569}
    assert ids["train"].dtype == np.int32 and ids["train"].max() < 33278


def test_second_run_reuses_cache(generated):
    corpus, tokenizer, ids = generated
    cache_dirs = {Path(data.cache_files[0]["filename"]).parent for data in corpus.values()}  # one per split

    def cache_files():
        return {p: p.stat().st_mtime_ns for d in cache_dirs for p in d.glob("cache-*.arrow")}

    written = cache_files()
    assert len(written) >= 3, "tokenization wrote no cache files"  # one per split, from the fixture's run
    again = tokenize_corpus(corpus, tokenizer)
    np.testing.assert_array_equal(again["validation"], ids["validation"])
    assert cache_files() == written  # loaded, not rewritten


def test_multiprocess_equals_single_process(generated):
    corpus, tokenizer, ids = generated
    small = corpus["train"].select(range(2000))
    one = tokenize_corpus({"train": small}, tokenizer, num_proc=1, load_from_cache_file=False)["train"]
    two = tokenize_corpus({"train": small}, tokenizer, num_proc=2, load_from_cache_file=False)["train"]
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, ids["train"][:one.size])


def test_local_formats(tmp_path):
    rows = ["the first line", "", "a second line"]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": r}) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "c.csv").write_text("body\n" + "\n".join(f'"{r}"' for r in rows) + "\n", encoding="utf-8")
    datasets.Dataset.from_dict({"body": rows}).to_parquet(str(tmp_path / "c.parquet"))
    for name in ("c.jsonl", "c.csv", "c.parquet"):
        corpus = load_corpus(tmp_path / name, text_column="body", cache_dir=str(tmp_path / "cache"))
        assert [r or "" for r in corpus["train"]["body"]] == rows, name
    with pytest.raises(ValueError, match="expected a text column 'text'"):
        load_corpus(tmp_path / "c.jsonl", cache_dir=str(tmp_path / "cache"))


def test_folder_splits_with_different_columns_load(tmp_path):
    """GLUE-style TSVs: the test split has an `index` column and no `label` (loaded together, datasets fails)."""
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na good film\t1\na bad one\t0\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("index\tsentence\n0\tunseen\n", encoding="utf-8")
    corpus = load_corpus(tmp_path, text_column="sentence", cache_dir=str(tmp_path / "cache"))
    assert list(corpus) == ["train", "validation", "test"]
    assert corpus["train"]["sentence"] == ["a good film", "a bad one"] and corpus["train"]["label"] == [1, 0]
    assert corpus["test"].column_names == ["index", "sentence"] and corpus["test"]["sentence"] == ["unseen"]


def test_builtin_corpus_is_prose_deterministic_and_trains(tmp_path_factory):
    corpus = builtin_corpus()  # default cache: a second test session reuses it
    sizes = {split: sum(map(len, corpus[split]["text"])) for split in corpus}
    assert sizes["train"] > 900_000 and sizes["validation"] > 40_000 and sizes["test"] > 40_000
    assert set(corpus["train"]["text"][:200]).isdisjoint(corpus["test"]["text"])
    assert builtin_corpus()["validation"]["text"] == corpus["validation"]["text"]
    sample = " ".join(corpus["train"]["text"][:300]).split()
    assert sum(w.strip(".,;:()'\"").isalpha() for w in sample) / len(sample) > 0.8  # mostly English words
    tokenizer = train_word_level_tokenizer(corpus["train"].data.column("text"), min_freq=2)
    ids = tokenize_corpus(corpus, tokenizer)
    assert ids["train"].size > 150_000
    assert len(OrderedStreams(ids["train"], batch_size=8, tgt_len=64)) > 300


def test_hub_path_calls_load_dataset_and_fails_offline_clearly(monkeypatch):
    with pytest.raises(OSError, match="could not load the corpus 'wikitext'.*wikitext-2-raw-v1"):
        load_corpus("wikitext", "wikitext-2-raw-v1")  # HF_HUB_OFFLINE / no network: the real path fails clearly
    calls = []

    def fake_load_dataset(name, config, cache_dir=None):  # the Hub boundary: what the name + config would return
        calls.append((name, config))
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["hello world"]}),
                                     "valid": datasets.Dataset.from_dict({"text": ["bye"]})})

    monkeypatch.setattr(corpora.datasets, "load_dataset", fake_load_dataset)
    corpus = load_corpus("wikitext", "wikitext-103-raw-v1")
    assert calls == [("wikitext", "wikitext-103-raw-v1")] and sorted(corpus) == ["train", "validation"]


def test_bad_corpora(tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus '.*empty.txt' has no text \(2 rows, all blank\)"):
        load_corpus(tmp_path / "empty.txt", cache_dir=str(tmp_path / "cache"))
    (tmp_path / "zero.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"zero.txt is empty \(0 bytes\); expected a corpus file"):
        load_corpus(tmp_path / "zero.txt", cache_dir=str(tmp_path / "cache"))
    (tmp_path / "bad.txt").write_bytes(b"fine line\nbad \xff\xfe bytes\n")
    with pytest.raises(ValueError, match=r"bad.txt: bytes .* at byte 14 \(line 2\) are not valid UTF-8"):
        load_corpus(tmp_path / "bad.txt", cache_dir=str(tmp_path / "cache"))
    (tmp_path / "short.txt").write_text("only a few words here\n", encoding="utf-8")
    corpus = load_corpus(tmp_path / "short.txt", cache_dir=str(tmp_path / "cache"))
    tokenizer = train_word_level_tokenizer(corpus["train"]["text"])
    ids = tokenize_corpus(corpus, tokenizer)["train"]
    with pytest.raises(ValueError, match="shorter than one segment of tgt_len=8"):
        OrderedStreams(ids, batch_size=4, tgt_len=8)
    empty = datasets.Dataset.from_dict({"text": []}, features=datasets.Features({"text": datasets.Value("string")}))
    ids = tokenize_corpus({"validation": empty}, tokenizer)["validation"]  # was a KeyError from inside `map`
    assert ids.dtype == np.int32 and ids.size == 0
    with pytest.raises(ValueError, match="the corpus has 0 tokens"):
        OrderedStreams(ids, batch_size=1, tgt_len=1)
    with pytest.raises(ValueError, match="has no train file"):
        load_corpus(tmp_path / "cache", cache_dir=str(tmp_path / "cache2"))


@pytest.mark.parametrize("objective, reserved", [("clm", 0), ("plm", 2)])
def test_trained_word_tokenizer_has_exactly_tokenizer_vocab_size_symbols(objective, reserved):
    from modeling_xl.data.tokenizer_choice import load_tokenizer
    from modeling_xl.training import parse_args
    from modeling_xl.training.data_sources import tokenizer_recipe

    lines = wikitext_lines(3000)
    assert any("<unk>" in line.split() for line in lines)  # WikiText holds the literal word <unk>
    without_unk = [line.replace("<unk>", "") for line in lines]
    for texts in (lines, without_unk):
        corpus = {"train": datasets.Dataset.from_dict({"text": texts})}
        for size in (5, 6, 500):
            args = parse_args(["--preset", "debug", "--objective", objective, "--tokenizer_vocab_size", str(size)])
            tokenizer = load_tokenizer(tokenizer_recipe(args), corpus["train"]["text"])
            assert len(tokenizer) == size, (size, texts is lines)
            assert tokenizer.convert_ids_to_tokens(0) == "<eos>" and tokenizer.unk_token == "<unk>"
            assert sorted(tokenizer.get_vocab().values()) == list(range(size))


def test_a_byte_order_mark_does_not_stick_to_the_first_word(tmp_path):
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfFirst words\nsecond line \xef\xbb\xbfkept\n")
    rows = load_corpus(tmp_path / "bom.txt", cache_dir=str(tmp_path / "cache"))["train"]["text"]
    assert rows == ["First words", "second line \ufeffkept"]  # only the file's opening mark is dropped


def test_errors_of_the_validation_file_name_that_argument(tmp_path):
    from modeling_xl.data.corpora import load_splits
    from modeling_xl.training.arguments import parse_args
    from modeling_xl.training.data_sources import corpus_source

    (tmp_path / "train.txt").write_text("one line\nanother line\n")
    (tmp_path / "blank.txt").write_text("\n \n")
    args = parse_args(["--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "blank.txt")])
    with pytest.raises(ValueError, match=r"^validation_file='.*blank.txt': corpus '.*blank.txt' has no text \(2 rows"):
        load_splits(corpus_source(args))
    (tmp_path / "valid.jsonl").write_text('{"body": "x"}\n')
    args = parse_args(["--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "valid.jsonl")])
    with pytest.raises(ValueError, match=r"^validation_file='.*valid.jsonl': corpus '.*valid.jsonl' has columns "
                                         r"\['body'\]; expected a text column 'text'"):
        load_splits(corpus_source(args))


def test_a_folder_given_as_train_file_is_named_as_a_folder(tmp_path):
    from modeling_xl.training.arguments import parse_args

    with pytest.raises(ValueError, match=r"train_file='.*' is a folder; expected a local text/json/csv/parquet file "
                                         r"\(for a folder of train/valid/test files pass it as --dataset_name\)"):
        parse_args(["--train_file", str(tmp_path)])


def test_corpus_files_a_folder_does_not_read_are_named(tmp_path, caplog):
    for name in ("train.txt", "valid.txt", "more_train.txt"):
        (tmp_path / name).write_text("some words\nmore words\n")
    (tmp_path / "NOTES.md").write_text("not a corpus file")
    with caplog.at_level("WARNING", logger="modeling_xl.data.corpora"):
        corpus = load_corpus(tmp_path, cache_dir=str(tmp_path / "cache"))
    assert sorted(corpus) == ["train", "validation"]
    assert "ignoring more_train.txt (only files named train/valid/test are read)" in caplog.text
    assert "NOTES.md" not in caplog.text
