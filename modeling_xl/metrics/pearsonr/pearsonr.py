"""Pearson correlation as an `evaluate` metric module that loads offline: `evaluate.load(path_to_this_folder)`.

r = sum((x - mean x)(y - mean y)) / sqrt(sum((x - mean x)^2) * sum((y - mean y)^2)); NaN when either side is
constant (the correlation is undefined there).
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Pearson correlation between predictions and references (regression)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float): predicted values.
    references (list of float): true values.
Returns:
    pearsonr (float).
Example:
    >>> metric = evaluate.load("modeling_xl/metrics/pearsonr")
    >>> metric.compute(predictions=[1.0, 2.0, 3.0], references=[2.0, 4.0, 7.0])["pearsonr"]  # doctest: +ELLIPSIS
    0.993...
"""


def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denominator) if denominator > 0 else float("nan")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PearsonR(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation="", inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references):
        return {"pearsonr": pearson(predictions, references)}
