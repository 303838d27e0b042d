"""Vectorised whitespace splitting and word-level encoding over Arrow string arrays.

Why: the `tokenizers` WordLevel model builds a full `Encoding` (token strings, offsets, masks) per token; that is
slower than the reference's pure-Python dict lookups. Arrow's C++ kernels
(`utf8_split_whitespace`, `index_in`) do the same split + lookup without per-token Python objects.

`encode_lines` is exact: it produces what the Rust tokenizer produces (tests compare them on WikiText). The fast path
applies only to our word-level shape (WordLevel model, WhitespaceSplit, optional Lowercase, optional `$A <eos>`
template); it steps aside, batch by batch, where semantics could differ:
- characters U+001C..U+001F: Python/Arrow treat them as whitespace, Rust's `char::is_whitespace` does not;
- non-ASCII text under Lowercase (Arrow lowercases per code point, Rust with full Unicode mappings);
- a word that contains an added token without being equal to it (Rust splits added tokens out of running text).
Everything else goes to the tokenizer's own batched `encode_batch_fast`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NOT_RUST_WHITESPACE = "[\x1c-\x1f]"
_RUST_WHITESPACE_RUN = re.compile(r"[^\S\x1c-\x1f]+")


def check_lines(lines, argument: str = "lines") -> None:
    """ValueError when a corpus argument is one string: iterating it would train on its single characters."""
    if isinstance(lines, (str, bytes)):
        raise ValueError(f"{argument} is a single {type(lines).__name__} ({lines[:30]!r}...); expected an iterable "
                         f"of lines, e.g. [{lines[:30]!r}] or text.splitlines()")


def as_string_array(lines: Iterable[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """A non-null Arrow string array (nulls become empty lines)."""
    check_lines(lines)
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    if not isinstance(lines, pa.Array):
        lines = pa.array(lines if isinstance(lines, list) else list(lines), pa.string())
    if pa.types.is_large_string(lines.type):
        lines = lines.cast(pa.string())
    return pc.fill_null(lines, "")


def split_words(lines: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(all words in order, number of words per line), splitting as `tokenizers`' WhitespaceSplit does."""
    if pc.any(pc.match_substring_regex(lines, _NOT_RUST_WHITESPACE)).as_py():
        per_line = [[w for w in _RUST_WHITESPACE_RUN.split(s) if w] for s in lines.to_pylist()]
        split = pa.array(per_line, pa.list_(pa.string()))
        return split.flatten(), np.diff(split.offsets.to_numpy()).astype(np.int64)
    # Arrow yields "" for leading/trailing whitespace and [""] for a blank line: trim first, then drop blank lines
    trimmed = pc.utf8_trim_whitespace(lines)
    nonblank = pc.not_equal(trimmed, "")
    split = pc.utf8_split_whitespace(pc.filter(trimmed, nonblank))
    counts = np.zeros(len(lines), dtype=np.int64)
    counts[nonblank.to_numpy(zero_copy_only=False)] = np.diff(split.offsets.to_numpy())
    return split.flatten(), counts


