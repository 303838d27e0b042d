"""Tokenizers: WikiText-2 counts, reference vocabulary order, fast path == Rust, round trips, special tokens,
AutoTokenizer loading in a process where this project is not importable, legacy vocabulary import, bad input."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest
from generated_corpora import play_text

from tokenization import (
    build_vocab,
    byte_level_tokenizer,
    char_level_tokenizer,
    check_vocab_matches,
    encode_lines,
    read_legacy_vocab_pkl,
    tokenizer_from_vocab,
    train_char_level_tokenizer,
    train_unigram_tokenizer,
    train_word_level_tokenizer,
    word_level_tokenizer,
)
from tokenization.arrow_words import WordLevelPlan, insert_after_each_line


def read_lines(path: Path) -> list[str]:
    """Lines as Python's file iteration gives them (the reference reads `for line in f`)."""
    with path.open(encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def read_splits(folder: Path) -> dict[str, list[str]]:
    return {split: read_lines(folder / f"{split}.txt") for split in ("train", "valid", "test")}


@pytest.fixture(scope="module")
def wikitext(shared_data):
    return read_splits(shared_data / "wikitext-2")


@pytest.fixture(scope="module")
def wt2_tokenizer(wikitext):
    # the reference counts all three splits for WikiText (valid/test add no new types)
    return train_word_level_tokenizer(wikitext["train"] + wikitext["valid"] + wikitext["test"])


@pytest.fixture(scope="module")
def generated(wikitext_folder):
    """The generated WikiText-like splits and the tokenizer counted over all three (their valid/test add types)."""
    lines = read_splits(wikitext_folder)
    return lines, train_word_level_tokenizer(lines["train"] + lines["valid"] + lines["test"])


def test_wikitext2_vocabulary_and_training_tokens(wikitext, wt2_tokenizer):
    assert len(wt2_tokenizer) == 33278
    ids, per_line = encode_lines(wikitext["train"], wt2_tokenizer, WordLevelPlan.from_tokenizer(wt2_tokenizer))
    assert ids.size == 2088628 == sum(len(line.split()) + 1 for line in wikitext["train"])  # one <eos> per line
    assert per_line.size == 36718 and (per_line >= 1).all()  # empty lines give one <eos>
    eos = wt2_tokenizer.convert_tokens_to_ids("<eos>")
    assert int((ids == eos).sum()) == 36718 and ids[-1] == eos


def test_vocabulary_order_matches_reference_counter(wikitext, wt2_tokenizer):
    counter = Counter()
    for split in ("train", "valid", "test"):
        for line in wikitext[split]:
            counter.update(line.strip().split())
    expected = ["<eos>"] + [word for word, _ in counter.most_common()]  # Vocab.build_vocab: specials, most_common
    assert wt2_tokenizer.convert_ids_to_tokens(list(range(len(wt2_tokenizer)))) == expected


def test_build_vocab_min_freq_max_size():
    words, counts = ["b", "a", "c", "d"], [1, 3, 1, 2]
    assert build_vocab(words, counts) == ["<eos>", "a", "d", "b", "c", "<unk>"]
    assert build_vocab(words, counts, min_freq=2) == ["<eos>", "a", "d", "<unk>"]
    assert build_vocab(words, counts, max_size=1, special_tokens=("<eos>", "<unk>")) == ["<eos>", "<unk>", "a"]


def test_arrow_fast_path_equals_rust_tokenizer(generated):
    splits, tokenizer = generated
    plan = WordLevelPlan.from_tokenizer(tokenizer)
    tricky = ["", "   ", " a  b ", "x<unk>y", "sep\x1cword", "tab\tand\u3000ideographic\u2028space", "The cat"]
    for lines in (splits["valid"], tricky):
        fast, fast_counts = encode_lines(lines, tokenizer, plan)
        rust, rust_counts = encode_lines(lines, tokenizer)
        np.testing.assert_array_equal(fast, rust)
        np.testing.assert_array_equal(fast_counts, rust_counts)
    lower = train_word_level_tokenizer(["The Cat", "İstanbul ΣΑΣ sat"], lowercase=True)
    lines = ["THE cat", "İSTANBUL σας", "Ünïcode THE"]
    np.testing.assert_array_equal(encode_lines(lines, lower, WordLevelPlan.from_tokenizer(lower))[0],
                                  encode_lines(lines, lower)[0])


def test_insert_after_each_line_matches_loop():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, size=20)
    ids = rng.integers(5, 50, size=int(counts.sum()))
    expected, start = [], 0
    for count in counts:
        expected += list(ids[start:start + count]) + [0]
        start += count
    np.testing.assert_array_equal(insert_after_each_line(ids, counts, 0), expected)


