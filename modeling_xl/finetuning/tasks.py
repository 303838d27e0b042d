"""What each problem type computes, the way pretraining's `Objective` does: the per-example loss, the predictions,
the metrics (offline `evaluate` modules of `modeling_xl/metrics`) and the fields the model card shows.

| problem type | loss (per example) | predictions | metrics |
|---|---|---|---|
| single_label_classification | cross-entropy | argmax | accuracy, macro / per-class F1 (2 classes: F1 of id 1) |
| multi_label_classification | BCE, mean over classes | sigmoid > threshold | micro / macro / per-class F1, subset accuracy |
| regression | squared error | the output | MSE, Pearson, Spearman |

The mean of the per-example losses is the model's own loss (transformers' conventions, `classification_loss`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..metrics import METRICS_DIR
from .labels import LabelSpace


class MetricError(RuntimeError):
    """A metric failed after training; the message names the metric and where the weights are."""


def compute_metric(name: str, **inputs) -> dict:
    """One offline metric module; any failure becomes a MetricError naming it."""
    import evaluate

    try:
        return evaluate.load(str(METRICS_DIR / name)).compute(**inputs)
    except Exception as error:
        raise MetricError(f"metric {name!r} failed: {type(error).__name__}: {error}") from error


@dataclass
class Task(ABC):
    labels: LabelSpace
    threshold: float = 0.5

    problem_type = ""
    label_dtype = torch.long
    card_metrics: ClassVar[tuple] = ()  # (results key, model-index metric type, column title) shown in the card

    @property
    def num_labels(self) -> int:
        return self.labels.num_labels

    @abstractmethod
    def per_example_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """See the table in the module docstring."""

    @abstractmethod
    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """See the table in the module docstring."""

    @abstractmethod
    def metrics(self, predictions: torch.Tensor, references: torch.Tensor) -> dict:
        """See the table in the module docstring."""

    @classmethod
    def summary(cls, dev: dict) -> str:
        """The dev scores in one line, headline metrics first."""
        return ", ".join(f"{title} {dev[key]:.4f}" for key, _, title in cls.card_metrics) + (
            f", loss {dev['eval_loss']:.4f}")


class SingleLabelTask(Task):
    problem_type = "single_label_classification"
    card_metrics = (("accuracy", "accuracy", "accuracy"), ("macro_f1", "f1", "macro F1"))

    def per_example_loss(self, logits, labels):
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def predictions(self, logits):
        return logits.argmax(-1)

    def metrics(self, predictions, references):
        p, r = predictions.tolist(), references.tolist()
        classes = list(range(self.num_labels))
        out = {"accuracy": compute_metric("accuracy", predictions=p, references=r)["accuracy"],
               "macro_f1": compute_metric("f1", predictions=p, references=r, average="macro", labels=classes)["f1"]}
        if self.num_labels == 2:  # GLUE's F1: of the class with id 1
            out["f1"] = compute_metric("f1", predictions=p, references=r, average="binary", pos_label=1)["f1"]
        per_class = compute_metric("f1", predictions=p, references=r, average=None, labels=classes)["f1"]
        out["per_class_f1"] = dict(zip(self.labels.names, per_class))
        return out


class MultiLabelTask(Task):
    problem_type = "multi_label_classification"
    label_dtype = torch.float
    card_metrics = (("micro_f1", "f1", "micro F1"), ("macro_f1", "f1", "macro F1"))

    def per_example_loss(self, logits, labels):
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none").mean(-1)

    def predictions(self, logits):
        return (torch.sigmoid(logits.float()) > self.threshold).long()

    def metrics(self, predictions, references):
        out = compute_metric("multilabel_f1", predictions=predictions.tolist(), references=references.long().tolist())
        out["per_class_f1"] = dict(zip(self.labels.names, out["per_class_f1"]))
        out["threshold"] = self.threshold
        return out


class RegressionTask(Task):
    problem_type = "regression"
    label_dtype = torch.float
    card_metrics = (("pearsonr", "pearsonr", "Pearson"), ("spearmanr", "spearmanr", "Spearman"), ("mse", "mse", "MSE"))

    def per_example_loss(self, logits, labels):
        return (logits.float().squeeze(-1) - labels.float()) ** 2

    def predictions(self, logits):
        return logits.float().squeeze(-1)

    def metrics(self, predictions, references):
        p, r = predictions.tolist(), references.tolist()
        return {"pearsonr": compute_metric("pearsonr", predictions=p, references=r)["pearsonr"],
                "spearmanr": compute_metric("spearmanr", predictions=p, references=r)["spearmanr"],
                "mse": float(((predictions.double() - references.double()) ** 2).mean())}


TASKS = {task.problem_type: task for task in (SingleLabelTask, MultiLabelTask, RegressionTask)}


def task_for(labels: LabelSpace, threshold: float = 0.5) -> Task:
    return TASKS[labels.problem_type](labels, threshold)
