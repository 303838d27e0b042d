"""Word-level tokenizer as in Transformer-XL on WikiText: whitespace split, `<eos>` after every line, `<unk>`.

Reference behaviour (kimiyoung/transformer-xl `pytorch/utils/vocabulary.py`): each line is stripped and split on
whitespace, `<eos>` is appended to every line (an empty line gives just `<eos>`), the vocabulary is the special symbols
followed by the words in decreasing frequency (ties in first-seen order, as `Counter.most_common`), keeping at most
`max_size` words with a count >= `min_freq`. `build_vocab` reproduces that order, so ids equal the reference's ids.
Counting runs in Arrow's C++ kernels (`utf8_split_whitespace`, `value_counts`), see `arrow_words.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ._wrapping import wrap_tokenizer
from .arrow_words import as_string_array, split_words

EOS, UNK = "<eos>", "<unk>"


def count_words(lines: Iterable[str] | pa.Array, *, lowercase: bool = False) -> tuple[list[str], np.ndarray]:
    """(words in first-seen order, their counts) over all lines; one `<eos>` per line is NOT counted here."""
    lines = as_string_array(lines)
    if lowercase:
        lines = lowercase_like_tokenizers(lines)
    words, _ = split_words(lines)
    encoded = pc.dictionary_encode(words)  # dictionary in first-seen order
    counts = np.bincount(encoded.indices.to_numpy(), minlength=len(encoded.dictionary))
    return encoded.dictionary.to_pylist(), counts


class FirstSeenCounts:
    """Merge of (distinct words in first-seen order, counts) pairs made over consecutive parts of a corpus, in part
    order: the words of the whole corpus in first-seen order, with their total counts (what `count_words` gives on
    all the parts at once). First-seen order of the whole = each part's words in its order, skipping words an earlier
    part had, which is the dictionary order of the concatenated parts' word lists: one Arrow `dictionary_encode`
    merges them (no Python loop per word). Parts wait until they hold as many words as the merged list, so each word
    is hashed O(log parts) times.

    Example: add(["b", "a"], [1, 1]), add(["a", "c"], [1, 1]) -> (["b", "a", "c"], [1, 2, 1]).
    """

    def __init__(self):
        self.words = pa.array([], pa.large_string())
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[pa.Array, np.ndarray]] = []
        self._pending_words = 0

    def add(self, words: pa.Array | Sequence[str], counts: np.ndarray) -> None:
        words = words if isinstance(words, pa.Array) else pa.array(list(words), pa.string())
        if len(words) != len(counts):
            raise ValueError(f"{len(words)} words with {len(counts)} counts; expected one count per word")
        self._pending.append((words.cast(pa.large_string()), np.asarray(counts, dtype=np.int64)))
        self._pending_words += len(words)
        if self._pending_words >= max(len(self.words), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        words = pa.concat_arrays([self.words, *(w for w, _ in self._pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self._pending)])
        encoded = pc.dictionary_encode(words)  # dictionary in first-seen order of the concatenation
        # bincount sums in float64: exact for totals below 2**53
        totals = np.rint(np.bincount(encoded.indices.to_numpy(), weights=counts,
                                     minlength=len(encoded.dictionary))).astype(np.int64)
        self.words, self.counts = encoded.dictionary, totals
        self._pending, self._pending_words = [], 0

    def result(self) -> tuple[list[str], np.ndarray]:
        self._merge()
        return self.words.to_pylist(), self.counts.copy()


class WordCounter:
    """`count_words` over a corpus read batch by batch (streamed, larger than memory): memory holds the distinct
    words, not the text. `update(lines)` per batch; `result()` gives exactly what `count_words` gives on all the
    lines at once (words in first-seen order, their counts), so the vocabulary and its ids are the same.

    Example: update(["b a"]), update(["a c"]) -> (["b", "a", "c"], [1, 2, 1]).
    """

    def __init__(self, *, lowercase: bool = False):
        self.lowercase = lowercase
        self._merged = FirstSeenCounts()

    def update(self, lines: Iterable[str] | pa.Array) -> None:
        lines = as_string_array(lines)
        if self.lowercase:
            lines = lowercase_like_tokenizers(lines)
        words, _ = split_words(lines)
        encoded = pc.dictionary_encode(words)  # first-seen order within the batch
        self._merged.add(encoded.dictionary, np.bincount(encoded.indices.to_numpy(),
                                                         minlength=len(encoded.dictionary)))

    def result(self) -> tuple[list[str], np.ndarray]:
        return self._merged.result()


def lowercase_like_tokenizers(lines: pa.Array) -> pa.Array:
    """Lowercase exactly as the `tokenizers` Lowercase normalizer (Arrow's kernel agrees with it on ASCII text)."""
    if pc.all(pc.string_is_ascii(lines)).as_py() is not False:
        return pc.utf8_lower(lines)
    lower = normalizers.Lowercase()
    return pa.array([None if s is None else lower.normalize_str(s) for s in lines.to_pylist()], pa.string())


def has_uppercase(words: Iterable[str] | pa.Array) -> bool:
    """Whether any word changes under lowercasing (as the `tokenizers` Lowercase normalizer lowercases). A
    vocabulary without such a word was trained on lowercase text: its tokenizer should lowercase what it reads, or
    every capitalised word of cased text is unknown (`word_level_tokenizer(..., lowercase=...)`)."""
    words = as_string_array(words)
    return bool(len(words)) and pc.any(pc.not_equal(lowercase_like_tokenizers(words), words)).as_py() is True


def build_vocab(words: Sequence[str], counts: Sequence[int], *, special_tokens: Sequence[str] = (EOS,),
                unk_token: str = UNK, min_freq: int = 0, max_size: int | None = None) -> list[str]:
    """Specials first, then words by decreasing count (stable: ties keep first-seen order); `unk_token` always present.

    `max_size` caps the number of corpus words (specials not counted), as the reference's `most_common(max_size)`.
    Example: words [b, a, c], counts [1, 2, 1], specials [<eos>] -> [<eos>, a, b, c, <unk>] (<unk> absent from corpus).
    """
    if min_freq < 0 or (max_size is not None and max_size < 0):
        raise ValueError(f"min_freq={min_freq}, max_size={max_size}; expected min_freq >= 0 and max_size >= 0 or None")
    order = np.argsort(-np.asarray(counts, dtype=np.int64), kind="stable")
    vocab = list(dict.fromkeys(special_tokens))
    seen = set(vocab)
    kept = 0
    for index in order:
        if counts[index] < min_freq or (max_size is not None and kept >= max_size):
            break
        word = words[index]
        if word not in seen:
            vocab.append(word)
            seen.add(word)
            kept += 1
    if unk_token not in seen:
        vocab.append(unk_token)
    return vocab


def word_level_tokenizer(vocab: Sequence[str], *, unk_token: str = UNK, eos_token: str | None = EOS,
                         add_eos: bool = True, lowercase: bool = False):
    """A transformers fast tokenizer with exactly these ids (vocab[i] has id i).

    `add_eos` appends `eos_token` to every encoded text (one per corpus line, as Transformer-XL). Each word decodes
    with a leading space (`decode` of "the cat" gives " the cat"), so decoded continuations append to their prompt
    string. Padding goes on
    the left (generation continues every row at the same column). The vocabulary has no pad symbol (as the reference's;
    one would change the model's vocabulary size): for `padding=True` set `tokenizer.pad_token = tokenizer.eos_token`
    (`attention_mask` hides the padding). Then label collators that ignore the pad id, such as transformers'
    `DataCollatorForLanguageModeling`, also ignore every `<eos>` target; the project's streams use no padding.
    """
    if len(set(vocab)) != len(vocab):
        raise ValueError(f"vocab has {len(vocab) - len(set(vocab))} duplicate entries; expected unique symbols")
    if unk_token not in vocab:
        raise ValueError(f"unk_token={unk_token!r} is not in the vocabulary; expected it among the {len(vocab)} symbols")
    if add_eos and (eos_token is None or eos_token not in vocab):
        raise ValueError(f"add_eos=True needs eos_token={eos_token!r} in the vocabulary")
    ids = {symbol: i for i, symbol in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab=ids, unk_token=unk_token))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # every word decodes with the space before it (as GPT-2's byte-level words and WikiText's lines, which start with
    # a space): the ids of a continuation then decode to text that appends to its prompt, as pipeline("text-generation")
    # and TextStreamer do (without it, "the market" + "of the" reads "the marketof the")
    tokenizer.decoder = decoders.Replace(Regex("^"), " ")
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    if add_eos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {eos_token}", pair=f"$A {eos_token} $B {eos_token}", special_tokens=[(eos_token, ids[eos_token])])
    specials = {"unk_token": unk_token, "padding_side": "left"}
    if eos_token is not None:
        specials["eos_token"] = eos_token
    return wrap_tokenizer(tokenizer, **specials)


def train_word_level_tokenizer(lines: Iterable[str] | pa.Array, *, min_freq: int = 0, max_size: int | None = None,
                               lowercase: bool | None = None, special_tokens: Sequence[str] = (EOS,),
                               unk_token: str = UNK, eos_token: str = EOS, add_eos: bool = True):
    """Count `lines` (a corpus, one text per line), build the reference-ordered vocabulary, return the tokenizer.

    Lines from several splits may be chained (the reference counts train, valid and test for WikiText).
    `lowercase`: True lowercases the corpus and the tokenizer's input; None (default) lowercases the input only when
    the corpus has no uppercase letter (the ids are then the same, and cased text still finds its words); False never.
    """
    words, counts = count_words(lines, lowercase=bool(lowercase))
    if not words:
        raise ValueError("the corpus has no words (empty or whitespace only); expected at least one non-empty line")
    vocab = build_vocab(words, counts, special_tokens=special_tokens, unk_token=unk_token, min_freq=min_freq,
                        max_size=max_size)
    if lowercase is None:
        lowercase = not has_uppercase(words)
    return word_level_tokenizer(vocab, unk_token=unk_token, eos_token=eos_token, add_eos=add_eos, lowercase=lowercase)