def test_round_trips():
    word = train_word_level_tokenizer(["the cat sat", "on the mat"])
    ids = word("the cat sat on the dog")["input_ids"]
    assert word.convert_ids_to_tokens(ids)[-1] == "<eos>" and word.convert_ids_to_tokens(ids)[-2] == "<unk>"
    assert word.decode(word("the cat sat")["input_ids"], skip_special_tokens=True) == " the cat sat"  # word spaces
    char = train_char_level_tokenizer(["hello world"])
    assert char.decode(char("hello")["input_ids"]) == "hello\n"  # newline ends every line, like the raw text
    assert char.decode(char("hez")["input_ids"]) == "he<unk>\n"
    byte = byte_level_tokenizer()
    text = "héllo\twörld ✓"
    ids = byte(text)["input_ids"]
    assert ids == list(text.encode("utf-8")) + [10] and byte.decode(ids) == text + "\n" and len(byte) == 256


@pytest.fixture(scope="module")
def unigram():
    return train_unigram_tokenizer(play_text(150_000).splitlines()[:4000], vocab_size=400)


def test_word_level_pads_left_and_char_level_pairs_end_lines(tmp_path):
    """The word-level tokenizer pads on the left, as built and as reloaded, once a pad token is set (the README's
    `generate(**tokenizer(prompts, padding=True))`); it declares none (no symbol is added, and `<eos>` as the pad id
    would make label collators drop every end of line). Character and byte level end both texts of a pair with the
    newline, as a single text."""
    from transformers import AutoTokenizer

    word = train_word_level_tokenizer(["the cat sat", "on the mat"])
    assert word.pad_token is None and word.padding_side == "left"
    word.save_pretrained(tmp_path)
    for tok in (word, AutoTokenizer.from_pretrained(tmp_path)):
        with pytest.raises(ValueError, match="does not have a padding token"):
            tok(["the cat", "the cat sat on"], padding=True)
        tok.pad_token = tok.eos_token
        batch = tok(["the cat", "the cat sat on"], padding=True)
        assert batch["input_ids"][0] == [0, 0, 1, 2, 0] and batch["attention_mask"][0] == [0, 0, 1, 1, 1]
        assert batch["input_ids"][1] == tok("the cat sat on")["input_ids"] and len(tok) == len(word) == 7
    char = train_char_level_tokenizer(["ab c"])
    assert char.decode(char("ab", "c")["input_ids"]) == "ab\nc\n"
    byte = byte_level_tokenizer()
    assert byte("ab", "c")["input_ids"] == [97, 98, 10, 99, 10]


def test_char_level_ids_follow_the_given_symbols():
    """chars[i] has id i (an imported character vocabulary keeps its ids); <unk> and the newline come after when
    missing, and a newline among the symbols keeps its own place."""
    tokenizer = char_level_tokenizer(["a", "b", "\n", "c", "a"])
    assert tokenizer.get_vocab() == {"a": 0, "b": 1, "\n": 2, "c": 3, "<unk>": 4}
    assert tokenizer("cab").input_ids == [3, 0, 1, 2]
    assert char_level_tokenizer(["x"]).get_vocab() == {"x": 0, "<unk>": 1, "\n": 2}


