"""Multiple choice as a fine-tuning job (`scripts/finetune_multiple_choice.py`): ARC, RACE, SWAG-like questions.

Rows: a question, a list of choices (any number from 2; questions of one dataset may have different numbers; or the
Hub's ARC layout {"text": [...], "label": [keys]}) and the label: the right choice's index (from 0), key, text,
digit string or letter ("A" the first), read in the order `label_index` gives. An optional context
(`--context_column`, RACE's passage) is read first: `context <sep> question choice <sep>`, only the passage cut when
the pair exceeds `max_length`. Without a context each choice is read as a pair `question <sep> choice <sep>` (the
longer of the two cut first when the pair exceeds `max_length`) and scored from its last token; a batch holds
[B, C, L] with
left padding, and a question with fewer choices than the batch's most has all-zero attention rows for the rest,
which the head never reads and scores with the dtype's minimum (`TransformerXLForMultipleChoice`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import datasets
import torch
import torch.nn.functional as F

from .arguments import TASK_RESULTS_FILES, CommonArguments, validate_task
from .coverage import SAMPLE_TEXTS
from .data import load_raw_datasets, padded, row_namer
from .job import Job, gather_padded, load_head

RESULTS_FILE = TASK_RESULTS_FILES["multiple-choice"]


@dataclass
class MultipleChoiceArguments(CommonArguments):
    """Everything a multiple-choice run needs."""

    max_length: int = field(default=128, metadata={"help": "tokens per (question, choice) pair"})
    question_column: str = "question"
    choices_column: str = field(default="choices", metadata={"help": "column holding each row's list of choices"})
    label_column: str = field(default="label", metadata={"help": "the right choice: its index, letter or text"})
    context_column: str | None = field(default=None, metadata={"help": "a passage read before the question"})


def label_index(label, choices: list[str], keys: list[str] | None = None) -> int | None:
    """The index `label` names among `choices`, read in this order: an integer is an index (from 0); a string is one
    of the choices' own keys (`keys`: the Hub's ARC keys its choices "A".."E" or "1".."5"), else one of the choices'
    texts, else a digit string (an index from 0), else a letter A.. (A the first choice). None when it names none."""
    if isinstance(label, bool):
        return None
    if isinstance(label, int):
        return label if 0 <= label < len(choices) else None
    if not isinstance(label, str):
        return None
    text = label.strip()
    for names in (keys or [], choices):
        if text in names:
            return list(names).index(text)
    if text.isdigit():
        return label_index(int(text), choices)
    if len(text) == 1 and text.isalpha() and 0 <= ord(text.upper()) - ord("A") < len(choices):
        return ord(text.upper()) - ord("A")
    return None


class MultipleChoiceJob(Job):
    """One score per choice with `TransformerXLForMultipleChoice`; accuracy."""

    results_file = RESULTS_FILE
    card_metrics = (("accuracy", "accuracy", "accuracy"),)

    def __init__(self, args: MultipleChoiceArguments):
        super().__init__(args)
        self.targets: dict[str, list[int]] = {}
        self.choice_counts: dict[str, dict[int, int]] = {}

    def validate(self) -> None:
        validate_task(self.args, RESULTS_FILE, "ai2_arc")

    def load(self) -> datasets.DatasetDict:
        args = self.args
        raw = load_raw_datasets(args)
        names = [("question_column", args.question_column), ("choices_column", args.choices_column),
                 ("label_column", args.label_column)]
        if args.context_column is not None:
            names.append(("context_column", args.context_column))
        for split, data in raw.items():
            for name, column in names:
                if column not in data.column_names:
                    raise ValueError(f"{name}={column!r} is not a column of the {split} split; expected one of "
                                     f"{data.column_names}")
            # ARC on the Hub: {"text": [...], "label": [...]}
            keyed = isinstance(data.features[args.choices_column], dict)
            targets, counts = [], {}
            for row, example in enumerate(data.select_columns([c for _, c in names])):
                where = row_namer(args, args.question_column)(split, row + 1)
                question, choices = example[args.question_column], example[args.choices_column]
                keys = None
                if keyed:
                    choices, keys = choices.get("text"), [str(k) for k in (choices.get("label") or [])]
                if not isinstance(question, str) or not question.strip():
                    raise ValueError(f"{where}: {question!r} is empty; expected a non-empty question")
                if (not isinstance(choices, list) or len(choices) < 2
                        or not all(isinstance(c, str) and c.strip() for c in choices)):
                    raise ValueError(f"{row_namer(args, args.choices_column)(split, row + 1)}: {choices!r}; expected a "
                                     "list of at least 2 non-empty choices")
                index = label_index(example[args.label_column], choices, keys)
                if index is None:
                    raise ValueError(f"{row_namer(args, args.label_column)(split, row + 1)}: "
                                     f"{example[args.label_column]!r} names none of the {len(choices)} choices; "
                                     f"expected one of the choices' texts"
                                     f"{' or keys ' + str(keys) if keys else ''}, an index 0..{len(choices) - 1} or a "
                                     f"letter A..{chr(64 + len(choices))}")
                targets.append(index)
                counts[len(choices)] = counts.get(len(choices), 0) + 1
            self.targets[split], self.choice_counts[split] = targets, dict(sorted(counts.items()))
            if keyed:
                raw[split] = data.map(lambda r: {args.choices_column: r[args.choices_column]["text"]})
        return raw

    def coverage_texts(self, train) -> list[str]:
        n = min(len(train), SAMPLE_TEXTS // 2)
        return [*train[self.args.question_column][:n], *(" ".join(c) for c in train[self.args.choices_column][:n])]

    def tokenize(self, raw, tokenizer, config):
        args = self.args
        keep_types = config.attn_type == "bi"

        def encode(batch, indices, targets):
            out = {"input_ids": [], "labels": []}
            if keep_types:
                out["token_type_ids"] = []
            for k, (question, choices) in enumerate(zip(batch[args.question_column], batch[args.choices_column])):
                if args.context_column is not None:  # the passage is cut, never the question or the choice
                    encoded = tokenizer([batch[args.context_column][k]] * len(choices),
                                        [f"{question} {choice}" for choice in choices], truncation="only_first",
                                        max_length=args.max_length, return_token_type_ids=keep_types)
                else:
                    encoded = tokenizer([question] * len(choices), choices, truncation="longest_first",
                                        max_length=args.max_length, return_token_type_ids=keep_types)
                out["input_ids"].append(encoded["input_ids"])
                if keep_types:
                    out["token_type_ids"].append(encoded["token_type_ids"])
                out["labels"].append(targets[indices[k]])
            return out

        out = []
        for split in ("train", "validation"):
            out.append(raw[split].map(encode, batched=True, with_indices=True,
                                      fn_kwargs={"targets": self.targets[split]},
                                      remove_columns=raw[split].column_names, desc=f"Tokenizing the {split} split"))
        return tuple(out)

    def collate(self, pad_id: int):
        """[B, C, L], C the batch's most choices, left padding; absent choices are all-zero attention rows."""
        def collate(examples):
            choices = max(len(e["input_ids"]) for e in examples)
            width = max(len(ids) for e in examples for ids in e["input_ids"])
            rows = [e["input_ids"][c] if c < len(e["input_ids"]) else [] for e in examples for c in range(choices)]
            shape = (len(examples), choices, width)
            batch = {"input_ids": padded(rows, pad_id, left=True, width=width).view(shape),
                     "attention_mask": padded([[1] * len(r) for r in rows], 0, left=True, width=width).view(shape)}
            if "token_type_ids" in examples[0]:
                types = [e["token_type_ids"][c] if c < len(e["token_type_ids"]) else [] for e in examples
                         for c in range(choices)]
                batch["token_type_ids"] = padded(types, 0, left=True, width=width).view(shape)
            batch["labels"] = torch.tensor([e["labels"] for e in examples], dtype=torch.long)
            return batch

        return collate

    def build_model(self, config):
        from ..modeling_multiple_choice import TransformerXLForMultipleChoice

        return load_head(TransformerXLForMultipleChoice, self.args, {})

    @torch.no_grad()
    def evaluate(self, accelerator, model, dev_loader) -> dict:
        model.eval()
        correct, losses = [], []
        for batch in dev_loader:
            logits = model(**batch).logits.float()
            correct.append(gather_padded(accelerator, logits.argmax(-1) == batch["labels"], False))
            losses.append(gather_padded(accelerator, F.cross_entropy(logits, batch["labels"], reduction="none"), 0.0))
        model.train()
        return {"accuracy": float(torch.cat(correct).double().mean()),
                "eval_loss": float(torch.cat(losses).double().mean())}

    def results_fields(self) -> dict:
        return {"task": "multiple-choice", "choices_per_question": self.choice_counts}

    def card(self, results, baseline, config):
        from .card import task_card, usage_code

        counts = self.choice_counts.get("train", {})
        return task_card(
            self, results, baseline, config, what="multiple-choice model", unit="questions",
            task_type="multiple-choice",
            usage=usage_code("AutoModelForMultipleChoice",
                             "choices = [\"a choice\", \"another choice\", \"a third\"]",
                             "inputs = tokenizer([question] * len(choices), choices, padding=True, "
                             "return_tensors=\"pt\")",
                             "scores = model(**{k: v.unsqueeze(0) for k, v in inputs.items()}).logits  # [1, choices]"),
            model_text=("`TransformerXLForMultipleChoice`: each (question, choice) pair is read as "
                        "`question <sep> choice <sep>` and scored from its last token; the highest score wins. "
                        f"Training questions had {', '.join(f'{n} choices ({k})' for n, k in counts.items())}; "
                        "any number of choices works, fewer than the batch's most are masked."))
