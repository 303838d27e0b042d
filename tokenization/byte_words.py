"""Words and lines of raw UTF-8 text, split in numpy: `arrow_words.split_words` over a text file's bytes.

Why: the token-cache build reads a corpus file in chunks of tens of MB. Turning a chunk into a line array and
splitting it with Arrow (`split_words`) trims and copies every line; here one pass over the bytes marks whitespace,
finds where words start and end, and gathers the non-whitespace bytes into one buffer whose offsets are the word
boundaries: an Arrow string array of the words with no per-line work.
It is faster than `split_words` on the generated corpus (`benchmarks/make_corpus.py`; figures in benchmarks/README.md).

Semantics: lines end at "\\n" only (the caller has already turned "\\r\\n" and "\\r" into "\\n", as Python's text
mode does); words are the maximal runs of characters that are not whitespace for `tokenizers`' WhitespaceSplit
(Rust's `char::is_whitespace`, the Unicode White_Space property): the ASCII bytes \\t \\n \\v \\f \\r and space,
and U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. U+001C..U+001F are NOT
whitespace (as in Rust; Python's `str.split` disagrees). That is exactly what `split_words` yields on the same
lines (a test checks every one of these characters, and more, against it).

Example: "a  b\\n\\nc\\u3000d".encode() -> words ["a", "b", "c", "d"], words per line [2, 0, 2].
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


# UTF-8 encodings of the non-ASCII White_Space characters, by length
_SPACE_2 = {0xC2: (0x85, 0xA0)}  # U+0085, U+00A0
_SPACE_3 = {(0xE1, 0x9A): (0x80,),  # U+1680
            (0xE2, 0x80): tuple(range(0x80, 0x8B)) + (0xA8, 0xA9, 0xAF),  # U+2000..U+200A, U+2028, U+2029, U+202F
            (0xE2, 0x81): (0x9F,),  # U+205F
            (0xE3, 0x80): (0x80,)}  # U+3000


def whitespace_mask(data: np.ndarray) -> np.ndarray:
    """Bool per byte of UTF-8 `data` (uint8): whether it belongs to a whitespace character (module docstring)."""
    space = (data == 32) | (data - np.uint8(9) < 5)  # space, or \t \n \v \f \r (9..13; uint8 wraps below 9)
    if data.size == 0 or int(data.max()) < 0x80:
        return space
    for lead, seconds in _SPACE_2.items():
        at = np.flatnonzero(data[:-1] == lead)
        at = at[np.isin(data[at + 1], seconds)]
        space[at] = space[at + 1] = True
    for (lead, second), thirds in _SPACE_3.items():
        at = np.flatnonzero(data[:-2] == lead)
        at = at[(data[at + 1] == second) & np.isin(data[at + 2], thirds)]
        space[at] = space[at + 1] = space[at + 2] = True
    return space


def split_text(text: bytes) -> tuple[pa.Array, np.ndarray]:
    """(every word in order as an Arrow string array, number of words per line) of UTF-8 `text` whose lines end at
    "\\n". A last line without "\\n" counts as a line; an empty `text` has no lines."""
    data = np.frombuffer(text, dtype=np.uint8)
    word = ~whitespace_mask(data)
    edges = np.diff(word.view(np.int8), prepend=np.int8(0), append=np.int8(0))  # +1 where a word starts, -1 after
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    lengths = ends - starts
    if data.size and data.size + 1 > np.iinfo(np.int32).max:
        raise ValueError(f"a text chunk of {data.size:,} bytes is too large; expected at most 2 GiB per chunk")
    offsets = np.zeros(starts.size + 1, dtype=np.int32)
    offsets[1:] = np.cumsum(lengths)
    words = pa.StringArray.from_buffers(starts.size, pa.py_buffer(offsets), pa.py_buffer(np.compress(word, data)))
    newlines = np.flatnonzero(data == 10)
    words_before = np.searchsorted(starts, newlines)  # words that start before each line's end
    per_line = np.diff(words_before, prepend=0)
    if data.size and data[-1] != 10:  # a last line without a newline
        per_line = np.append(per_line, starts.size - (words_before[-1] if words_before.size else 0))
    return words, per_line.astype(np.int64)
