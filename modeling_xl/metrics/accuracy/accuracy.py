"""Accuracy as an `evaluate` metric module that loads offline: `evaluate.load(path_to_this_folder)`.

The Hub's `evaluate.load("accuracy")` needs the network; this module computes the same quantity locally:
accuracy = (number of predictions equal to their reference) / (number of predictions), optionally weighted.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Fraction of predictions equal to their reference (weighted by sample_weight when given)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
    normalize (bool): return the fraction (True, default) or the number of correct predictions.
    sample_weight (list of float): optional weight per sample.
Returns:
    accuracy (float).
Example:
    >>> metric = evaluate.load("modeling_xl/metrics/accuracy")
    >>> metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])
    {'accuracy': 0.75}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"),
                                        "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if predictions.shape != references.shape:
            raise ValueError(f"predictions has {predictions.shape[0]} items and references {references.shape[0]}; "
                             "expected the same number")
        weights = np.ones(len(predictions)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        correct = float(((predictions == references) * weights).sum())
        return {"accuracy": correct / float(weights.sum()) if normalize else correct}
