"""SQuAD v1.1 exact match and F1 as an `evaluate` metric module that loads offline: `evaluate.load(<this folder>)`.

The official v1.1 evaluation: an answer is normalised (lowercased; punctuation removed; the articles a, an, the
removed; whitespace collapsed); exact match is 1 when the normalised prediction equals a normalised gold answer; F1 is
the harmonic mean of precision and recall over the normalised words in common (a multiset); each question takes its
best gold answer; both are averaged over the questions and reported x 100. A question without a prediction scores 0.
Inputs as the Hub's `squad` metric: predictions [{"id", "prediction_text"}], references [{"id", "answers": {"text":
[...], "answer_start": [...]}}].
"""

import re
import string
from collections import Counter

import datasets
import evaluate

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles, collapse whitespace (in that order, as the official script)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def squad_v1(predictions: dict[str, str], references: list[dict]) -> dict[str, float]:
    """{"exact_match", "f1"} x 100 over `references` ({"id", "answers": {"text": [...]}}); `predictions` by id."""
    em = f1 = 0.0
    for reference in references:
        golds = list(reference["answers"]["text"]) or [""]
        prediction = predictions.get(reference["id"])
        if prediction is None:
            continue
        em += max(exact_match(prediction, gold) for gold in golds)
        f1 += max(token_f1(prediction, gold) for gold in golds)
    total = max(len(references), 1)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


class Squad(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__.split("\n")[0],
            citation="Rajpurkar et al. 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text.",
            inputs_description="predictions: [{id, prediction_text}]; references: [{id, answers: {text, answer_start}}]",
            features=datasets.Features({
                "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                "references": {"id": datasets.Value("string"),
                               "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                             "answer_start": datasets.Value("int32")})},
            }),
        )

    def _compute(self, predictions, references):
        return squad_v1({p["id"]: p["prediction_text"] for p in predictions}, references)
