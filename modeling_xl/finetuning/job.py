"""What one fine-tuning task gives the shared loop (`loop.run_job`): a `Job`.

The loop owns everything tasks share (argument checks common to all, the output folder's lock and guards, the
tokenizer and its `<unk>` check, Accelerate, the optimizer and schedule, checkpoints and their exact resume, the step
log, saving the model before anything that could fail). A job owns what differs: its arguments' checks, reading and
checking its rows, tokenization and collate, the head, the dev metrics, and the records (results file and card).

| job | script | head | dev metrics |
|---|---|---|---|
| `classification.ClassificationJob` | finetune_classification.py | sequence classification | per problem type |
| `question_answering.QuestionAnsweringJob` | finetune_question_answering.py | start/end logits | SQuAD v1.1 EM / F1 |
| `token_classification.TokenClassificationJob` | finetune_token_classification.py | a tag per token | entity F1 |
| `multiple_choice.MultipleChoiceJob` | finetune_multiple_choice.py | a score per choice | accuracy |
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import datasets
import torch

from ..runtime.run_folder import replace_text

logger = logging.getLogger(__name__)


class Job(ABC):
    """One fine-tuning task for `loop.run_job`. `args` is the task's arguments dataclass (a `CommonArguments`)."""

    results_file: ClassVar[str]
    card_metrics: ClassVar[tuple] = ()  # (dev key, model-index metric type, column title), headline first

    def __init__(self, args):
        self.args = args

    @abstractmethod
    def validate(self) -> None:
        """Argument checks (`arguments.validate_common` and the task's own): ValueError naming argument and value."""

    @abstractmethod
    def load(self) -> datasets.DatasetDict:
        """{"train", "validation"}, every row checked: ValueError naming file, row, column and what was expected."""

    @abstractmethod
    def coverage_texts(self, train: datasets.Dataset) -> list[str]:
        """The training texts whose `<unk>` share is measured before training (`coverage`)."""

    @abstractmethod
    def tokenize(self, raw: datasets.DatasetDict, tokenizer, config) -> tuple[datasets.Dataset, datasets.Dataset]:
        """(train, dev) features; the dev features' bookkeeping (which example, which characters) stays in the job."""

    @abstractmethod
    def collate(self, pad_id: int):
        """The DataLoader's collate_fn (the same for train and dev)."""

    @abstractmethod
    def build_model(self, config):
        """The head on the pretrained backbone (`load_head`), or randomly initialised with `args.from_scratch`."""

    @abstractmethod
    def evaluate(self, accelerator, model, dev_loader) -> dict:
        """The dev metrics and `eval_loss`, the same on every process."""

    def results_fields(self) -> dict:
        """Task fields of the results file (label names, the layout chosen, ...)."""
        return {}

    @abstractmethod
    def card(self, results: dict, baseline: dict | None, config):
        """The model card (`huggingface_hub.ModelCard`)."""

    def summary(self, dev: dict) -> str:
        """The dev scores in one line, headline metrics first."""
        return ", ".join(f"{title} {dev[key]:.4f}" for key, _, title in self.card_metrics if key in dev) + (
            f", loss {dev['eval_loss']:.4f}")

    def save_records(self, results: dict, config) -> None:
        """The results file, then the model card (with `compare_with`, that run's dev scores beside these)."""
        from .arguments import compare_results_path

        out = Path(self.args.output_dir)
        replace_text(out / self.results_file, json.dumps(results, indent=2, default=str) + "\n")
        baseline = None
        if self.args.compare_with is not None:
            baseline = json.loads(compare_results_path(self.args.compare_with, self.results_file).read_text())
        replace_text(out / "README.md", str(self.card(results, baseline, config)))


def model_inputs(batch: dict, args) -> dict:
    """The batch as the model's keyword arguments (`segment_len` reads long documents with memory; a classifier's
    memory keeps its gradient unless `detach_memory`)."""
    if not getattr(args, "long_document", False):
        return batch
    return {**batch, "segment_len": args.max_length, **({"detach_memory": True} if getattr(args, "detach_memory", False)
                                                        else {})}


def load_head(model_class, args, fields: dict):
    """`model_class` on the checkpoint's backbone (a head of the same class is kept where its shapes fit, replaced
    where not), or with `args.from_scratch` randomly initialised; a backbone left MISSING by loading is refused
    (`check_backbone_loaded`)."""
    from ..configuration_transformer_xl import TransformerXLConfig

    if args.from_scratch:
        return model_class(TransformerXLConfig.from_pretrained(args.model_name_or_path, **fields))
    model, info = model_class.from_pretrained(args.model_name_or_path, **fields, ignore_mismatched_sizes=True,
                                              output_loading_info=True)
    check_backbone_loaded(model, info, args.model_name_or_path)
    new = sorted({key.split(".")[0] for key in (*info.get("missing_keys", ()), *(k for k, *_ in
                  info.get("mismatched_keys", ())))})
    if new:
        logger.info("%s: new head weights (%s) on the backbone of %s", model_class.__name__, ", ".join(new),
                    args.model_name_or_path)
    return model


def check_backbone_loaded(model, loading_info: dict, source: str) -> None:
    """ValueError naming `source` when any backbone weight came out of loading MISSING (newly initialised): a
    fine-tuning run from such a backbone would train and report from random weights. A new head is expected."""
    backbone = [name for name in loading_info.get("missing_keys", ()) if name.startswith("transformer.")]
    if backbone:
        total = sum(1 for name, _ in model.named_parameters() if name.startswith("transformer."))
        raise ValueError(f"model_name_or_path={source!r}: {len(backbone)} of the backbone's {total} weights are "
                         f"missing from the checkpoint (first: {sorted(backbone)[:3]}); expected a checkpoint of this "
                         "architecture: a folder written by save_pretrained, a legacy Transformer-XL folder or a "
                         "transformers XLNet folder (both converted), or --from_scratch for random weights")


def gather_padded(accelerator, tensor: torch.Tensor, pad_value) -> torch.Tensor:
    """`tensor` [B, ...] of every process on the CPU, dim 1 padded to the widest process's (batches of different
    widths cannot be concatenated otherwise), the examples repeated to even out the last batch dropped."""
    if tensor.dim() > 1:
        tensor = accelerator.pad_across_processes(tensor, dim=1, pad_index=pad_value)
    return accelerator.gather_for_metrics(tensor).cpu()


def pad_width(rows: list[torch.Tensor], pad_value) -> torch.Tensor:
    """Rows [B_i, T_i, ...] from several batches as one tensor [sum B_i, max T_i, ...], right-padded with
    `pad_value`."""
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, 0) * (r.dim() - 2) + (0, width - r.shape[1]), value=pad_value)
                      for r in rows])
