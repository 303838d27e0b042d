"""Offline `evaluate` metric modules (accuracy, f1): `evaluate.load(str(METRICS_DIR / "accuracy"))`."""

from pathlib import Path

METRICS_DIR = Path(__file__).resolve().parent
