"""Labels of a fine-tuning data set: the problem type, the label names (id2label) and each row's target, with every
bad row named (file, row, column) before training.

Problem types are transformers' (`config.problem_type`):
- `single_label_classification`: one class per row, integer or string labels; ids follow the sorted training labels
  (integers numerically, anything else as text); target = class id.
- `multi_label_classification`: a list per row (JSON) or a text of labels joined by `label_delimiter` ("sport,news");
  target = 0/1 per class.
- `regression`: a number per row; target = that number (one output).
Without `--problem_type` it is read from the training labels: lists -> multi label; numbers with a fractional part ->
regression; otherwise single label. Rows are counted from 1, the header excluded.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

PROBLEM_HINT = "--problem_type regression"

logger = logging.getLogger(__name__)


@dataclass
class LabelSpace:
    problem_type: str
    names: list[str]  # class names in id order (id2label); regression: [the label column]
    ids: dict  # normalised label value -> id (classification)

    @property
    def num_labels(self) -> int:
        return len(self.names)

    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))


def is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


# pandas' default missing-value markers, which CSV/TSV loading keeps as text (finetuning/data.py) so that a class named
# "NA" stays a class; in a column whose other labels are all numbers they are what they look like: missing labels
NA_MARKERS = frozenset({"NA", "N/A", "n/a", "NULL", "null", "None", "<NA>", "#N/A", "#N/A N/A", "#NA", "-NaN", "-nan",
                        "1.#IND", "1.#QNAN", "-1.#IND", "-1.#QNAN"})


def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def check_markers_among_numbers(splits: dict[str, list], describe) -> None:
    """ValueError naming the first row whose label is a missing-value marker ("NA", "null", ...) in a split whose other
    labels are all numbers (with the marker, the file's column was read as text)."""
    for split, raw in splits.items():
        marked = [(row, v) for row, v in enumerate(raw) if isinstance(v, str) and v.strip() in NA_MARKERS]
        if not marked:
            continue
        others = [v for v in raw if not is_missing(v) and not (isinstance(v, str) and v.strip() in NA_MARKERS)]
        if others and all(_is_number(v) for v in others):
            row, value = marked[0]
            raise ValueError(f"{describe(split, row + 1)}: the label is missing ({value!r} among numbers); expected a "
                             "label in every row")


def warn_about_class_names(names: list[str], delimiter: str) -> None:
    """Warnings (not errors: either may be meant) for single-label class names that look like a mistake: names equal
    but for case ("neg", "NEG"; surrounding spaces are stripped before), which become classes of their own, and names
    holding the multi-label delimiter ("sport,news") without --problem_type multi_label_classification."""
    spellings: dict[str, list[str]] = {}
    for name in names:
        spellings.setdefault(name.casefold(), []).append(name)
    variants = [group for group in spellings.values() if len(group) > 1]
    if variants:
        logger.warning("the training labels %s differ only in case: each is a class of its own (%d classes in all); "
                       "expected one spelling per class, if they mean the same class",
                       "; ".join(" / ".join(map(repr, group)) for group in variants[:3]), len(names))
    joined = [name for name in names if delimiter in name]
    if joined:
        logger.warning("%d of the %d training labels hold %r (e.g. %r): each is a class of its own; if a row holds "
                       "several labels, pass --problem_type multi_label_classification (--label_delimiter %r)",
                       len(joined), len(names), delimiter, joined[0], delimiter)


def infer_problem_type(values: list) -> str:
    """transformers' reading of labels, applied to a column: lists -> multi label, fractional numbers -> regression."""
    if any(isinstance(v, (list, tuple)) for v in values):
        return "multi_label_classification"
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if numbers and len(numbers) == len(values) and any(not float(v).is_integer() for v in numbers):
        return "regression"
    return "single_label_classification"


def normalise(value, problem_type: str, delimiter: str, where: str):
    """One raw label -> the value compared across rows: a class (int or str), a tuple of classes, or a float.
    ValueError naming `where` (file, row, column) when it does not fit the problem type."""
    if is_missing(value):
        raise ValueError(f"{where}: the label is missing ({value!r}); expected a label in every row")
    if problem_type == "regression":
        try:
            number = float(value) if not isinstance(value, (bool, list, tuple)) else None
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number):
            raise ValueError(f"{where}: label {value!r} is not a finite number; expected a number in a regression task")
        return number
    if problem_type == "multi_label_classification":
        if isinstance(value, (list, tuple)):
            items = [str(v).strip() for v in value]
        elif isinstance(value, str):
            items = [piece.strip() for piece in value.split(delimiter)]
        else:
            items = [str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)]
        if any(not item for item in items):
            raise ValueError(f"{where}: label {value!r} has an empty label name; expected names separated by "
                             f"{delimiter!r} (label_delimiter) or a list of names")
        return tuple(dict.fromkeys(items))
    if isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: label {value!r} is a list in a single-label task; expected one label per row "
                         "(or --problem_type multi_label_classification)")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{where}: label {value!r} is fractional in a classification task; expected a class "
                             f"(an integer or a name), or {PROBLEM_HINT} for numeric targets")
        return int(value)
    return value.strip() if isinstance(value, str) else value


def _sorted_classes(classes) -> list:
    if all(isinstance(c, int) and not isinstance(c, bool) for c in classes):
        return sorted(classes)
    return sorted(classes, key=str)


def build_label_space(splits: dict[str, list], problem_type: str | None, delimiter: str, describe,
                      class_names: list[str] | None = None) -> tuple[LabelSpace, dict[str, list]]:
    """(label space from the training labels, {split: targets}). `splits` holds each split's raw label column
    ("train" first); `describe(split, row)` names a row for errors ("train_file='x.csv', row 3, column 'label'");
    `class_names` (a `datasets.ClassLabel`'s names) names integer classes."""
    check_markers_among_numbers(splits, describe)
    problem_type = problem_type or infer_problem_type([v for v in splits["train"] if not is_missing(v)])
    values = {split: [normalise(v, problem_type, delimiter, describe(split, row + 1)) for row, v in enumerate(raw)]
              for split, raw in splits.items()}
    if problem_type == "regression":
        space = LabelSpace(problem_type, ["score"], {})
        return space, values
    seen = (set(values["train"]) if problem_type == "single_label_classification"
            else {c for row in values["train"] for c in row})
    classes = _sorted_classes(seen)
    minimum = 2 if problem_type == "single_label_classification" else 1
    if len(classes) < minimum:
        raise ValueError(f"the training labels are {[str(c) for c in classes]}; expected at least {minimum} classes")
    ids = {c: i for i, c in enumerate(classes)}
    names = [class_names[c] if class_names is not None and isinstance(c, int) and 0 <= c < len(class_names)
             else str(c) for c in classes]
    if problem_type == "single_label_classification":
        warn_about_class_names(names, delimiter)
    space = LabelSpace(problem_type, names, ids)
    targets = {}
    for split, rows in values.items():
        targets[split] = []
        for row, value in enumerate(rows):
            wanted = [value] if problem_type == "single_label_classification" else list(value)
            unknown = [c for c in wanted if c not in ids]
            if unknown:
                raise ValueError(f"{describe(split, row + 1)}: label {unknown[0]!r} does not occur in the training "
                                 f"labels; expected one of {names}")
            if problem_type == "single_label_classification":
                targets[split].append(ids[value])
            else:
                hot = [0.0] * len(classes)
                for c in wanted:
                    hot[ids[c]] = 1.0
                targets[split].append(hot)
    return space, targets
