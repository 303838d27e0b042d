"""Extractive question answering as a fine-tuning job (`scripts/finetune_question_answering.py`), SQuAD v1.1 style.

Rows: `id`, `question`, `context`, `answers` = {"text": [...], "answer_start": [...]} (the Hub's `squad` layout;
JSON lines, or one JSON object whose "data" holds them as transformers' `run_qa.py` reads; SQuAD's own nested files
(`data` -> `paragraphs` -> `qas`) are flattened). Every answer must be found at its `answer_start` in its context.

Layout: the causal backbone reads `question <sep> context <sep>` (question first: each context token has read the
question when its start/end logit is computed); the bidirectional backbone reads XLNet's
`context <sep> question <sep> <cls>` with segment ids. `--question_first` overrides either. A context longer than a
window is cut into windows of `max_length` tokens overlapping by `doc_stride` tokens (the question repeated in each).

Training: a window holding the whole first answer is labelled with its first and last token; a window that does not
(an answer outside the window, as transformers' `run_qa.py` does) points both at the window's `<cls>` (its last
special token): "not here". Evaluation: the best span over every window of an example, `start + end` logit, among the
`n_best_size` best starts and ends of each window, inside the context, at most `max_answer_length` tokens, mapped back
to the context's characters; exact match and F1 as the official SQuAD v1.1 script defines them
(`modeling_xl.metrics.squad`). Gold answers that no window holds whole are counted (`answers_outside_windows`): those
examples can still score F1 from a partial span.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import datasets
import torch
import torch.nn.functional as F

from ..runtime.validators import positive_int
from .arguments import TASK_RESULTS_FILES, CommonArguments, validate_task
from .coverage import SAMPLE_TEXTS
from .data import load_raw_datasets, padded, row_namer
from .job import Job, gather_padded, load_head, pad_width

RESULTS_FILE = TASK_RESULTS_FILES["question-answering"]


@dataclass
class QuestionAnsweringArguments(CommonArguments):
    """Everything a question-answering run needs."""

    max_length: int = field(default=384, metadata={"help": "tokens per window (question, context part, specials)"})
    doc_stride: int = field(default=128, metadata={"help": "tokens shared by consecutive windows of a context"})
    question_column: str = "question"
    context_column: str = "context"
    answer_column: str = field(default="answers", metadata={"help": "column of {'text': [...], 'answer_start': [...]}"})
    id_column: str = field(default="id", metadata={"help": "column of example ids (the predictions are keyed by it)"})
    question_first: bool | None = field(default=None, metadata={
        "help": "write the question before the context (default: yes for the causal backbone, no for the "
                "bidirectional one: XLNet's context <sep> question <sep> <cls>)"})
    max_answer_length: int = field(default=30, metadata={"help": "tokens of the longest answer predicted"})
    n_best_size: int = field(default=20, metadata={"help": "starts and ends considered per window"})


def flatten_squad(rows: list[dict]) -> list[dict]:
    """SQuAD's nested articles ({"title", "paragraphs": [{"context", "qas": [...]}]}) as flat rows."""
    flat = []
    for article in rows:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = qa.get("answers", [])
                flat.append({"id": str(qa["id"]), "title": article.get("title", ""), "context": paragraph["context"],
                             "question": qa["question"], "answers": {
                                 "text": [a["text"] for a in answers],
                                 "answer_start": [int(a["answer_start"]) for a in answers]}})
    return flat


