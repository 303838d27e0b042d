"""Offline `evaluate` metric modules: `evaluate.load(str(METRICS_DIR / "accuracy"))`.

- `accuracy`, `f1` (binary / macro / micro / weighted / per class): single-label classification;
- `multilabel_f1` (micro / macro / per class, subset accuracy): multi-label classification, 0/1 rows;
- `pearsonr`, `spearmanr`: regression;
- `squad`: SQuAD v1.1 exact match and F1 (the official normalisation) for span question answering.
"""

from pathlib import Path

METRICS_DIR = Path(__file__).resolve().parent
