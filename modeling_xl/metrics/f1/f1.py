"""F1 score as an `evaluate` metric module that loads offline: `evaluate.load(path_to_this_folder)`.

F1 = 2 * precision * recall / (precision + recall) per class, with precision = TP / (TP + FP) and
recall = TP / (TP + FN) (0 when a denominator is 0). `average`: "binary" (the `pos_label` class), "macro" (unweighted
mean over classes), "micro" (from the summed counts) or "weighted" (mean weighted by class support).
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Harmonic mean of precision and recall (binary, macro, micro or weighted over classes)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
    average (str): "binary" (default), "macro", "micro", "weighted", or None (one F1 per class of `labels`).
    pos_label (int): the positive class for average="binary" (default 1).
    labels (list of int): the classes to average over (default: every class in predictions or references).
Returns:
    f1 (float; a list of floats in the order of `labels` with average=None).
Example:
    >>> metric = evaluate.load("modeling_xl/metrics/f1")
    >>> metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])
    {'f1': 0.6666666666666666}
"""


def _class_f1(predictions, references, label):
    tp = float(((predictions == label) & (references == label)).sum())
    fp = float(((predictions == label) & (references != label)).sum())
    fn = float(((predictions != label) & (references == label)).sum())
    return (2 * tp / (2 * tp + fp + fn) if tp else 0.0), tp, fp, fn


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"),
                                        "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, average="binary", pos_label=1, labels=None):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if average == "binary":
            return {"f1": _class_f1(predictions, references, pos_label)[0]}
        classes = sorted(set(predictions.tolist()) | set(references.tolist())) if labels is None else list(labels)
        per_class = [_class_f1(predictions, references, c) for c in classes]
        if average is None:
            return {"f1": [float(f) for f, *_ in per_class]}
        if average == "macro":
            return {"f1": float(np.mean([f for f, *_ in per_class]))}
        if average == "micro":
            tp, fp, fn = (sum(x[i] for x in per_class) for i in (1, 2, 3))
            return {"f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0}
        if average == "weighted":
            support = np.array([(references == c).sum() for c in classes], dtype=float)
            return {"f1": float((np.array([f for f, *_ in per_class]) * support).sum() / max(support.sum(), 1.0))}
        raise ValueError(f"average={average!r} is invalid; expected 'binary', 'macro', 'micro', 'weighted' or None")
