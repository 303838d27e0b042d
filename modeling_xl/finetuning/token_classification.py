"""Token classification (NER, part-of-speech tagging) as a fine-tuning job
(`scripts/finetune_token_classification.py`).

Rows: a list of words (`tokens`) and a list of as many tags (`ner_tags`, `pos_tags`, `upos_tags`, `tags` or
`labels`, the first present, or `--label_column`), as strings or as class ids of a `ClassLabel` column. Every word is
tokenized on its own (`is_split_into_words=True`); its tag labels its first sub-token, and the other sub-tokens and the
special tokens get -100 (no loss, no prediction).

Without `--long_document` a sentence longer than `max_length` tokens is cut: the words past the cut are not read and
count as wrong (their prediction is "O" for BIO tags, none for other tags). With `--long_document` nothing is cut:
the model tags each document `max_length` tokens at a time, carrying its memory from one segment to the next
(`TransformerXLForTokenClassification(segment_len=...)`, right padding).

Metrics over every dev word: token accuracy; for BIO / IOBES tags also entity precision, recall and F1 as `seqeval`
computes them by default (conlleval chunking: an `I-X` after `O` or another type opens an entity; micro-averaged over
entity types), computed here (`entity_spans`), no package needed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import datasets
import torch
import torch.nn.functional as F

from .arguments import TASK_RESULTS_FILES, CommonArguments, validate_task
from .coverage import SAMPLE_TEXTS
from .data import load_raw_datasets, padded, row_namer
from .job import Job, gather_padded, load_head, model_inputs, pad_width

logger = logging.getLogger(__name__)
RESULTS_FILE = TASK_RESULTS_FILES["token-classification"]
LABEL_COLUMNS = ("ner_tags", "pos_tags", "upos_tags", "tags", "labels")
_SCHEME_TAG = re.compile(r"^[BIES]-.+$")


@dataclass
class TokenClassificationArguments(CommonArguments):
    """Everything a token-classification run needs."""

    tokens_column: str = field(default="tokens", metadata={"help": "column holding each row's list of words"})
    label_column: str | None = field(default=None, metadata={
        "help": "column holding each row's list of tags (default: the first of " + ", ".join(LABEL_COLUMNS) + ")"})
    long_document: bool = field(default=False, metadata={"help": "tag whole documents max_length tokens at a time "
                                                                 "with memory instead of cutting them"})


def is_entity_scheme(names: list[str]) -> bool:
    """BIO / IOBES tags: every tag is `O` or `B-X`, `I-X`, `E-X`, `S-X`, and at least one is not `O`."""
    return any(n != "O" for n in names) and all(n == "O" or _SCHEME_TAG.match(n) for n in names)


def entity_spans(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, first word, last word) of every entity in a sentence's tags, chunked as conlleval (and seqeval's
    default mode) chunks them: an entity ends before `B`/`S`/`O`, after `E`/`S`, or where the type changes; it
    starts at `B`/`S`, or at an `I`/`E` that does not continue an entity of its type."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, typ = tag.partition("-") if tag != "O" else ("O", "", "")
        continues = start is not None and prefix in ("I", "E") and typ == kind
        if start is not None and not continues:
            spans.add((kind, start, i - 1))
            start = kind = None
        if prefix != "O" and start is None:
            start, kind = i, typ
        if prefix in ("E", "S") and start is not None:
            spans.add((kind, start, i))
            start = kind = None
    return spans


def tagging_scores(predicted: list[list[str | None]], gold: list[list[str]], entities: bool) -> dict:
    """{"accuracy"} over every word (an unread word, None, is wrong), and with `entities` entity
    {"precision", "recall", "f1"} (micro over types; an unread word counts as "O")."""
    words = sum(len(g) for g in gold)
    scores = {"accuracy": sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs)) / max(words, 1)}
    if entities:
        found = wanted = correct = 0
        for ps, gs in zip(predicted, gold):
            p, g = entity_spans([t or "O" for t in ps]), entity_spans(gs)
            found, wanted, correct = found + len(p), wanted + len(g), correct + len(p & g)
        precision = correct / found if found else 0.0
        recall = correct / wanted if wanted else 0.0
        scores.update(precision=precision, recall=recall,
                      f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    return scores


class TokenClassificationJob(Job):
    """A tag per word with `TransformerXLForTokenClassification`."""

    results_file = RESULTS_FILE

    def __init__(self, args: TokenClassificationArguments):
        super().__init__(args)
        self.label_column = args.label_column
        self.names: list[str] = []
        self.entities = False
        self.dev_tags: list[list[str]] = []
        self.dev_words: list[list[int]] = []
        self.class_names: list[str] | None = None  # a ClassLabel tag column's names (its values are ids)

    @property
    def card_metrics(self):
        entity = (("f1", "f1", "entity F1"), ("precision", "precision", "entity precision"),
                  ("recall", "recall", "entity recall"))
        return (*(entity if self.entities else ()), ("accuracy", "accuracy", "token accuracy"))

    def validate(self) -> None:
        validate_task(self.args, RESULTS_FILE, "conll2003")

    def load(self) -> datasets.DatasetDict:
        args = self.args
        raw = load_raw_datasets(args)
        columns = raw["train"].column_names
        if self.label_column is None:
            found = [c for c in LABEL_COLUMNS if c in columns]
            if not found:
                raise ValueError(f"label_column=None and none of {list(LABEL_COLUMNS)} is a column of the train split; "
                                 f"expected --label_column naming one of {columns}")
            self.label_column = found[0]
        feature = raw["train"].features.get(self.label_column)
        self.class_names = class_names = getattr(getattr(feature, "feature", None), "names", None)
        seen = []
        for split, data in raw.items():
            for name, column in (("tokens_column", args.tokens_column), ("label_column", self.label_column)):
                if column not in data.column_names:
                    raise ValueError(f"{name}={column!r} is not a column of the {split} split; expected one of "
                                     f"{data.column_names}")
            for row, (words, tags) in enumerate(zip(data[args.tokens_column], data[self.label_column])):
                describe = row_namer(args, args.tokens_column)(split, row + 1)
                if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip()
                                                                       for w in words):
                    raise ValueError(f"{describe}: {str(words)[:120]}; expected a non-empty list of non-empty words")
                if not isinstance(tags, list) or len(tags) != len(words):
                    n = len(tags) if isinstance(tags, list) else tags
                    raise ValueError(f"{row_namer(args, self.label_column)(split, row + 1)}: {n} tags for "
                                     f"{len(words)} words; expected one tag per word")
                if class_names is not None:
                    tags = [class_names[t] for t in tags]
                if split == "train":
                    seen.extend(t for t in tags if t not in seen)
                else:
                    unknown = [t for t in tags if t not in seen]
                    if unknown:
                        raise ValueError(f"{row_namer(args, self.label_column)(split, row + 1)}: tag {unknown[0]!r} "
                                         f"never occurs in the train split; expected one of {sorted(map(str, seen))}")
        self.names = list(class_names) if class_names is not None else sorted(seen, key=str)
        self.names = [str(n) for n in self.names]
        self.entities = is_entity_scheme(self.names)
        to_name = (lambda t: class_names[t]) if class_names is not None else str
        self.dev_tags = [[to_name(t) for t in tags] for tags in raw["validation"][self.label_column]]
        return raw

    def coverage_texts(self, train) -> list[str]:
        return [" ".join(words) for words in train[self.args.tokens_column][:SAMPLE_TEXTS]]

    def tokenize(self, raw, tokenizer, config):
        ids = {name: i for i, name in enumerate(self.names)}
        class_names, args = self.class_names, self.args

        def encode(batch):
            encoded = tokenizer(batch[args.tokens_column], is_split_into_words=True)
            out = {"input_ids": [], "labels": [], "words": []}
            for i, tags in enumerate(batch[self.label_column]):
                names = [class_names[t] for t in tags] if class_names is not None else [str(t) for t in tags]
                labels, words, previous = [], [], None
                for word in encoded.word_ids(i):
                    first = word is not None and word != previous
                    labels.append(ids[names[word]] if first else -100)
                    previous = word
                input_ids = encoded["input_ids"][i]
                if not args.long_document:
                    input_ids, labels = input_ids[:args.max_length], labels[:args.max_length]
                words = [w for w, label in zip(encoded.word_ids(i), labels) if label != -100]
                out["input_ids"].append(input_ids)
                out["labels"].append(labels)
                out["words"].append(words)  # the word each labelled token tags, in order
            return out

        train, dev = (raw[split].map(encode, batched=True, remove_columns=raw[split].column_names,
                                     desc=f"Tokenizing the {split} split") for split in ("train", "validation"))
        self.dev_words = dev["words"]
        return train.select_columns(["input_ids", "labels"]), dev.select_columns(["input_ids", "labels"])

    def collate(self, pad_id: int):
        """Right padding (the memory of a long document runs left to right): input_ids, attention_mask, labels
        (-100 on padding)."""
        def collate(examples):
            ids = [e["input_ids"] for e in examples]
            return {"input_ids": padded(ids, pad_id), "attention_mask": padded([[1] * len(r) for r in ids], 0),
                    "labels": padded([e["labels"] for e in examples], -100)}

        return collate

    def build_model(self, config):
        from ..modeling_token_classification import TransformerXLForTokenClassification

        fields = {"id2label": dict(enumerate(self.names)), "label2id": {n: i for i, n in enumerate(self.names)}}
        model = load_head(TransformerXLForTokenClassification, self.args, fields)
        tagger = TransformerXLForTokenClassification.__name__ in (config.architectures or [])
        if tagger and not self.args.from_scratch and list(config.id2label.values()) != self.names:
            with torch.no_grad():  # a tagger of other tags (even as many): its class layer is new for these
                model._init_weights(model.classifier)
            logger.info("model_name_or_path=%r tags %s; its class layer is new for %s", self.args.model_name_or_path,
                        list(config.id2label.values()), self.names)
        return model

    @torch.no_grad()
    def evaluate(self, accelerator, model, dev_loader) -> dict:
        model.eval()
        predictions, labels, losses, counts = [], [], [], []
        for batch in dev_loader:
            logits = model(**model_inputs(batch, self.args)).logits.float()
            loss = F.cross_entropy(logits.transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none")
            predictions.append(gather_padded(accelerator, logits.argmax(-1), -100))
            labels.append(gather_padded(accelerator, batch["labels"], -100))
            losses.append(gather_padded(accelerator, loss.sum(1).double(), 0.0))
            counts.append(gather_padded(accelerator, (batch["labels"] != -100).sum(1), 0))
        model.train()
        predicted_ids = pad_width([p.unsqueeze(-1) for p in predictions], -100).squeeze(-1)
        label_ids = pad_width([x.unsqueeze(-1) for x in labels], -100).squeeze(-1)
        predicted = []
        for row, (gold, words) in enumerate(zip(self.dev_tags, self.dev_words)):
            tags: list[str | None] = [None] * len(gold)  # a word no token of the window tags stays unread
            for word, p in zip(words, predicted_ids[row][label_ids[row] != -100].tolist()):
                tags[word] = self.names[p]
            predicted.append(tags)
        scores = tagging_scores(predicted, self.dev_tags, self.entities)
        unread = sum(len(g) - sum(p is not None for p in ps) for ps, g in zip(predicted, self.dev_tags))
        return {**scores, "unread_words": unread,
                "eval_loss": float(torch.cat(losses).sum() / max(int(torch.cat(counts).sum()), 1))}

    def results_fields(self) -> dict:
        return {"task": "token-classification", "labels": self.names, "label_column": self.label_column,
                "entity_metrics": self.entities}

    def card(self, results, baseline, config):
        from .card import task_card, usage_code

        reading = (f"whole documents tagged {self.args.max_length} tokens at a time with the memory carried across "
                   f"segments: call `model(input_ids, attention_mask=..., segment_len={self.args.max_length})`"
                   if self.args.long_document else
                   f"sentences cut at {self.args.max_length} tokens (words past the cut count as wrong)")
        return task_card(
            self, results, baseline, config, what="token classifier", unit="sentences",
            task_type="token-classification",
            usage=usage_code("AutoModelForTokenClassification",
                             "inputs = tokenizer([\"A\", \"sentence\", \".\"], is_split_into_words=True, "
                             "return_tensors=\"pt\")",
                             "tags = [model.config.id2label[int(i)] for i in model(**inputs).logits.argmax(-1)[0]]"),
            model_text=(f"`TransformerXLForTokenClassification`: a tag per token ({len(self.names)} tags: "
                        f"{', '.join(self.names[:20])}{' ...' if len(self.names) > 20 else ''}); a word's tag is "
                        f"its first sub-token's. Fine-tuned and evaluated on {reading}."))
