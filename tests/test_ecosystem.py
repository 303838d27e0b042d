"""Saved folders in the ecosystem's usual places: pipeline("text-generation") with a word-level model, TextStreamer with
generate, AutoTokenizer on a model folder in a process without this project, file permissions of the weights, and the
model card's facts (tokenizer kind, validation token counts, the path its usage sample loads)."""

from __future__ import annotations

import io
import json
import os
import select
import stat
import subprocess
import sys
import sysconfig
import time
from contextlib import redirect_stdout

import pytest
import torch
from generated_corpora import wikitext_lines

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
from tokenization import train_word_level_tokenizer


@pytest.fixture(scope="module")
def word_model_folder(tmp_path_factory):
    """A word-level tokenizer on generated text and a small causal LM over its vocabulary, saved as one folder."""
    tokenizer = train_word_level_tokenizer(["the market of the town", *wikitext_lines(200)])
    torch.manual_seed(0)
    model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", vocab_size=len(tokenizer), adaptive=False,
                                                                     cutoffs=[])).eval()
    folder = tmp_path_factory.mktemp("word_lm")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def continuation_words(model, tokenizer, prompt: str, max_new_tokens: int) -> list[str]:
    """The words greedy generation adds after `prompt` (its <eos> kept off), special tokens left out."""
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    new = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[1]:]
    return [t for t in tokenizer.convert_ids_to_tokens(new.tolist()) if t not in tokenizer.all_special_tokens]


def test_word_level_decode_gives_each_word_its_space():
    tokenizer = train_word_level_tokenizer(["the cat sat on the mat ."])
    ids = tokenizer("the cat sat .")["input_ids"]
    assert tokenizer.decode(ids) == " the cat sat . <eos>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == " the cat sat ."
    assert "the cat" + tokenizer.decode(tokenizer("sat .", add_special_tokens=False)["input_ids"]) == "the cat sat ."


def test_text_generation_pipeline_appends_the_continuation_with_its_space(word_model_folder):
    from transformers import pipeline

    folder, model, tokenizer = word_model_folder
    generator = pipeline("text-generation", model=str(folder), trust_remote_code=True)
    words = continuation_words(model, tokenizer, "the market", 6)
    assert words, "greedy generation gave only special tokens; the test needs words to check the spacing"
    out = generator("the market", max_new_tokens=6, do_sample=False, add_special_tokens=False)
    assert out[0]["generated_text"] == "the market " + " ".join(words)
    new = generator("the market", max_new_tokens=6, do_sample=False, add_special_tokens=False, return_full_text=False)
    assert new[0]["generated_text"] == " " + " ".join(words)


def test_text_streamer_prints_the_generated_text(word_model_folder):
    from transformers import TextStreamer

    _, model, tokenizer = word_model_folder
    words = continuation_words(model, tokenizer, "the market", 6)
    ids = tokenizer("the market", add_special_tokens=False, return_tensors="pt").input_ids
    printed = io.StringIO()
    with redirect_stdout(printed):
        out = model.generate(ids, max_new_tokens=6, do_sample=False,
                             streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    assert out.shape[1] == ids.shape[1] + 6
    assert words and printed.getvalue() == " " + " ".join(words) + "\n"  # the words as they come, spaced


FRESH_TOKENIZER_LOAD = r"""
import importlib.util, json, sys
sys.path.append(sys.argv[1])  # site-packages without running its .pth files: the editable finder stays out
assert importlib.util.find_spec("tokenization") is None and importlib.util.find_spec("modeling_xl") is None
from transformers import AutoTokenizer
kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {"trust_remote_code": False}
tok = AutoTokenizer.from_pretrained(sys.argv[2], **kwargs)
ids = tok("the market of the town", add_special_tokens=False)["input_ids"]
print(json.dumps({"class": type(tok).__name__, "ids": ids, "text": tok.decode(ids), "modules": sorted(
    name for name in sys.modules if name.startswith(("transformers_modules", "modeling_xl", "tokenization")))}))
"""


def test_autotokenizer_loads_a_model_folder_without_remote_code_or_this_project(word_model_folder):
    """The tokenizer is tokenizer.json (no code): with remote code refused, in a process where neither `modeling_xl`
    nor `tokenization` can be imported, it loads from the model folder without asking and encodes as the original."""
    folder, _, tokenizer = word_model_folder
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run([sys.executable, "-I", "-S", "-c", FRESH_TOKENIZER_LOAD, site_packages, str(folder)],
                            cwd=folder, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    expected = tokenizer("the market of the town", add_special_tokens=False)["input_ids"]
    assert loaded == {"class": "TokenizersBackend", "ids": expected, "text": " the market of the town", "modules": []}


PROMPT = "Do you wish to run the custom code"


def run_in_terminal(command: list[str], cwd, timeout: float = 120) -> tuple[int, str]:
    """Run `command` with a pseudo-terminal as its stdin/stdout/stderr (as a user at a shell or in a notebook sees it):
    returns its exit code and everything it wrote. A prompt for remote code is answered "n" at once, so that a prompt
    is seen by the caller instead of hanging the test."""
    leader, follower = os.openpty()
    proc = subprocess.Popen(command, cwd=cwd, stdin=follower, stdout=follower, stderr=follower, close_fds=True,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "TERM": "dumb"})
    os.close(follower)
    output, answered, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the process closed the terminal (it exited)
                    break
                if not chunk:
                    break
                output += chunk
                if not answered and b"[y/N]" in output:
                    os.write(leader, b"n\n")
                    answered = True
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"{command} ran past {timeout} s in a terminal; it wrote: {output[-2000:]!r}")
        return proc.wait(timeout=30), output.decode(errors="replace")
    finally:
        os.close(leader)


