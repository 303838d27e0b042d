"""Spearman rank correlation as an `evaluate` metric module that loads offline.

rho = Pearson correlation of the ranks, tied values taking the mean of the ranks they span (as scipy's `spearmanr`).
Example of ranks: [10, 20, 20, 5] -> [2, 3.5, 3.5, 1].
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Spearman rank correlation between predictions and references (regression)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float): predicted values.
    references (list of float): true values.
Returns:
    spearmanr (float).
Example:
    >>> metric = evaluate.load("modeling_xl/metrics/spearmanr")
    >>> metric.compute(predictions=[1.0, 2.0, 3.0], references=[1.0, 5.0, 9.0])
    {'spearmanr': 1.0}
"""


def average_ranks(values) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of their ranks."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(x, y) -> float:
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denominator) if denominator > 0 else float("nan")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SpearmanR(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation="", inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references):
        return {"spearmanr": spearman(predictions, references)}