@dataclass(frozen=True)
class WordLevelPlan:
    """What the fast path needs from a word-level tokenizer."""

    symbols: pa.Array  # symbol of every id, in id order
    unk_id: int
    eos_id: int | None  # appended to every line when the tokenizer's template adds it
    lowercase: bool
    added: tuple[str, ...]  # added-token contents that Rust would split out of running text

    @classmethod
    def from_tokenizer(cls, tokenizer) -> WordLevelPlan | None:
        """The plan, or None when the tokenizer is not of the supported word-level shape."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        spec = json.loads(backend.to_str())
        model, normalizer, post = spec.get("model") or {}, spec.get("normalizer"), spec.get("post_processor")
        if model.get("type") != "WordLevel" or spec.get("pre_tokenizer") != {"type": "WhitespaceSplit"}:
            return None
        if normalizer not in (None, {"type": "Lowercase"}):
            return None
        ids = dict(model["vocab"])
        for added in spec.get("added_tokens", []):
            ids[added["content"]] = added["id"]
        if sorted(ids.values()) != list(range(len(ids))) or model.get("unk_token") not in ids:
            return None
        eos_id = _template_eos(post, ids)
        if eos_id is False:
            return None
        symbols = [None] * len(ids)
        for symbol, index in ids.items():
            symbols[index] = symbol
        added = tuple(a["content"] for a in spec.get("added_tokens", []))
        return cls(pa.array(symbols, pa.string()), ids[model["unk_token"]], eos_id, normalizer is not None, added)

    def encode(self, lines: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
        """(flat int32 ids, tokens per line) or None when this batch must go through the Rust tokenizer."""
        if self.lowercase:
            if pc.all(pc.string_is_ascii(lines)).as_py() is False:
                return None
            lines = pc.utf8_lower(lines)
        words, counts = split_words(lines)
        encoded = pc.dictionary_encode(words)  # one hash pass: indices into the distinct words of this batch
        distinct = encoded.dictionary
        for content in self.added:
            inside = pc.and_(pc.match_substring(distinct, content), pc.not_equal(distinct, content))
            if pc.any(inside).as_py():
                return None
        lookup = pc.fill_null(pc.index_in(distinct, value_set=self.symbols), self.unk_id).to_numpy()
        ids = lookup.astype(np.int32)[encoded.indices.to_numpy()]
        if self.eos_id is None:
            return ids, counts
        return insert_after_each_line(ids, counts, self.eos_id), counts + 1


def _template_eos(post, ids):
    """None: no post-processor; the eos id for `$A <eos>`; False: any other post-processor."""
    if post is None:
        return None
    if post.get("type") != "TemplateProcessing":
        return False
    single = post.get("single", [])
    if (len(single) == 2 and "Sequence" in single[0] and single[0]["Sequence"]["id"] == "A"
            and "SpecialToken" in single[1] and single[1]["SpecialToken"]["id"] in ids):
        return ids[single[1]["SpecialToken"]["id"]]
    return False


def insert_after_each_line(ids: np.ndarray, counts: np.ndarray, token: int) -> np.ndarray:
    """Flat ids with `token` after each line. Example: ids [5, 6, 7], counts [2, 0, 1], token 0 -> [5, 6, 0, 0, 7, 0]."""
    lines = counts.size
    out = np.empty(ids.size + lines, dtype=ids.dtype)
    line_of_word = np.repeat(np.arange(lines), counts)
    out[np.arange(ids.size) + line_of_word] = ids  # each word shifts right by the eos of every earlier line
    out[np.cumsum(counts) + np.arange(lines)] = token
    return out


def encode_lines(lines: Iterable[str] | pa.Array, tokenizer, plan: WordLevelPlan | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 ids, tokens per line) of a batch of texts, special tokens included, exactly as the tokenizer would.

    `plan` (from `WordLevelPlan.from_tokenizer`) enables the Arrow fast path; without it the Rust tokenizer runs.
    """
    lines = as_string_array(lines)
    if plan is not None:
        encoded = plan.encode(lines)
        if encoded is not None:
            return encoded
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    end = line_end_instead_of_template(backend, tokenizer)
    with plain_encoding(backend):
        encodings = backend.encode_batch_fast(lines.to_pylist(), add_special_tokens=end is None)
    counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    flat = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32, count=int(counts.sum()))
    if end is None:
        return flat, counts
    return insert_after_each_line(flat, counts, end), counts + 1


def line_end_instead_of_template(backend, tokenizer) -> int | None:
    """The id that ends each corpus line when the tokenizer's single-text template is a task layout rather than a
    line end: XLNet's `A <sep> <cls>` (the Unigram tokenizer's) becomes `A </s>` in a corpus stream, so a language
    model learns where lines end, not a classification input's layout every line (a word-level `A <eos>` or a
    character-level `A \n` template applies as it is: None). ValueError when such a tokenizer has no end token."""
    post = getattr(backend, "post_processor", None)
    if post is None:
        return None
    template = json.loads(post.__getstate__())
    if template.get("type") != "TemplateProcessing":
        return None
    specials = [piece for piece in template.get("single", []) if "SpecialToken" in piece]
    if len(specials) < 2:  # nothing, or one end token after the text: the template is the line end
        return None
    end = getattr(tokenizer, "eos_token_id", None)
    if end is None:
        raise ValueError(f"the tokenizer's single-text template adds {len(specials)} special tokens (a task layout such "
                         "as XLNet's A <sep> <cls>) and it has no eos_token to end corpus lines with; expected an "
                         "eos_token (the Unigram tokenizer's is </s>)")
    return end


@contextmanager
def plain_encoding(backend):
    """The Rust tokenizer without padding or truncation for the duration (restored after): a corpus stream is every
    token of every line, whatever an earlier `tokenizer(..., padding=True)` call or a saved tokenizer.json left
    switched on (it would pad each batch of lines with <pad> tokens, or cut lines short)."""
    padding, truncation = backend.padding, backend.truncation
    if padding is None and truncation is None:
        yield backend
        return
    backend.no_padding()
    backend.no_truncation()
    try:
        yield backend
    finally:
        if padding is not None:
            backend.enable_padding(**padding)
        if truncation is not None:
            backend.enable_truncation(**truncation)
