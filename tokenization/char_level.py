"""Character-level and byte-level tokenizers (enwik8 / text8 style, evaluated in bits per character).

Both use a BPE model with no merges, which splits text into single symbols. With `newline_at_end=True` every encoded
line ends with the newline symbol, so a line-by-line corpus encodes to the same stream as the raw text
(Transformer-XL's enwik8 keeps the newline byte as an ordinary symbol and adds no `<eos>`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from ._wrapping import wrap_tokenizer
from .arrow_words import check_lines

UNK = "<unk>"


def char_level_tokenizer(chars: list[str], *, unk_token: str = UNK, newline_at_end: bool = True):
    """Tokenizer over exactly these symbols (chars[i] has id i, repeats dropped); `unk_token` and "\\n" are added
    after them when missing. Characters outside the symbols encode as `unk_token`'s id; the text "<unk>" itself is
    five characters (the tokenizer declares no special unknown token, whose text transformers would match)."""
    symbols = list(dict.fromkeys([*chars, unk_token, "\n"]))
    wrong = [c for c in symbols if c != unk_token and (not isinstance(c, str) or len(c) != 1)]
    if wrong:
        raise ValueError(f"chars holds {wrong[:5]!r} ({len(wrong)} in all); expected single characters, a list like "
                         "['a', 'b', ' ']")
    ids = {c: i for i, c in enumerate(symbols)}
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=[], unk_token=unk_token))
    tokenizer.decoder = decoders.Fuse()  # concatenate symbols, no spaces between them
    if newline_at_end:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A \n", pair="$A \n $B \n",
                                                                 special_tokens=[("\n", ids["\n"])])
    # `unk_token` is the BPE model's (characters outside the symbols map to it) but not declared a special token:
    # transformers would match special tokens in the text, so a literal "<unk>" (WikiText has thousands) would become
    # one token instead of five characters, and the stream would no longer be the text.
    return wrap_tokenizer(tokenizer)


def train_char_level_tokenizer(lines: Iterable[str], *, min_freq: int = 1, unk_token: str = UNK,
                               newline_at_end: bool = True):
    """Characters seen at least `min_freq` times, most frequent first (ties by first occurrence)."""
    check_lines(lines)
    counts = Counter()
    for line in lines:
        counts.update(line)
    if not counts:
        raise ValueError("the corpus has no characters; expected at least one non-empty line")
    chars = [c for c, n in counts.most_common() if n >= min_freq]
    return char_level_tokenizer(chars, unk_token=unk_token, newline_at_end=newline_at_end)


def byte_level_tokenizer(*, newline_at_end: bool = True):
    """256 symbols, id = byte value (UTF-8). No unknowns; any text round-trips."""
    alphabet = _bytes_to_symbols()
    ids = {alphabet[b]: b for b in range(256)}
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    if newline_at_end:
        newline = alphabet[ord("\n")]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {newline}", pair=f"$A {newline} $B {newline}", special_tokens=[(newline, ord("\n"))])
    return wrap_tokenizer(tokenizer)


def _bytes_to_symbols() -> dict[int, str]:
    """The printable stand-in the ByteLevel pre-tokenizer uses for each byte (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
