"""The token cache built straight from text files (`modeling_xl.data.text_file_build`) against the in-memory path:
the same vocabulary and the same ids bit for bit, on odd files, with 1 and 2 workers, many pieces, both objectives."""

import os
import signal
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import warm_launch

from modeling_xl.data import text_file_build
from modeling_xl.data.cached_corpus import cache_identity
from modeling_xl.data.token_cache import cache_key, open_cache
from modeling_xl.training import parse_args
from modeling_xl.training.data_sources import corpus_source, token_cache, tokenizer_recipe
from tokenization.arrow_words import split_words
from tokenization.byte_words import split_text
from tokenization.word_level import FirstSeenCounts, WordCounter, count_words

# every Unicode White_Space character, the characters Python calls whitespace and Rust does not, and look-alikes
ODD_CHARACTERS = ("\t", "\x0b", "\x0c", " ", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680",
                  *(chr(c) for c in range(0x2000, 0x200C)), "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
                  "\u180e", "\ufeff", "\u00e9", "\u4e2d", "\U0001f600")


def lines_array(text: str) -> pa.Array:
    return pa.array(text.split("\n") if not text.endswith("\n") else text[:-1].split("\n"), pa.string())


@pytest.mark.parametrize("seed", range(4))
def test_byte_split_equals_split_words(seed):
    """Every whitespace-like character, at random, and the edge cases of lines: the words and the words per line of
    `split_words` (which the in-memory path uses)."""
    rng = np.random.default_rng(seed)
    alphabet = ["a", "bc", "\u00e9t\u00e9", "<sep>", "x", *ODD_CHARACTERS, "\n", "  "]
    text = "".join(rng.choice(alphabet, size=3000))
    for sample in (text, text + "\n", "", "\n", "\n\n a", " \u3000\n"):
        words, per_line = split_text(sample.encode())
        if not sample:
            assert len(words) == 0 and per_line.size == 0
            continue
        expected_words, expected_counts = split_words(lines_array(sample))
        assert words.to_pylist() == expected_words.to_pylist()
        assert per_line.tolist() == expected_counts.tolist()


def test_first_seen_counts_merge_equals_counting_at_once():
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice([f"w{i}" for i in range(300)], size=rng.integers(0, 30))) for _ in range(2000)]
    merged, counter = FirstSeenCounts(), WordCounter()
    for start in range(0, len(lines), 170):
        words, counts = count_words(lines[start:start + 170])
        merged.add(words, counts)
        counter.update(lines[start:start + 170])
    expected = count_words(lines)
    for words, counts in (merged.result(), counter.result()):
        assert words == expected[0] and counts.tolist() == expected[1].tolist()
    with pytest.raises(ValueError, match="2 words with 1 counts"):
        FirstSeenCounts().add(["a", "b"], np.array([1]))


@pytest.mark.parametrize("window", [1, 2, 3, 1 << 20])
def test_pieces_end_at_line_ends_and_never_split_crlf(tmp_path, window):
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"ab\r\ncd\re\n\r\n\r\rfgh\r\n" * 7 + b"tail")
    data = path.read_bytes()
    bounds = text_file_build.piece_bounds(path, 3, window)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(data) and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    for _, end in bounds[:-1]:
        assert data[end - 1:end] in (b"\n", b"\r") and data[end - 1:end + 1] != b"\r\n", end


ODD_FILES = {
    "plain": "the cat sat\nthe dog\n\n a cat  \n",
    "crlf_no_last_newline": "the cat\r\nsat on\r\n\r\nthe mat\r\nend",
    "lone_cr": "a b\rc d\r\ne f\n\rg\r",
    "separators": "one\u2028two three\x1cfour\nfive\x1dsix \x85 seven\u00a0eight\n\u3000\nnine\x0bten\x0cz\n",
    "non_ascii": "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f600\n\ufeffbom word\n<sep>inside x<cls> <sep>\n",
    "blank_lines": "\n\n\nword\n\n",
    "cr_only": "a b\rc d\r\re\r",
    "bom_first": "\ufeffthe first word\nsecond\n",  # dropped at the start of a file, kept elsewhere, as both read it
}


