"""F1 of multi-label predictions (one 0/1 row per example) as an `evaluate` metric module that loads offline.

Per class c: F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c) over the examples (0 when the class is never predicted nor true).
micro: one F1 from the counts summed over classes; macro: the mean of F1_c; subset accuracy: the share of examples
whose whole row is right.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Micro, macro and per-class F1 of multi-label predictions, and subset accuracy."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of int): 0/1 per class, one row per example.
    references (list of list of int): 0/1 per class, one row per example.
Returns:
    micro_f1, macro_f1, subset_accuracy (float), per_class_f1 (list of float, one per class).
Example:
    >>> metric = evaluate.load("modeling_xl/metrics/multilabel_f1")
    >>> metric.compute(predictions=[[1, 0], [1, 1]], references=[[1, 0], [0, 1]])["micro_f1"]
    0.8
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MultiLabelF1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation="", inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64")),
                                        "references": datasets.Sequence(datasets.Value("int64"))}),
        )

    def _compute(self, predictions, references):
        p, r = np.asarray(predictions, dtype=bool), np.asarray(references, dtype=bool)
        if p.shape != r.shape or p.ndim != 2:
            raise ValueError(f"predictions have shape {p.shape} and references {r.shape}; expected equal "
                             "[examples, classes] shapes")
        tp, fp, fn = (p & r).sum(0), (p & ~r).sum(0), (~p & r).sum(0)
        denominators = 2 * tp + fp + fn
        per_class = np.where(denominators > 0, 2 * tp / np.maximum(denominators, 1), 0.0)
        total = 2 * tp.sum() + fp.sum() + fn.sum()
        return {"micro_f1": float(2 * tp.sum() / total) if total else 0.0, "macro_f1": float(per_class.mean()),
                "per_class_f1": [float(f) for f in per_class], "subset_accuracy": float((p == r).all(1).mean())}