class QuestionAnsweringJob(Job):
    """Span extraction with `TransformerXLForQuestionAnsweringSimple` (start and end logits)."""

    results_file = RESULTS_FILE
    card_metrics = (("exact_match", "exact_match", "exact match"), ("f1", "f1", "F1"))

    def __init__(self, args: QuestionAnsweringArguments):
        super().__init__(args)
        self.question_first = args.question_first
        self.dev_rows = self.dev_features = None
        self.predictions: dict[str, str] = {}
        self.train_windows_without_answer = 0

    def validate(self) -> None:
        args = self.args
        validate_task(args, RESULTS_FILE, "squad")
        for name in ("doc_stride", "max_answer_length", "n_best_size"):
            positive_int(name, getattr(args, name))
        if args.doc_stride >= args.max_length:
            raise ValueError(f"doc_stride={args.doc_stride} is invalid with max_length={args.max_length}; expected "
                             "fewer tokens shared by two windows than a window holds")

    # ------------------------------------------------------------------------------------------------------ data
    def load(self) -> datasets.DatasetDict:
        raw = load_raw_datasets(self.args)
        for split in raw:
            if "paragraphs" in raw[split].column_names and self.args.context_column not in raw[split].column_names:
                raw[split] = datasets.Dataset.from_list(flatten_squad(raw[split].to_list()))
            self.check_rows(split, raw[split])
        return raw

    def check_rows(self, split: str, data: datasets.Dataset) -> None:
        """Columns present; question and context non-empty; at least one answer, each found at its answer_start."""
        args = self.args
        for name in ("question_column", "context_column", "answer_column", "id_column"):
            if getattr(args, name) not in data.column_names:
                raise ValueError(f"{name}={getattr(args, name)!r} is not a column of the {split} split; expected one "
                                 f"of {data.column_names}")
        columns = data.select_columns([args.question_column, args.context_column, args.answer_column])
        for row, example in enumerate(columns):
            for column in (args.question_column, args.context_column):
                text = example[column]
                if not isinstance(text, str) or not text.strip():
                    where = row_namer(self.args, column)(split, row + 1)
                    raise ValueError(f"{where}: {text!r} is empty; expected a non-empty text")
            answers, context = example[args.answer_column], example[args.context_column]
            where = row_namer(args, args.answer_column)(split, row + 1)
            shape = "expected {'text': [...], 'answer_start': [...]} with one start per text and at least one answer"
            if (not isinstance(answers, dict) or not isinstance(answers.get("text"), list)
                    or not isinstance(answers.get("answer_start"), list)
                    or len(answers["text"]) != len(answers["answer_start"]) or not answers["text"]):
                raise ValueError(f"{where}: {answers!r}; {shape} (SQuAD v1.1 has no unanswerable questions)")
            for text, start in zip(answers["text"], answers["answer_start"]):
                found = context[start:start + len(text)] if isinstance(start, int) and start >= 0 else None
                if not text or found != text:
                    elsewhere = context.find(text) if text else -1
                    hint = (f"; the text occurs at character {elsewhere}" if elsewhere >= 0 else
                            "; the text does not occur in the context")
                    raise ValueError(f"{where}: answer {text!r} is not at "
                                     f"answer_start={start!r} of its context (found {found!r}{hint}); expected each "
                                     "answer text at its start character in the context")

    def coverage_texts(self, train) -> list[str]:
        n = min(len(train), SAMPLE_TEXTS // 2)
        return [*train[self.args.question_column][:n], *train[self.args.context_column][:n]]

    # ------------------------------------------------------------------------------------------------ features
    def tokenize(self, raw, tokenizer, config):
        if self.question_first is None:
            self.question_first = config.attn_type != "bi"
        keep_types = config.attn_type == "bi"
        train = self.features(raw["train"], tokenizer, keep_types, "train")
        self.train_windows_without_answer = len(train) - sum(train["has_answer"])
        self.dev_rows = raw["validation"]
        dev = self.features(raw["validation"], tokenizer, keep_types, "validation")
        self.dev_features = {"example": dev["example"], "offsets": dev["context_offsets"],
                             "has_answer": dev["has_answer"]}
        keep = ["input_ids", "start_positions", "end_positions"] + (["token_type_ids"] if keep_types else [])
        return train.select_columns(keep), dev.select_columns(keep)

    def features(self, data: datasets.Dataset, tokenizer, keep_types: bool, split: str) -> datasets.Dataset:
        """Windows of every row: input_ids (+ token_type_ids), the first answer's first and last token (the
        window's `<cls>` when it does not hold the answer whole: `has_answer` False), the example's row, the context
        characters of each token ([-1, -1] outside the context)."""
        args, q_first = self.args, self.question_first
        context_id = 1 if q_first else 0
        specials = tokenizer.num_special_tokens_to_add(pair=True)

        def encode(batch, indices):
            questions = [q.lstrip() for q in batch[args.question_column]]
            contexts = batch[args.context_column]
            lengths = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
            for row, n in zip(indices, lengths):
                room = args.max_length - n - specials
                if room <= args.doc_stride:
                    where = row_namer(args, args.question_column)(split, row + 1)
                    raise ValueError(f"{where}: the question is {n} tokens, "
                                     f"leaving {room} of max_length={args.max_length} for the context; expected more "
                                     f"than doc_stride={args.doc_stride} (raise max_length or lower doc_stride)")
            first, second = (questions, contexts) if q_first else (contexts, questions)
            encoded = tokenizer(first, second, truncation="only_second" if q_first else "only_first",
                                max_length=args.max_length, stride=args.doc_stride, return_overflowing_tokens=True,
                                return_offsets_mapping=True, return_token_type_ids=keep_types)
            out = {k: [] for k in ("input_ids", "start_positions", "end_positions", "example", "context_offsets",
                                   "has_answer")}
            if keep_types:
                out["token_type_ids"] = encoded["token_type_ids"]
            for i, ids in enumerate(encoded["input_ids"]):
                local = encoded["overflow_to_sample_mapping"][i]
                sequence = encoded.sequence_ids(i)
                offsets = [list(o) if s == context_id else [-1, -1] for o, s in zip(encoded["offset_mapping"][i],
                                                                                      sequence)]
                answers = batch[args.answer_column][local]
                start_char = answers["answer_start"][0]
                end_char = start_char + len(answers["text"][0])
                inside = [k for k, o in enumerate(offsets) if o[0] >= 0]
                specials_at = [k for k, s in enumerate(sequence) if s is None]
                cls_id = tokenizer.cls_token_id
                start = end = ([k for k, t in enumerate(ids) if t == cls_id] or specials_at or [len(ids) - 1])[-1]
                has_answer = False
                if inside and offsets[inside[0]][0] <= start_char and offsets[inside[-1]][1] >= end_char:
                    start = max(k for k in inside if offsets[k][0] <= start_char)
                    end = min(k for k in inside if offsets[k][1] >= end_char)
                    has_answer = True
                out["input_ids"].append(ids)
                out["start_positions"].append(start)
                out["end_positions"].append(end)
                out["example"].append(indices[local])
                out["context_offsets"].append(offsets)
                out["has_answer"].append(has_answer)
            return out

        return data.map(encode, batched=True, with_indices=True, remove_columns=data.column_names,
                        desc=f"Windows of the {split} split")

    def collate(self, pad_id: int):
        """Right padding (start and end positions count from the first token): input_ids, attention_mask,
        token_type_ids (when kept), start_positions, end_positions."""
        def collate(examples):
            ids = [e["input_ids"] for e in examples]
            batch = {"input_ids": padded(ids, pad_id), "attention_mask": padded([[1] * len(r) for r in ids], 0)}
            if "token_type_ids" in examples[0]:
                batch["token_type_ids"] = padded([e["token_type_ids"] for e in examples], 0)
            for key in ("start_positions", "end_positions"):
                batch[key] = torch.tensor([e[key] for e in examples], dtype=torch.long)
            return batch

        return collate

    def build_model(self, config):
        from ..modeling_question_answering import TransformerXLForQuestionAnsweringSimple

        return load_head(TransformerXLForQuestionAnsweringSimple, self.args, {})

    # ---------------------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, accelerator, model, dev_loader) -> dict:
        from ..metrics.squad.squad import squad_v1

        model.eval()
        starts, ends, losses = [], [], []
        for batch in dev_loader:
            out = model(**batch)
            hidden = ~batch["attention_mask"].bool()
            start_logits = out.start_logits.float().masked_fill(hidden, float("-inf"))
            end_logits = out.end_logits.float().masked_fill(hidden, float("-inf"))
            loss = (F.cross_entropy(start_logits, batch["start_positions"], reduction="none")
                    + F.cross_entropy(end_logits, batch["end_positions"], reduction="none")) / 2
            starts.append(gather_padded(accelerator, start_logits, float("-inf")))
            ends.append(gather_padded(accelerator, end_logits, float("-inf")))
            losses.append(gather_padded(accelerator, loss, 0.0))
        model.train()
        start_logits = pad_width([s.unsqueeze(-1) for s in starts], float("-inf")).squeeze(-1)
        end_logits = pad_width([e.unsqueeze(-1) for e in ends], float("-inf")).squeeze(-1)
        texts = self.best_spans(start_logits, end_logits)
        ids = [str(i) for i in self.dev_rows[self.args.id_column]]
        self.predictions = dict(zip(ids, texts))
        references = [{"id": i, "answers": a} for i, a in zip(ids, self.dev_rows[self.args.answer_column])]
        scores = squad_v1(self.predictions, references)
        reached = set(e for e, has in zip(self.dev_features["example"], self.dev_features["has_answer"]) if has)
        return {**scores, "answers_outside_windows": len(ids) - len(reached),
                "eval_loss": float(torch.cat(losses).double().mean())}

    def best_spans(self, start_logits: torch.Tensor, end_logits: torch.Tensor) -> list[str]:
        """The answer text of every dev example: the best-scoring valid span over its windows ("" when none), without
        the whitespace a subword's offsets may include before it."""
        args = self.args
        contexts = self.dev_rows[args.context_column]
        best: list[tuple[float, str]] = [(float("-inf"), "")] * len(contexts)
        k = args.n_best_size
        for feature, (example, offsets) in enumerate(zip(self.dev_features["example"], self.dev_features["offsets"])):
            s, e = start_logits[feature, :len(offsets)], end_logits[feature, :len(offsets)]
            top_s = torch.topk(s, min(k, len(offsets))).indices.tolist()
            top_e = torch.topk(e, min(k, len(offsets))).indices.tolist()
            for i in top_s:
                if offsets[i][0] < 0:
                    continue
                for j in top_e:
                    if offsets[j][0] < 0 or j < i or j - i + 1 > args.max_answer_length:
                        continue
                    score = float(s[i] + e[j])
                    if score > best[example][0]:
                        best[example] = (score, contexts[example][offsets[i][0]:offsets[j][1]].strip())
        return [text for _, text in best]

    # ------------------------------------------------------------------------------------------------- records
    def results_fields(self) -> dict:
        return {"task": "question-answering", "question_first": self.question_first,
                "train_windows_without_answer": self.train_windows_without_answer, "predictions": self.predictions}

    def card(self, results, baseline, config):
        from .card import task_card, usage_code

        layout = ("question <sep> context <sep>" if self.question_first else "context <sep> question <sep> <cls>")
        return task_card(
            self, results, baseline, config, what="extractive question-answering model", unit="questions",
            task_type="question-answering",
            usage=usage_code("AutoModelForQuestionAnswering",
                             "inputs = tokenizer(question, context, return_tensors=\"pt\")" if self.question_first
                             else "inputs = tokenizer(context, question, return_tensors=\"pt\")",
                             "out = model(**inputs)  # start_logits, end_logits: the answer's first and last token"),
            model_text=(f"`TransformerXLForQuestionAnsweringSimple`: a start and an end logit per token. Inputs are "
                        f"laid out `{layout}`; contexts longer than a window are read in windows of "
                        f"{self.args.max_length} tokens overlapping by {self.args.doc_stride}, and the answer is the "
                        f"best span (start + end logit, at most {self.args.max_answer_length} tokens) over every "
                        "window. Exact match and F1 follow the official SQuAD v1.1 evaluation."))