def corpus_text(kind: str, lines: int = 400, seed: int = 0) -> str:
    """The odd file's lines repeated among generated ones, so the vocabulary has ties and rare words."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)] + ["caf\u00e9", "\u4e2d"]
    weights = 1.0 / np.arange(1, len(words) + 1)
    body = "\n".join(" ".join(rng.choice(words, size=rng.integers(0, 12), p=weights / weights.sum()))
                     for _ in range(lines))
    odd = ODD_FILES[kind]
    newline = "\r\n" if "crlf" in kind else "\r" if kind == "cr_only" else "\n"
    return odd + body.replace("\n", newline) + newline + odd  # ends as the odd file ends


def in_memory_ids(args) -> tuple[dict, dict]:
    """({split: ids}, vocabulary) as the in-memory path makes them."""
    from modeling_xl.data.corpora import load_splits
    from modeling_xl.data.tokenize import tokenize_corpus
    from modeling_xl.data.tokenizer_choice import load_tokenizer

    corpus, _ = load_splits(corpus_source(args))
    tokenizer = load_tokenizer(tokenizer_recipe(args), corpus["train"]["text"])
    ids = tokenize_corpus(corpus, tokenizer, num_proc=1, load_from_cache_file=False)
    return {split: ids[split] for split in ("train", "validation")}, tokenizer.get_vocab()


def argv_for(train: Path, valid: Path | None, cache: Path, *extra) -> list[str]:
    return ["--train_file", str(train), *(["--validation_file", str(valid)] if valid else []), "--token_cache_dir",
            str(cache), "--tokenizer_vocab_size", "40", "--disable_tqdm", *extra]


def assert_cache_equals_in_memory(argv, cache_dir):
    cache = token_cache(parse_args(argv))
    assert cache.meta["build"]["method"] == "text files"
    reference, vocab = in_memory_ids(parse_args([a for a in argv if a not in ("--token_cache_dir", str(cache_dir))]))
    assert cache.tokenizer().get_vocab() == vocab
    for split, ids in reference.items():
        assert np.array_equal(np.asarray(cache.tokens(split), dtype=np.int64), ids.astype(np.int64)), split


@pytest.mark.parametrize("kind", sorted(ODD_FILES))
@pytest.mark.parametrize("with_validation", [True, False])
def test_text_file_cache_equals_in_memory(tmp_path, monkeypatch, kind, with_validation):
    monkeypatch.setattr(text_file_build, "PIECE_BYTES", 97)  # dozens of pieces, cut at line ends
    train = tmp_path / "train.txt"
    train.write_bytes(corpus_text(kind).encode())
    valid = None
    if with_validation:
        valid = tmp_path / "valid.txt"
        valid.write_bytes(corpus_text(kind, lines=50, seed=1).encode())
    bounds = text_file_build.piece_bounds(train, 97)
    assert len(bounds) > 20 and bounds[0][0] == 0 and bounds[-1][1] == train.stat().st_size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    for workers, objective in (("1", "clm"), ("2", "plm")):
        cache = tmp_path / f"cache-{workers}"
        assert_cache_equals_in_memory(argv_for(train, valid, cache, "--preprocessing_num_workers", workers,
                                               "--objective", objective), cache)


def test_folder_and_saved_tokenizer(tmp_path, monkeypatch, wikitext_folder):
    """A WikiText-style folder (its valid.txt is the validation split) and a saved word-level tokenizer (no counts)."""
    monkeypatch.setattr(text_file_build, "PIECE_BYTES", 4096)
    argv = ["--dataset_name", str(wikitext_folder), "--token_cache_dir", str(tmp_path / "a"),
            "--tokenizer_vocab_size", "500", "--disable_tqdm", "--preprocessing_num_workers", "2"]
    assert_cache_equals_in_memory(argv, tmp_path / "a")
    saved = tmp_path / "tokenizer"
    token_cache(parse_args(argv)).tokenizer().save_pretrained(str(saved))
    argv = ["--dataset_name", str(wikitext_folder), "--token_cache_dir", str(tmp_path / "b"),
            "--tokenizer_name", str(saved), "--disable_tqdm", "--preprocessing_num_workers", "2"]
    assert_cache_equals_in_memory(argv, tmp_path / "b")


@pytest.mark.parametrize("content, message", [
    (b" \n\t\n", "has an empty training split \\(2 rows, no text\\)"),
    (b"only one line\n", "has 1 row\\(s\\) and no validation split"),
    (b"ok line\n\xff\xfe bad\n", "bytes .* at byte 8 \\(line 2\\) are not valid UTF-8"),
])
def test_text_file_errors_name_the_file(tmp_path, content, message):
    train = tmp_path / "train.txt"
    train.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        token_cache(parse_args(argv_for(train, None, tmp_path / "cache")))


KILLED_PASS = textwrap.dedent('''
    import os, signal, sys
    from modeling_xl.data import text_file_build
    from modeling_xl.training import parse_args
    from modeling_xl.training.data_sources import token_cache

    text_file_build.PIECE_BYTES = 50
    step = getattr(text_file_build, sys.argv[1])

    def step_then_die(*args, **kwargs):
        step(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(text_file_build, sys.argv[1], step_then_die)
    token_cache(parse_args(sys.argv[2:]))
''')


@pytest.mark.parametrize("step", ["count_pieces", "encode_pieces"])
def test_killed_text_file_build_is_never_used(tmp_path, step):
    train = tmp_path / "train.txt"
    train.write_bytes(corpus_text("plain").encode())
    cache_dir = tmp_path / "cache"
    argv = argv_for(train, None, cache_dir, "--preprocessing_num_workers", "2")
    (tmp_path / "killed_pass.py").write_text(KILLED_PASS)
    run = warm_launch.run(tmp_path / "killed_pass.py", [step, *argv], env=dict(os.environ), cwd=tmp_path, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    key = cache_key(cache_identity(corpus_source(parse_args(argv)), tokenizer_recipe(parse_args(argv))))
    left = cache_dir / f"{key}.partial"
    assert any(left.rglob("piece*")) if step == "count_pieces" else (left / "train.bin").is_file()
    assert not (cache_dir / key).exists() and open_cache(left) is None
    assert_cache_equals_in_memory(argv, cache_dir)
    assert not left.exists()


def test_other_corpora_and_tokenizers_still_build_through_datasets(tmp_path):
    """A jsonl corpus and a byte-level tokenizer are not the text-file build's: the generic build makes them."""
    import json

    jsonl, text = tmp_path / "train.jsonl", tmp_path / "train.txt"
    jsonl.write_text("".join(json.dumps({"text": line}) + "\n" for line in corpus_text("plain").splitlines()))
    text.write_text(corpus_text("plain"))
    for name, train, extra in (("jsonl", jsonl, []), ("byte", text, ["--tokenizer_type", "byte"])):
        cache_dir = tmp_path / name
        argv = argv_for(train, None, cache_dir, *extra)
        cache = token_cache(parse_args(argv))
        assert cache.meta["build"]["method"] == "datasets"
        reference, vocab = in_memory_ids(parse_args([a for a in argv if a not in ("--token_cache_dir", str(cache_dir))]))
        assert cache.tokenizer().get_vocab() == vocab
        for split, ids in reference.items():
            assert np.array_equal(np.asarray(cache.tokens(split), dtype=np.int64), ids.astype(np.int64)), (name, split)


def test_cased_text_against_a_lowercase_corpus_finds_its_words_in_both_builds(tmp_path, monkeypatch):
    """A training corpus without uppercase letters gives a word-level tokenizer that lowercases its input (issue 35):
    a cased validation file, non-ASCII capitals included, is encoded by the text-file build exactly as by the
    in-memory path, and its capitalised words get the ids of their lowercase forms, not <unk>."""
    monkeypatch.setattr(text_file_build, "PIECE_BYTES", 97)
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text(corpus_text("plain"))
    valid.write_text(corpus_text("plain", lines=50, seed=1).upper())  # W12, CAFÉ, ...
    cache = tmp_path / "cache"
    argv = argv_for(train, valid, cache)
    assert_cache_equals_in_memory(argv, cache)
    tokenizer = token_cache(parse_args(argv)).tokenizer()
    assert tokenizer("W3 CAF\u00c9 Caf\u00e9")["input_ids"] == tokenizer("w3 caf\u00e9 caf\u00e9")["input_ids"]
    assert tokenizer.unk_token_id not in tokenizer("W1 W2 W3", add_special_tokens=False)["input_ids"]
