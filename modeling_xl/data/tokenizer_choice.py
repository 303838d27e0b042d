"""The tokenizer of a pretraining run (`TokenizerRecipe`): a saved one, or one trained on the training split (word
level, Unigram, character or byte level); what it is, in words, for the card; and the ids the model must accept.
"""

from __future__ import annotations

import json
import logging

from ..runtime.validators import local_folder_hint
from .sources import PLM_SPECIAL_TOKENS, TokenizerRecipe

logger = logging.getLogger(__name__)
COUNT_BATCH = 500_000  # lines counted at a time when training a word-level vocabulary


def load_tokenizer(recipe: TokenizerRecipe, texts=None):
    """The saved tokenizer of `recipe`, else one trained on `texts` (the training split's text column, a pyarrow
    ChunkedArray or a list of lines): word level (reference order, `recipe.word_vocabulary_size` symbols), Unigram
    (`recipe.vocab_size`), character level; the byte-level one needs no texts. With `recipe.plm_tokens`, <sep> and
    <cls> are added (`add_plm_tokens`)."""
    tokenizer = _saved_or_trained(recipe, texts)
    if recipe.plm_tokens:
        add_plm_tokens(tokenizer)
    return tokenizer


def _saved_or_trained(recipe: TokenizerRecipe, texts):
    from transformers import AutoTokenizer

    if recipe.saved is not None:
        try:
            return AutoTokenizer.from_pretrained(recipe.saved)
        except (OSError, ValueError) as error:
            raise ValueError(f"{recipe.saved_argument}={recipe.saved!r} has no loadable tokenizer ({error})"
                             f"{local_folder_hint(recipe.saved)}; expected a folder with tokenizer.json (e.g. written "
                             "by scripts/train_tokenizer.py)") from None
    if recipe.kind == "byte":
        from tokenization.char_level import byte_level_tokenizer

        return byte_level_tokenizer()
    if recipe.kind == "word":
        return word_level_tokenizer_of_size(texts, recipe.word_vocabulary_size)
    lines = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    if recipe.kind == "char":
        from tokenization.char_level import train_char_level_tokenizer

        return train_char_level_tokenizer(lines)
    if recipe.kind == "unigram":  # XLNet's subwords; its <sep> and <cls> serve the permutation LM as they are
        from tokenization.unigram import train_unigram_tokenizer

        return train_unigram_tokenizer(lines, vocab_size=recipe.vocab_size)
    raise ValueError(f"tokenizer_type={recipe.kind!r} is invalid; expected 'word', 'unigram', 'char' or 'byte'")


def add_plm_tokens(tokenizer):
    """<sep> and <cls> (added when the tokenizer lacks them); returns (sep_id, cls_id)."""
    missing = {k: v for k, v in PLM_SPECIAL_TOKENS.items() if getattr(tokenizer, k, None) is None}
    if missing:
        tokenizer.add_special_tokens(missing)
    return tokenizer.sep_token_id, tokenizer.cls_token_id


def tokenizer_vocab_size(tokenizer) -> int:
    """Ids the model must accept: len(tokenizer), or more when the vocabulary has gaps (highest id + 1)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def word_level_tokenizer_of_size(texts, vocab_size: int):
    """Word-level tokenizer (reference order) of exactly `vocab_size` symbols, <eos> and <unk> included (fewer only
    when the corpus has fewer distinct words).

    <unk> is counted once: WikiText contains the literal word <unk>, which then keeps its frequency rank; otherwise it
    is appended after the words. Example, vocab_size 4: "a a a b b <unk> c" -> [<eos>, a, b, <unk>] (<unk> is a word
    of the corpus); "a a b c" -> [<eos>, a, b, <unk>] (c makes room for the appended <unk>).
    """
    from tokenization.word_level import WordCounter

    counter = WordCounter()  # batch by batch: a corpus column larger than memory is never copied whole
    for chunk in (texts.chunks if hasattr(texts, "chunks") else [texts]):
        for start in range(0, len(chunk), COUNT_BATCH):
            counter.update(chunk[start : start + COUNT_BATCH])
    return word_level_tokenizer_from_counts(*counter.result(), vocab_size)


def word_level_tokenizer_from_counts(words, counts, vocab_size: int):
    """`word_level_tokenizer_of_size` from word counts already made (e.g. streamed, `tokenization.WordCounter`).
    A corpus without an uppercase letter gives a tokenizer that lowercases its input (a Lowercase normalizer, saved
    with it): the corpus's own ids are unchanged, and cased text (fine-tuning data, prompts) still finds its words."""
    from tokenization.word_level import build_vocab, has_uppercase, word_level_tokenizer

    if not words:
        raise ValueError("the corpus has no words (empty or whitespace only); expected at least one non-empty line")
    vocab = build_vocab(words, counts, max_size=vocab_size - 1)  # <eos> + words, <unk> among them if the corpus has it
    if len(vocab) > vocab_size:  # <unk> is not among the kept words and was appended: make room for it
        vocab = build_vocab(words, counts, max_size=vocab_size - 2)
    return word_level_tokenizer(vocab, lowercase=not has_uppercase(words))


def is_character_level(tokenizer) -> bool:
    """Whether every token is one character or byte: the char and byte tokenizers of `tokenization.char_level` (a
    BPE model without merges)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    model = json.loads(backend.to_str())["model"]
    return model.get("type") == "BPE" and not model.get("merges")


def tokenizer_kind(tokenizer) -> str:
    """What a tokenizer is, in words, from its `tokenizer.json` model: "word level", "character level", "byte level"
    (the tokenizers of `tokenization`), "Unigram", "BPE", "WordPiece"; else the model type, or the class name."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return type(tokenizer).__name__
    saved = json.loads(backend.to_str())
    model = saved["model"].get("type")
    if is_character_level(tokenizer):
        return "byte level" if (saved.get("decoder") or {}).get("type") == "ByteLevel" else "character level"
    return {"WordLevel": "word level", "BPE": "BPE", "Unigram": "Unigram", "WordPiece": "WordPiece"}.get(
        model, model or type(tokenizer).__name__)
