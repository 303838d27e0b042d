"""What the tokenizer does to the user's text before fine-tuning.

A word-level tokenizer trained on one corpus turns the words it never saw into `<unk>`: on cased text from elsewhere
a large share of the tokens, which costs the fine-tuned model its input (docs/finetuning.md measures how much). `unknown_token_report` measures the share of the training texts' tokens that become the unknown token, and
names the likely cause:
- case: the texts hold uppercase letters the tokenizer does not fold, and lowercasing them cuts the share by half;
- characters: most unknown words hold a character that no token of the vocabulary contains;
- vocabulary coverage: otherwise (the words themselves are missing), with the most frequent unknown words.
`check_unknown_share` warns above `WARN_SHARE` and stops above `STOP_SHARE` unless asked to continue; the share goes
into the results and the model card.
"""

from __future__ import annotations

import logging
from collections import Counter

logger = logging.getLogger(__name__)

WARN_SHARE = 0.10
STOP_SHARE = 0.50
SAMPLE_TEXTS = 2000  # the first texts of the training split are measured (tokenizing all of a large set costs time)


def _unknown_words(tokenizer, texts: list[str]) -> tuple[int, list[str]]:
    """(tokens, the source text of every unknown token) over `texts`, special tokens excluded."""
    unk_id = tokenizer.unk_token_id
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    total, unknown = 0, []
    for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
        total += len(ids)
        unknown += [text[start:end] for i, (start, end) in zip(ids, offsets) if i == unk_id]
    return total, unknown


def unknown_token_report(tokenizer, texts: list[str]) -> dict | None:
    """{"share", "lowercase_share", "cause", "examples"} for the first `SAMPLE_TEXTS` of `texts`; None when the
    tokenizer has no unknown token (byte-level, or one without `unk_token`) or the texts have no token."""
    if tokenizer.unk_token_id is None or not getattr(tokenizer, "is_fast", False):
        return None
    texts = [str(t) for t in texts[:SAMPLE_TEXTS]]
    total, unknown = _unknown_words(tokenizer, texts)
    if total == 0:
        return None
    share = len(unknown) / total
    report = {"share": share, "lowercase_share": None, "cause": None, "examples": []}
    if not unknown:
        return report
    lowered = [t.lower() for t in texts]
    if lowered != texts:
        lower_total, lower_unknown = _unknown_words(tokenizer, lowered)
        report["lowercase_share"] = len(lower_unknown) / max(lower_total, 1)
    known_chars = set("".join(tokenizer.get_vocab()))
    novel = [w for w in unknown if any(c not in known_chars for c in w)]
    if report["lowercase_share"] is not None and report["lowercase_share"] <= share / 2:
        report["cause"] = (f"case: the texts are cased and the tokenizer does not lowercase; lowercasing them gives "
                           f"{report['lowercase_share']:.1%} unknown")
    elif len(novel) > len(unknown) / 2:
        chars = Counter(c for w in novel for c in w if c not in known_chars)
        report["cause"] = ("characters the tokenizer never saw: " + ", ".join(repr(c) for c, _ in chars.most_common(5))
                           + f" ({len(novel) / len(unknown):.0%} of the unknown words hold one)")
    else:
        report["cause"] = "vocabulary coverage: the words themselves are not in the tokenizer's vocabulary"
    report["examples"] = [w for w, _ in Counter(unknown).most_common(8)]
    return report


def check_unknown_share(report: dict | None, unk_token: str | None, allow: bool) -> None:
    """Warn above `WARN_SHARE`; raise ValueError above `STOP_SHARE` unless `allow` (--allow_unknown_tokens)."""
    if report is None or report["share"] <= WARN_SHARE:
        return
    what = (f"{report['share']:.1%} of the training texts' tokens are the tokenizer's unknown token {unk_token!r} "
            f"(likely cause: {report['cause']}; most frequent: {', '.join(map(repr, report['examples'][:5]))})")
    advice = ("fine-tuning sees none of those words: lowercase the texts, or use a tokenizer (and model) trained on "
              "text like yours (scripts/train_tokenizer.py)")
    if report["share"] > STOP_SHARE and not allow:
        raise ValueError(f"{what}; expected at most {STOP_SHARE:.0%}: {advice}, or pass --allow_unknown_tokens to "
                         "fine-tune anyway")
    logger.warning("%s: %s", what, advice)