def fresh_tokenizer_load_in_terminal(folder, kwargs: dict) -> tuple[int, str]:
    site_packages = sysconfig.get_paths()["purelib"]
    return run_in_terminal([sys.executable, "-I", "-S", "-c", FRESH_TOKENIZER_LOAD, site_packages, str(folder),
                            json.dumps(kwargs)], cwd=folder)


def test_autotokenizer_with_remote_code_refused_neither_asks_nor_waits_in_a_terminal(word_model_folder):
    """The README's line, at a terminal (where transformers would ask), in a process without this project."""
    folder, _, tokenizer = word_model_folder
    code, output = fresh_tokenizer_load_in_terminal(folder, {"trust_remote_code": False})
    assert code == 0, output[-2000:]
    assert PROMPT not in output
    expected = tokenizer("the market of the town", add_special_tokens=False)["input_ids"]
    assert json.loads(output.strip().splitlines()[-1])["ids"] == expected


@pytest.mark.xfail(strict=True, reason=(
    "transformers (5.10-5.24) asks: AutoTokenizer.from_pretrained reads config.json through AutoConfig before "
    "tokenizer_config.json, and a config.json whose auto_map names AutoConfig for a model_type transformers does not "
    "know makes AutoConfig ask (resolve_trust_remote_code), whatever the tokenizer files say; the auto_map is what "
    "trust_remote_code=True loading needs (docs/ecosystem.md). Strict: passing means transformers stopped asking"))
def test_bare_autotokenizer_call_does_not_ask_in_a_terminal(word_model_folder):
    folder, _, _ = word_model_folder
    code, output = fresh_tokenizer_load_in_terminal(folder, {})
    assert PROMPT not in output, output[-1500:]
    assert code == 0, output[-2000:]


@pytest.mark.parametrize("head", ["causal", "permutation", "classification"])
def test_saved_weights_are_readable_like_the_rest_of_the_folder(tmp_path, head):
    from modeling_xl import TransformerXLForPermutationLM, TransformerXLForSequenceClassification

    if head == "causal":
        model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug"))
    elif head == "permutation":
        model = TransformerXLForPermutationLM(TransformerXLConfig.from_preset("debug", attn_type="bi", adaptive=False,
                                                                              cutoffs=[], reuse_len=4))
    else:
        model = TransformerXLForSequenceClassification(TransformerXLConfig.from_preset("debug", num_labels=3))
    umask = os.umask(0o022)
    try:
        model.save_pretrained(tmp_path)
    finally:
        os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


# ---------------------------------------------------------------- model card facts

class _Args:
    tokenizer_name = model_name_or_path = char_level = dataset_config_name = None


@pytest.mark.parametrize("kind, expected", [("word", "word level"), ("char", "character level"),
                                            ("byte", "byte level"), ("unigram", "Unigram")])
def test_card_names_the_tokenizer_by_what_it_is(kind, expected):
    import numpy as np

    from modeling_xl.data.pretrain_data import describe
    from modeling_xl.data.sources import CorpusSource, TokenizerRecipe
    from tokenization import byte_level_tokenizer, train_char_level_tokenizer, train_unigram_tokenizer

    lines = wikitext_lines(400)
    tokenizer = {"word": lambda: train_word_level_tokenizer(lines), "char": lambda: train_char_level_tokenizer(lines),
                 "byte": byte_level_tokenizer, "unigram": lambda: train_unigram_tokenizer(lines, vocab_size=200)}[kind]()
    info = describe(CorpusSource(dataset_name="builtin"), TokenizerRecipe(kind=kind), tokenizer,
                    {"train": np.zeros(10), "validation": np.zeros(5)})
    assert info["tokenizer"] == f"{expected}, {len(tokenizer):,} symbols, trained on the training split"


def test_card_counts_validation_tokens_as_its_results_and_loads_the_folder_it_describes(tmp_path):
    from modeling_xl.training import parse_args
    from modeling_xl.training.publishing import model_card

    args = parse_args(["--preset", "debug", "--output_dir", "outputs/tiny"])
    info = {"eval_tokens": 14150, "train_tokens": 200023, "tokenizer": "word level, 8,000 symbols"}
    results = {"eval_loss": 4.6, "perplexity": 104.5, "eval_tokens": 14149}
    card = str(model_card(tmp_path, repo_id="tiny", args=args, results=results, data_info=info, wall_time_s=60.0,
                          hardware="1 x cpu", usage_path="outputs/tiny"))
    assert "- validation tokens: 14,150 (14,149 of them scored: `eval_tokens` under Results)" in card
    assert "| eval_tokens | 14149 |" in card
    assert "- tokenizer: word level, 8,000 symbols" in card
    assert 'from_pretrained("outputs/tiny", trust_remote_code=True)' in card and '"tiny"' not in card
    same = str(model_card(tmp_path, repo_id="someone/tiny-xl", args=args, results={"perplexity": 9.0}, data_info=info,
                          wall_time_s=60.0, hardware="1 x cpu"))
    assert "- validation tokens: 14,150\n" in same and 'from_pretrained("someone/tiny-xl"' in same
