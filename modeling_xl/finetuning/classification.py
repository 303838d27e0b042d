"""Sequence classification as a fine-tuning job (`scripts/finetune_classification.py`): the label space and every
row checked (`data`, `labels`), the problem type's loss, predictions and metrics (`tasks`), the classifier built
from the checkpoint, the classification card (`card`)."""

from __future__ import annotations

import logging

import torch

from .arguments import RESULTS_FILE, FinetuneArguments, validate
from .card import classification_card
from .coverage import SAMPLE_TEXTS
from .data import check_rows, left_pad_collate, load_raw_datasets, tokenize_split
from .job import Job, check_backbone_loaded, model_inputs
from .labels import LabelSpace
from .tasks import TASKS, Task, task_for

logger = logging.getLogger(__name__)


class ClassificationJob(Job):
    """Single-label, multi-label classification and regression of texts, pairs and whole documents."""

    results_file = RESULTS_FILE

    def __init__(self, args: FinetuneArguments):
        super().__init__(args)
        self.labels = self.task = self.targets = None

    @property
    def card_metrics(self):
        return self.task.card_metrics

    def validate(self) -> None:
        validate(self.args)

    def load(self):
        raw = load_raw_datasets(self.args)
        self.labels, self.targets = check_rows(raw, self.args)
        self.task = task_for(self.labels, self.args.threshold)
        return raw

    def coverage_texts(self, train):
        columns = [c for c in (self.args.text_column, self.args.text_pair_column) if c is not None]
        return [t for c in columns for t in train[c][:SAMPLE_TEXTS]]

    def tokenize(self, raw, tokenizer, config):
        keep_types = config.attn_type == "bi" and self.args.text_pair_column is not None
        return tuple(tokenize_split(raw[split], self.targets[split], tokenizer, self.args, keep_types)
                     for split in ("train", "validation"))

    def collate(self, pad_id: int):
        return left_pad_collate(pad_id, self.task.label_dtype)

    def build_model(self, config):
        return build_model(self.args, self.labels, config)

    def evaluate(self, accelerator, model, dev_loader) -> dict:
        return evaluate_model(accelerator, model, dev_loader, self.task, self.args)

    def results_fields(self) -> dict:
        return {"problem_type": self.task.problem_type, "labels": self.labels.names}

    def summary(self, dev: dict) -> str:
        return TASKS[self.task.problem_type].summary(dev)

    def card(self, results, baseline, config):
        return classification_card(self.args, self.task, results, baseline, config)


def build_model(args: FinetuneArguments, labels: LabelSpace, source):
    """The classifier: a causal-LM / permutation-LM checkpoint with a new head (summary and class layer), or with
    `from_scratch` the same architecture randomly initialised. From an earlier classifier the summary is kept, and its
    class layer too when it was trained on the same labels (same names in the same order, same problem type): another
    task (other classes, another number of them) gets a new class layer. `source`: the checkpoint's configuration
    (`_read_config`). `problem_type` is set as transformers defines it."""
    from ..configuration_transformer_xl import TransformerXLConfig
    from ..modeling_classification import TransformerXLForSequenceClassification

    fields = {"id2label": labels.id2label(),  # which sets num_labels (passing both makes transformers warn)
              "label2id": {name: i for i, name in enumerate(labels.names)}, "problem_type": labels.problem_type}
    if args.summary_type is not None:
        fields["summary_type"] = args.summary_type
    if args.from_scratch:
        config = TransformerXLConfig.from_pretrained(args.model_name_or_path, **fields)
        return TransformerXLForSequenceClassification(config)
    classifier = TransformerXLForSequenceClassification.__name__ in (source.architectures or [])
    same_task = classifier and (dict(source.id2label), source.problem_type) == (fields["id2label"],
                                                                                labels.problem_type)
    model, info = TransformerXLForSequenceClassification.from_pretrained(
        args.model_name_or_path, **fields, ignore_mismatched_sizes=classifier, output_loading_info=True)
    check_backbone_loaded(model, info, args.model_name_or_path)
    if classifier and not same_task:
        with torch.no_grad():
            model._init_weights(model.logits_proj)
        logger.info("model_name_or_path=%r is a classifier of other labels (%s, %s): its class layer is new for %s "
                    "(%s); the rest, its sequence summary included, is kept", args.model_name_or_path,
                    list(source.id2label.values()), source.problem_type, labels.names, labels.problem_type)
    return model


@torch.no_grad()
def evaluate_model(accelerator, model, dataloader, task: Task, args=None) -> dict:
    """The task's metrics and `eval_loss` over the whole dev set: predictions, labels and per-example losses are
    gathered from every process (`gather_for_metrics` drops the examples repeated to even out the last batch), so
    every process returns the same numbers."""
    model.eval()
    predictions, references, losses = [], [], []
    for batch in dataloader:
        logits = model(**(batch if args is None else model_inputs(batch, args))).logits
        gathered = accelerator.gather_for_metrics(
            (task.predictions(logits), batch["labels"], task.per_example_loss(logits, batch["labels"])))
        for store, value in zip((predictions, references, losses), gathered):
            store.append(value.cpu())
    model.train()
    metrics = task.metrics(torch.cat(predictions), torch.cat(references))
    return {**metrics, "eval_loss": float(torch.cat(losses).double().mean())}
