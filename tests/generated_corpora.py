"""Small deterministic corpora that the tests make themselves, so a clone with nothing beside it runs every pipeline,
script and training test (the real corpora in `../shared/data` are only needed by tests of their exact figures).

Two shapes, both from a fixed seed with `random.Random` (the same text on every Python version and platform):
- `wikitext_lines`: word-level lines as WikiText writes them (a leading space, ` = Heading = ` lines, empty lines,
  punctuation split off, `@-@` inside hyphenated words, the literal word `<unk>`); `write_wikitext_folder` writes
  `train.txt` / `valid.txt` / `test.txt`.
- `play_text`: character-level prose in the layout of tiny-shakespeare (`SPEAKER:` then the speech, a blank line).

The text comes from a small grammar over a Zipf-weighted vocabulary (function words plus ~900 generated words), so it
has the structure a language model learns quickly (determiners before nouns, verbs after subjects) and enough types
for vocabulary-size tests (more than 500 distinct words in 3,000 lines).
"""

from __future__ import annotations

import random
from functools import lru_cache
from itertools import accumulate
from pathlib import Path

SYLLABLES = ("ba", "ce", "di", "fo", "gu", "ha", "ke", "li", "mo", "nu", "pa", "re", "si", "to", "va", "we", "xi",
             "yo", "za", "bro", "cla", "dre", "fli", "gro", "pla", "sta", "tri", "ven", "mar", "tor", "lin", "sen")
DETERMINERS = ("the", "a", "this", "every", "its", "their")
PREPOSITIONS = ("of", "in", "on", "with", "from", "after", "under", "for")
CONJUNCTIONS = ("and", "but", "while", "because")


def _vocabulary(seed: int) -> dict[str, list[str]]:
    """Word classes of generated words (two or three syllables; nouns, verbs, adjectives, capitalised names)."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))) for _ in range(1200)})
    rng.shuffle(words)
    nouns, verbs, adjectives, names = words[:450], words[450:700], words[700:850], words[850:950]
    return {"noun": nouns, "verb": [v + "s" for v in verbs], "adjective": adjectives,
            "name": [n.capitalize() for n in names]}


class _Grammar:
    """Sentences `subject verb object [preposition object] [conjunction clause] .` with Zipf-weighted word choice."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.words = _vocabulary(seed)
        self.cumulative = {kind: list(accumulate(1.0 / (rank + 1) for rank in range(len(words))))
                           for kind, words in self.words.items()}

    def word(self, kind: str) -> str:
        return self.rng.choices(self.words[kind], cum_weights=self.cumulative[kind])[0]

    def noun_phrase(self) -> list[str]:
        if self.rng.random() < 0.2:
            return [self.word("name")]
        phrase = [self.rng.choice(DETERMINERS)]
        if self.rng.random() < 0.4:
            phrase.append(self.word("adjective"))
        return phrase + [self.word("noun")]

    def clause(self) -> list[str]:
        words = self.noun_phrase() + [self.word("verb")] + self.noun_phrase()
        if self.rng.random() < 0.5:
            words += [self.rng.choice(PREPOSITIONS)] + self.noun_phrase()
        return words

    def sentence(self) -> list[str]:
        words = self.clause()
        if self.rng.random() < 0.3:
            words += [",", self.rng.choice(CONJUNCTIONS)] + self.clause()
        words[0] = words[0].capitalize()
        return words + ["."]


def wikitext_lines(num_lines: int, seed: int = 0) -> list[str]:
    """`num_lines` lines in WikiText's layout: headings and paragraphs, each followed by an empty line."""
    grammar, lines = _Grammar(seed), [""]
    while len(lines) < num_lines:
        if grammar.rng.random() < 0.1:
            lines += [f" = {grammar.word('name')} {grammar.word('noun')} = ", ""]
            continue
        words = []
        for _ in range(grammar.rng.randint(2, 6)):
            words += grammar.sentence()
        for i, word in enumerate(words):
            roll = grammar.rng.random()
            if roll < 0.03:
                words[i] = "<unk>"
            elif roll < 0.04 and word.isalpha():
                words[i] = f"{word} @-@ {grammar.word('noun')}"
        lines += [" " + " ".join(words) + " ", ""]
    return lines[:num_lines]


def write_wikitext_folder(folder: Path, train_lines: int = 3000, seed: int = 0) -> Path:
    """A corpus folder as WikiText ships it: `train.txt`, `valid.txt` and `test.txt` (one tenth of train each)."""
    folder.mkdir(parents=True, exist_ok=True)
    for offset, (split, size) in enumerate((("train", train_lines), ("valid", train_lines // 10),
                                            ("test", train_lines // 10))):
        (folder / f"{split}.txt").write_text("\n".join(wikitext_lines(size, seed + offset)) + "\n", encoding="utf-8")
    return folder


@lru_cache(maxsize=8)
def play_text(num_chars: int = 40_000, seed: int = 0) -> str:
    """At least `num_chars` characters of speeches, `SPEAKER:` on its own line, then one to four lines of prose."""
    grammar, parts, size = _Grammar(seed), [], 0
    speakers = [grammar.word("name").upper() for _ in range(8)]
    while size < num_chars:
        speech = [grammar.rng.choice(speakers) + ":"]
        for _ in range(grammar.rng.randint(1, 4)):
            speech.append(" ".join(grammar.sentence()).replace(" ,", ",").replace(" .", "."))
        parts.append("\n".join(speech) + "\n\n")
        size += len(parts[-1])
    return "".join(parts)