def test_char_level_stream_is_the_text_even_where_it_reads_unk(tmp_path):
    """WikiText writes unknown words as the text "<unk>": at character level that is five characters (the bpc
    denominator counts them), also after save and reload; a character outside the symbols is the <unk> id."""
    from transformers import AutoTokenizer

    tokenizer = train_char_level_tokenizer(["a <unk> b", "cab"])
    tokenizer.save_pretrained(tmp_path)
    for tok in (tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        ids = tok("a <unk> bz").input_ids
        assert tok.convert_ids_to_tokens(ids) == ["a", " ", "<", "u", "n", "k", ">", " ", "b", "<unk>", "\n"]
        assert tok.decode(ids[:-2]) == "a <unk> b"


def test_corpus_encoding_ignores_the_tokenizers_padding_and_truncation(tmp_path):
    """A corpus stream is every token of every line, even after a padded, truncated call switched padding and
    truncation on in the Rust tokenizer (or a tokenizer.json saved so); that state is left as it was."""
    from transformers import AutoTokenizer

    tokenizer = train_unigram_tokenizer(play_text(150_000).splitlines()[:2000], vocab_size=300)
    lines = ["First Citizen:", "Before we proceed any further, hear me speak."]
    clean = encode_lines(lines, tokenizer)
    tokenizer(["x", "y z"], padding=True, truncation=True, max_length=3)
    backend = tokenizer.backend_tokenizer
    state = (backend.padding, backend.truncation)
    assert state[0] is not None and state[1]["max_length"] == 3
    for got, want in zip(encode_lines(lines, tokenizer), clean):
        assert np.array_equal(got, want)
    assert (backend.padding, backend.truncation) == state
    tokenizer.save_pretrained(tmp_path)
    for got, want in zip(encode_lines(lines, AutoTokenizer.from_pretrained(tmp_path)), clean):
        assert np.array_equal(got, want)


def test_unigram_xlnet_format_and_left_padding(unigram):
    assert unigram.convert_ids_to_tokens(list(range(9))) == ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>",
                                                            "<mask>", "<eod>", "<eop>"]
    batch = unigram(["Good morrow to you, sir", "Ay"], ["What say you", "No"], padding=True)
    for row in range(2):
        tokens = unigram.convert_ids_to_tokens(batch["input_ids"][row])
        types, mask = batch["token_type_ids"][row], batch["attention_mask"][row]
        assert tokens[-1] == "<cls>" and types[-1] == 2
        seps = [i for i, t in enumerate(tokens) if t == "<sep>"]
        assert len(seps) == 2 and seps[1] == len(tokens) - 2
        first = mask.index(1)
        assert all(t == "<pad>" for t in tokens[:first]) and "<pad>" not in tokens[first:]
        assert set(types[first:seps[0] + 1]) == {0} and set(types[seps[0] + 1:seps[1] + 1]) == {1}
    assert batch["attention_mask"][1][0] == 0  # the shorter pair is padded on the left
    text = "Good morrow to you"
    assert unigram.decode(unigram(text)["input_ids"], skip_special_tokens=True) == text


def test_unigram_collapses_whitespace_as_xlnet_preprocessing(unigram):
    """XLNet's preprocess_text: `" ".join(text.strip().split())` before SentencePiece, then `` and '' become "."""
    plain = unigram("Good morrow to you")["input_ids"]
    for text in ("Good  morrow to you", "  Good morrow\tto   you ", "Good\nmorrow to\u00a0you"):
        assert unigram(text)["input_ids"] == plain, repr(text)
    assert unigram("``Ay''")["input_ids"] == unigram('"Ay"')["input_ids"]


ISOLATED_LOAD = r"""
import importlib.util, json, sys
sys.path.append(sys.argv[1])  # site-packages without running its .pth files: the editable finder stays out
assert importlib.util.find_spec("tokenization") is None and importlib.util.find_spec("modeling_xl") is None
from transformers import AutoTokenizer
out = {}
for name, folder in json.loads(sys.argv[2]).items():
    tok = AutoTokenizer.from_pretrained(folder)
    if name == "unigram":
        enc = tok("Good morrow", "to you", padding="max_length", max_length=16)
        out[name] = [enc["input_ids"], enc["token_type_ids"]]
    else:
        out[name] = tok("the cat héllo")["input_ids"]
print(json.dumps(out))
"""


def test_autotokenizer_loads_without_this_project(tmp_path, unigram):
    tokenizers = {"word": train_word_level_tokenizer(["the cat sat"]), "char": train_char_level_tokenizer(["the cat"]),
                  "byte": byte_level_tokenizer(), "unigram": unigram}
    folders = {}
    for name, tok in tokenizers.items():
        tok.save_pretrained(tmp_path / name)
        folders[name] = str(tmp_path / name)
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run([sys.executable, "-I", "-S", "-c", ISOLATED_LOAD, site_packages, json.dumps(folders)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    for name in ("word", "char", "byte"):
        assert loaded[name] == tokenizers[name]("the cat héllo")["input_ids"], name
    enc = unigram("Good morrow", "to you", padding="max_length", max_length=16)
    assert loaded["unigram"] == [enc["input_ids"], enc["token_type_ids"]]


def test_vocab_list_import(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("<eos>\nthe 10\ncat 3\n<unk>\n", encoding="utf-8")
    tok = tokenizer_from_vocab(path)
    assert tok("the dog cat")["input_ids"] == [1, 3, 2, 0]
    (tmp_path / "bad.txt").write_text("a\n\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is empty"):
        tokenizer_from_vocab(tmp_path / "bad.txt")


class _Hostile:
    def __reduce__(self):
        return (Path.touch, (Path("/nonexistent-dir-xl/never-created"),))


def test_legacy_vocab_pkl_parsed_without_unpickling(tmp_path):
    # the shape transformers 4.35 TransfoXLTokenizer pickles: its __dict__ with Counter/OrderedDict and foreign objects
    symbols = ["<eos>", "the", "cat", "<unk>"]
    state = {"counter": Counter({"the": 5, "cat": 2}), "special": ["<eos>"], "min_freq": 0, "lower_case": False,
             "idx2sym": symbols, "sym2idx": OrderedDict((s, i) for i, s in enumerate(symbols)),
             "unk_token": "<unk>", "moses": _Hostile()}
    for protocol in (2, 4, 5):
        path = tmp_path / f"vocab{protocol}.pkl"
        path.write_bytes(pickle.dumps(state, protocol=protocol))
        parsed = read_legacy_vocab_pkl(path)  # the hostile REDUCE must stay inert
        assert parsed["idx2sym"] == symbols and parsed["sym2idx"] == {s: i for i, s in enumerate(symbols)}
        assert parsed["counter"] == {"the": 5, "cat": 2}
        assert tokenizer_from_vocab(path)("the cat dog")["input_ids"] == [1, 2, 3, 0]
    bad = tmp_path / "other.pkl"
    bad.write_bytes(pickle.dumps({"weights": [1, 2]}))
    with pytest.raises(ValueError, match="other.pkl has no 'idx2sym'"):
        tokenizer_from_vocab(bad)


def test_bad_tokenizer_input():
    with pytest.raises(ValueError, match="no words"):
        train_word_level_tokenizer(["", "   "])
    with pytest.raises(ValueError, match="no characters"):
        train_char_level_tokenizer([])
    with pytest.raises(ValueError, match="unk_token='<unk>' is not in the vocabulary"):
        word_level_tokenizer(["<eos>", "a"])
    for train in (train_word_level_tokenizer, train_char_level_tokenizer, train_unigram_tokenizer):
        with pytest.raises(ValueError, match=r"lines is a single str \('the cat sat'\.\.\.\); expected an iterable"):
            train("the cat sat")  # would train on its characters
    with pytest.raises(ValueError, match=r"chars holds \['bc'\] \(1 in all\); expected single characters"):
        char_level_tokenizer(["a", "bc"])

    class Config:
        vocab_size = 10

    tok = word_level_tokenizer(["<eos>", "<unk>", "a"])
    with pytest.raises(ValueError, match="3 tokens but config.vocab_size=10"):
        check_vocab_matches(tok, Config())
    check_vocab_matches(tok, Config(), allow_larger_model=True)
    Config.vocab_size = 3
    check_vocab_matches(tok, Config())


def train_tokenizer_script():
    """scripts/train_tokenizer.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_tokenizer", Path(__file__).parents[1] / "scripts" /
                                                  "train_tokenizer.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_train_tokenizer_script_and_real_config(tmp_path, capsys):
    script = train_tokenizer_script()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\non the mat\n\nthe end\n", encoding="utf-8")
    script.main(["--corpus", str(corpus), "--kind", "word", "--output", str(tmp_path / "tok"),
                 "--cache-dir", str(tmp_path / "cache")])
    from transformers import AutoTokenizer

    from modeling_xl import TransformerXLConfig

    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tok.convert_ids_to_tokens(tok("the cat")["input_ids"]) == ["the", "cat", "<eos>"]
    config = TransformerXLConfig.from_preset("debug", vocab_size=len(tok), cutoffs=[])
    check_vocab_matches(tok, config)
    with pytest.raises(ValueError, match=f"config.vocab_size={len(tok) + 1}"):
        check_vocab_matches(tok, TransformerXLConfig.from_preset("debug", vocab_size=len(tok) + 1, cutoffs=[]))
    # bad values and options the kind does not read end with one line naming them, not a traceback or silence
    for argv, message in ((["--max-size", "-5"], "--max-size=-5 is invalid; expected a positive integer"),
                          (["--min-freq", "-2"], "--min-freq=-2 is invalid; expected an integer >= 0"),
                          (["--kind", "byte", "--lowercase"], "--kind byte does not use --lowercase"),
                          (["--kind", "char", "--max-size", "9"], "--kind char does not use --max-size")):
        with pytest.raises(SystemExit):
            script.parse_args([*argv, "--output", str(tmp_path / "bad")])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"error: .*nonexistent"):
        script.main(["--corpus", str(tmp_path / "nonexistent.txt"), "--output", str(tmp_path / "bad")])


def test_train_tokenizer_keeps_a_folder_s_tokenizer_and_a_failed_save_leaves_it_as_it_was(tmp_path, capsys,
                                                                                            monkeypatch):
    script = train_tokenizer_script()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\non the mat\n", encoding="utf-8")
    model = tmp_path / "model"  # a model's folder: its config, its tokenizer, a file of the user's
    model.mkdir()
    for name, text in (("config.json", "{}"), ("tokenizer.json", "theirs"), ("special_tokens_map.json", "old"),
                       ("notes.txt", "mine")):
        (model / name).write_text(text)
    before = {p.name: p.read_text() for p in model.iterdir()}
    argv = ["--corpus", str(corpus), "--kind", "word", "--cache-dir", str(tmp_path / "cache"), "--output", str(model)]
    with pytest.raises(SystemExit, match=r"--output='.*model' already holds tokenizer.json, special_tokens_map.json; "
                                         r"expected a folder without a tokenizer, or --overwrite"):
        script.main(argv)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match=r"--output='.*file' is a file; expected a folder"):
        script.main([*argv[:-1], str(tmp_path / "file")])
    def disk_full(*args, **kwargs):  # after the tokenizer and its arguments are written beside the folder
        raise OSError(28, "No space left on device")

    from modeling_xl.runtime import run_folder

    monkeypatch.setattr(run_folder, "move_into_place", disk_full)
    with pytest.raises(SystemExit, match=r"the tokenizer could not be saved in --output='.*model' \(.*No space left"):
        script.main([*argv, "--overwrite"])
    monkeypatch.undo()
    assert {p.name: p.read_text() for p in model.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "corpus.txt", "file", "model"]  # no staging left
    script.main([*argv, "--overwrite"])
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(model).convert_ids_to_tokens([0, 1])  # the new tokenizer loads
    assert (model / "config.json").read_text() == "{}" and (model / "notes.txt").read_text() == "mine"
    assert not (model / "special_tokens_map.json").exists() or (model / "special_tokens_map.json").read_text() != "old"


def test_train_tokenizer_new_folder_mode_and_an_earlier_tokenizers_added_tokens(tmp_path):
    import stat

    from transformers import AutoTokenizer

    script = train_tokenizer_script()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\non the mat\n", encoding="utf-8")
    argv = ["--corpus", str(corpus), "--kind", "word", "--cache-dir", str(tmp_path / "cache"), "--output"]
    script.main([*argv, str(tmp_path / "new")])  # a new folder gets a new folder's mode, not a temporary one's 0700
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o777 & ~umask
    size = len(AutoTokenizer.from_pretrained(tmp_path / "new"))
    (tmp_path / "new" / "added_tokens.json").write_text('{"<extra>": 900}')  # an earlier tokenizer's added tokens
    with pytest.raises(SystemExit, match="already holds .*added_tokens.json"):
        script.main([*argv, str(tmp_path / "new")])
    script.main([*argv, str(tmp_path / "new"), "--overwrite"])
    assert not (tmp_path / "new" / "added_tokens.json").exists()
    assert len(AutoTokenizer.from_pretrained(tmp_path / "new")) == size


def test_train_tokenizer_through_a_link_to_another_file_system(tmp_path):
    """The staging folder is made beside the link's target: a rename across file systems would fail half-way."""
    import tempfile

    from transformers import AutoTokenizer

    other = Path("/dev/shm")
    if not (other.is_dir() and os.access(other, os.W_OK) and other.stat().st_dev != tmp_path.stat().st_dev):
        pytest.skip("needs /dev/shm writable on another file system than the test's folder")
    script = train_tokenizer_script()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\non the mat\n", encoding="utf-8")
    argv = ["--corpus", str(corpus), "--kind", "word", "--cache-dir", str(tmp_path / "cache"), "--output"]
    script.main([*argv, str(tmp_path / "here")])
    size = len(AutoTokenizer.from_pretrained(tmp_path / "here"))
    target = Path(tempfile.mkdtemp(dir=other))
    try:
        (target / "tokenizer.json").write_text("theirs")
        (tmp_path / "link").symlink_to(target)
        script.main([*argv, str(tmp_path / "link"), "--overwrite"])
        assert len(AutoTokenizer.from_pretrained(tmp_path / "link")) == size
        assert sorted(p.name for p in other.iterdir() if p.name.startswith(".tmp_train_tokenizer")) == []
    finally:
        shutil.rmtree(target)


def test_train_tokenizer_all_splits_counts_train_valid_test_in_that_order(tmp_path, wikitext_folder, generated):
    """`--all-splits` on a WikiText folder (its files list test, train, valid alphabetically) gives the reference's
    ids: frequency ties broken by first appearance over train, then valid, then test."""
    script = train_tokenizer_script()
    script.main(["--corpus", str(wikitext_folder), "--kind", "word", "--all-splits", "--output",
                 str(tmp_path / "tok"), "--cache-dir", str(tmp_path / "cache")])
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "tok").get_vocab() == generated[1].get_vocab()


def test_word_level_tokenizer_of_a_lowercase_corpus_lowercases_its_input(tmp_path):
    """A corpus without an uppercase letter gives a tokenizer that lowercases what it reads (issue 35): the corpus's
    own ids are those of a tokenizer without the normalizer, cased text finds its words, and the normalizer is saved
    with the folder. A cased corpus (or `lowercase=False`) keeps the case: WikiText's ids stay the reference's."""
    from transformers import AutoTokenizer

    from modeling_xl.data.tokenizer_choice import word_level_tokenizer_from_counts
    from tokenization.word_level import count_words, has_uppercase

    lines = ["the cat sat on the mat", "a caf\u00e9 by the sea"]
    auto, plain = train_word_level_tokenizer(lines), train_word_level_tokenizer(lines, lowercase=False)
    for line in lines:
        assert auto(line)["input_ids"] == plain(line)["input_ids"]
    assert auto("The Cat sat in a CAF\u00c9")["input_ids"] == auto("the cat sat in a caf\u00e9")["input_ids"]
    assert plain("The Cat")["input_ids"][:2] == [plain.unk_token_id] * 2
    auto.save_pretrained(tmp_path / "tok")
    assert AutoTokenizer.from_pretrained(tmp_path / "tok")("The CAT")["input_ids"] == auto("the cat")["input_ids"]
    cased = train_word_level_tokenizer(["The cat", "the Cat"])
    assert cased("The cat")["input_ids"] != cased("the cat")["input_ids"]
    assert not has_uppercase(["the", "caf\u00e9", "<unk>", "42"]) and has_uppercase(["the", "\u00c9t\u00e9"])
    words, counts = count_words(lines)
    pretraining = word_level_tokenizer_from_counts(words, counts, 12)  # what scripts/pretrain.py trains
    assert pretraining("The MAT")["input_ids"] == pretraining("the mat")["input_ids"]


def test_task_script_features_of_every_tokenizer(tmp_path, unigram):
    """What transformers' run_qa.py / run_ner.py / run_swag.py read, on the word-level tokenizer of a saved model
    folder (`<eos>` declared pad, separator and summary token), the Unigram one (XLNet's `P <sep> Q <sep> <cls>`) and
    the character-level one: offsets into each text, `sequence_ids()` of a pair, `word_ids()` of pre-split words, and
    overflow windows with a stride that all repeat the question."""
    from transformers import AutoTokenizer

    from tokenization import declare_task_tokens

    word = train_word_level_tokenizer(["the cat sat on the mat", "a dog ran"])
    size = len(word)
    assert declare_task_tokens(word) == ["pad_token", "sep_token", "cls_token"] and len(word) == size  # none added
    word.save_pretrained(tmp_path / "word")
    tokenizers = {"word": AutoTokenizer.from_pretrained(tmp_path / "word"), "unigram": unigram,
                  "char": train_char_level_tokenizer(["the cat sat on the mat", "a dog ran"])}
    for name, tok in tokenizers.items():
        pair = tok("the cat", "sat on", return_offsets_mapping=True)
        ids = pair.sequence_ids()
        for k, text in enumerate(("the cat", "sat on")):  # each text's tokens cover its characters, spaces aside
            covered = {c for i, s in enumerate(ids) if s == k for c in range(*pair["offset_mapping"][i])}
            assert {c for c, ch in enumerate(text) if ch != " "} <= covered <= set(range(len(text))), name
        assert max(i for i, s in enumerate(ids) if s == 0) < min(i for i, s in enumerate(ids) if s == 1), name
        words = tok(["the", "cat", "sat"], is_split_into_words=True)
        assert [w for w in words.word_ids() if w is not None][0] == 0 and max(filter(None, words.word_ids())) == 2
        windows = tok("a dog", "the cat sat on the mat the cat sat", truncation="only_second", max_length=12,
                      stride=2, return_overflowing_tokens=True)
        assert len(windows["input_ids"]) >= 2 and set(windows["overflow_to_sample_mapping"]) == {0}, name
        for i in range(len(windows["input_ids"])):
            assert windows.sequence_ids(i).count(0) == len(tok("a dog", add_special_tokens=False)["input_ids"])
    for name in ("word", "unigram"):
        tok = tokenizers[name]
        assert tok.padding_side == "left" and tok.pad_token is not None and tok.cls_token is not None
        batch = tok(["the cat", "the cat sat on"], padding=True)
        assert batch["attention_mask"][0][0] == 0 and batch["input_ids"][0][0] == tok.pad_token_id
    assert tokenizers["word"].pad_token == tokenizers["word"].cls_token == "<eos>"
    unigram_pair = tokenizers["unigram"]("the cat", "sat on")["input_ids"]
    assert unigram_pair[-1] == tokenizers["unigram"].cls_token_id  # <cls> last: XLNet's layout


def test_unigram_vocabulary_smaller_than_the_alphabet_is_named():
    with pytest.raises(ValueError, match=r"vocab_size=12 is too small for this corpus.*expected at least 20 \(its "
                                         r"distinct characters after normalisation\)"):
        train_unigram_tokenizer(["abcdefghijklmnop qrs"], vocab_size=12)
    assert len(train_unigram_tokenizer(["abcdefghijklmnop qrs"], vocab_size=20)) == 20 + 9  # the specials on top
