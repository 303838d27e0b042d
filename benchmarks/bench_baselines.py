"""The baseline a user would pick instead of fine-tuning: TF-IDF + logistic regression, on the classification sets
the README and docs/finetuning.md report (the same train / dev splits the fine-tuning runs use).

- `builtin`: the built-in topic task (8 classes, `--dataset_name builtin`);
- `builtin-long`: its long documents (`--dataset_name builtin-long`; the TF-IDF model reads the whole document);
- SST-2 (../shared/data/sst2, train / dev), when present;
- `ud-genre`, a cased task built here from UD English-EWT (../shared/data/ud_ewt): each sentence labelled with the web
  genre of the document it comes from (email, reviews, answers, newsgroup, weblog: the prefix of its id), its
  train / dev split (12,544 / 2,001 sentences); `--write_ud_genre DIR` writes it as train.tsv / dev.tsv
  (`sentence`, `label`) for `scripts/finetune_classification.py --train_file DIR/train.tsv --validation_file
  DIR/dev.tsv`;
- `builtin-pairs`, a pair task built here from the built-in task: each paragraph paired with another paragraph of
  the same split, of the same topic or of another one (a seeded coin, half each), labelled `same` / `different`:
  neither text alone says the label, the model has to compare them (2,376 / 584 pairs); `--write_pairs DIR` writes
  it as train.tsv / dev.tsv (`sentence`, `sentence2`, `label`) for `scripts/finetune_classification.py --train_file
  DIR/train.tsv --validation_file DIR/dev.tsv --text_pair_column sentence2`. Its baseline compares the two TF-IDF
  vectors (logistic regression on their cosine: a similarity threshold learned from the training pairs);
- `squad-pairs`, a pair task built here from SQuAD v1.1 (../shared/data/squad) as GLUE's QNLI was: each question with
  the sentence of its paragraph that holds the answer (`answer`) or another sentence of that paragraph (`other`), a
  seeded coin, half each; the articles split by title (the last 8 of the 40 in sorted order are dev: 9,137 / 1,497
  pairs). `--write_squad_pairs DIR` writes it like `--write_pairs`;
- for the pair sets, the same TF-IDF + logistic regression on the second text alone: what a model gets without
  comparing the texts (the cues one text carries: an answer sentence's wording, its numbers and names);
- the most frequent training class beside each (the floor).

TF-IDF of word unigrams and bigrams (lowercased, sublinear tf, words seen in at least one training text),
scikit-learn's LogisticRegression (C=10, lbfgs, 2,000 iterations); no tuning on dev.

    python benchmarks/bench_baselines.py
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SST2 = REPO.parent / "shared" / "data" / "sst2"
SQUAD = REPO.parent / "shared" / "data" / "squad" / "train.jsonl"
SQUAD_DEV_ARTICLES = 8
UD_EWT = REPO.parent / "shared" / "data" / "ud_ewt"


def read_tsv(path: Path) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        next(f)  # header: sentence, label
        for line in f:
            text, label = line.rstrip("\n").rsplit("\t", 1)
            texts.append(text)
            labels.append(label)
    return texts, labels


def sets() -> dict[str, dict]:
    from modeling_xl.finetuning.builtin_task import builtin_task

    out = {}
    for name, long_documents in (("builtin", False), ("builtin-long", True)):
        task = builtin_task(long_documents=long_documents)
        out[name] = {split: (task[split]["sentence"], task[split]["label"]) for split in ("train", "validation")}
    out["builtin-pairs"] = {split: builtin_pairs(*out["builtin"][split], seed=i)
                            for i, split in enumerate(("train", "validation"))}
    if SST2.is_dir():
        out["sst2"] = {"train": read_tsv(SST2 / "train.tsv"), "validation": read_tsv(SST2 / "dev.tsv")}
    if UD_EWT.is_dir():
        out["ud-genre"] = {"train": ud_genre(UD_EWT / "train.jsonl"), "validation": ud_genre(UD_EWT / "dev.jsonl")}
    if SQUAD.is_file():
        out["squad-pairs"] = squad_pairs(SQUAD)
    return out


def builtin_pairs(texts: list[str], topics: list[str], seed: int) -> tuple[list[tuple[str, str]], list[str]]:
    """((paragraph, partner) pairs, `same` / `different`): each paragraph with another of the same split, of its own
    topic or of another one (a coin of `random.Random(seed)`, half each)."""
    import random

    rng = random.Random(seed)
    by_topic: dict[str, list[int]] = {}
    for i, topic in enumerate(topics):
        by_topic.setdefault(topic, []).append(i)
    pairs, labels = [], []
    for i, (text, topic) in enumerate(zip(texts, topics)):
        same = rng.random() < 0.5
        if same:
            partner = rng.choice([j for j in by_topic[topic] if j != i])
        else:
            partner = rng.choice(by_topic[rng.choice([t for t in by_topic if t != topic])])
        pairs.append((text, texts[partner]))
        labels.append("same" if same else "different")
    return pairs, labels


def write_pairs(folder: Path) -> None:
    """The builtin-pairs task as train.tsv / dev.tsv (the pairs `sets` makes: seed 0 for train, 1 for dev)."""
    from modeling_xl.finetuning.builtin_task import builtin_task

    task = {split: (rows["sentence"], rows["label"]) for split, rows in builtin_task().items()}
    write_pair_files(folder, {split: builtin_pairs(*task[split], seed=i)
                              for i, split in enumerate(("train", "validation"))})


ABBREVIATIONS = {"Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Rev.", "Fr.", "Jr.", "Sr.", "Prof.", "Gen.", "Col.", "Lt.",
                 "Capt.", "Sgt.", "Gov.", "Sen.", "No.", "Vol.", "vs.", "Mt.", "Ft.", "Inc.", "Co.", "Corp.", "Bros."}


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence, end exclusive: a cut after `.`, `!` or `?` and white space, before a capital,
    quote or parenthesis, unless the word before the cut is an initial ("Joan B. Kroc"), holds another dot ("U.S.
    News") or is a title or abbreviation of `ABBREVIATIONS` ("Rev. William Corby")."""
    import re

    spans, start = [], 0
    for match in re.finditer(r"(?<=[.!?])\s+(?=[A-Z\"'(])", text):
        word = text[start:match.start()].split()[-1]
        if (len(word) == 2 and word[0].isupper() and word[1] == ".") or "." in word[:-1] or word in ABBREVIATIONS:
            continue
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(text)))
    return spans


def squad_pairs(path: Path, seed: int = 0) -> dict[str, tuple[list[tuple[str, str]], list[str]]]:
    """{"train" / "validation": ((question, sentence) pairs, `answer` / `other`)}: for each question whose paragraph
    has two sentences or more, the sentence holding its (first) answer, or, on a coin of `random.Random(seed)`,
    another sentence of the paragraph. An answer that still crosses a cut (an abbreviation the splitter does not
    know) joins the sentences it touches into one, so no `other` sentence holds a part of it; another sentence can
    still hold the same words (as in GLUE's QNLI, whose pairs were made the same way). Articles are split by title, so
    no dev paragraph was seen in training."""
    import json
    import random

    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    dev_titles = set(sorted({row["title"] for row in rows})[-SQUAD_DEV_ARTICLES:])
    rng = random.Random(seed)
    out = {"train": ([], []), "validation": ([], [])}
    for row in rows:
        spans = sentence_spans(row["context"])
        first = row["answers"]["answer_start"][0]
        last = first + len(row["answers"]["text"][0])
        touched = [i for i, (start, end) in enumerate(spans) if start < last and first < end]
        if not touched:  # an answer in the white space between sentences (none in SQuAD v1.1's 40 articles)
            touched = [next(i for i, (_, end) in enumerate(spans) if first < end)]
        spans = spans[:touched[0]] + [(spans[touched[0]][0], spans[touched[-1]][1])] + spans[touched[-1] + 1:]
        holding = touched[0]
        if len(spans) < 2:
            continue
        answer = rng.random() < 0.5
        chosen = holding if answer else rng.choice([i for i in range(len(spans)) if i != holding])
        pairs, labels = out["validation" if row["title"] in dev_titles else "train"]
        pairs.append((row["question"], row["context"][slice(*spans[chosen])]))
        labels.append("answer" if answer else "other")
    return out


def write_pair_files(folder: Path, task: dict) -> None:
    """A pair task ({split: (pairs, labels)}) as train.tsv / dev.tsv (`sentence`, `sentence2`, `label`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("validation", "dev")):
        with open(folder / f"{name}.tsv", "w", encoding="utf-8") as f:
            f.write("sentence\tsentence2\tlabel\n")
            for (a, b), label in zip(*task[split]):
                f.write(f"{_cell(a)}\t{_cell(b)}\t{label}\n")


def _cell(text: str) -> str:
    return " ".join(text.split())  # no tab or newline inside a TSV cell


def ud_genre(path: Path) -> tuple[list[str], list[str]]:
    """(sentences, genres) of a UD English-EWT split: the tokens joined by spaces, the id's prefix."""
    import json

    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts.append(" ".join(row["tokens"]))
            labels.append(row["id"].split("-", 1)[0])
    return texts, labels


def write_ud_genre(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train.jsonl"), ("dev", "dev.jsonl")):
        texts, labels = ud_genre(UD_EWT / name)
        with open(folder / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            for text, label in zip(texts, labels):
                f.write(f"{text.replace(chr(9), ' ')}\t{label}\n")


def tfidf_logistic_regression(train, dev) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=True)
    if isinstance(train[0][0], tuple):  # pairs: compare the two texts' vectors
        vectorizer.fit([t for pair in train[0] for t in pair])
        features = lambda pairs: pair_features(vectorizer, pairs)  # noqa: E731
    else:
        vectorizer.fit(train[0])
        features = vectorizer.transform
    model = LogisticRegression(C=10.0, max_iter=2000).fit(features(train[0]), train[1])
    predictions = model.predict(features(dev[0]))
    return sum(p == y for p, y in zip(predictions, dev[1])) / len(dev[1])


def second_text_alone(train, dev) -> float | None:
    """For a pair set, TF-IDF + logistic regression on the second text alone; None for a single-text set."""
    if not isinstance(train[0][0], tuple):
        return None
    return tfidf_logistic_regression(([b for _, b in train[0]], train[1]), ([b for _, b in dev[0]], dev[1]))


def pair_features(vectorizer, pairs):
    """The cosine of the two texts' TF-IDF vectors, one feature per pair (the vectors are unit length: the cosine is
    the sum of their product). Logistic regression on it learns the threshold. The per-word products and differences
    beside it were tried and fell to chance (0.51: thousands of sparse features for 2,376 pairs)."""
    import numpy as np

    a = vectorizer.transform([p[0] for p in pairs])
    b = vectorizer.transform([p[1] for p in pairs])
    return np.asarray(a.multiply(b).sum(axis=1))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="benchmarks/results/baselines.json")
    parser.add_argument("--write_ud_genre", help="also write the ud-genre task as train.tsv / dev.tsv into this folder")
    parser.add_argument("--write_pairs", help="also write the builtin-pairs task as train.tsv / dev.tsv into this "
                        "folder")
    parser.add_argument("--write_squad_pairs", help="also write the squad-pairs task as train.tsv / dev.tsv into this "
                        "folder")
    args = parser.parse_args(argv)
    if args.write_ud_genre:
        write_ud_genre(Path(args.write_ud_genre))
    if args.write_pairs:
        write_pairs(Path(args.write_pairs))
    if args.write_squad_pairs:
        write_pair_files(Path(args.write_squad_pairs), squad_pairs(SQUAD))
    results, rows = {}, []
    for name, data in sets().items():
        train, dev = data["train"], data["validation"]
        majority = Counter(train[1]).most_common(1)[0][0]
        results[name] = {"train": len(train[0]), "dev": len(dev[0]),
                         "tfidf_logistic_regression": tfidf_logistic_regression(train, dev),
                         "most_frequent_class": sum(y == majority for y in dev[1]) / len(dev[1]),
                         "second_text_alone": second_text_alone(train, dev)}
        alone = results[name]["second_text_alone"]
        rows.append([name, results[name]["train"], results[name]["dev"],
                     f"{results[name]['tfidf_logistic_regression']:.4f}", f"{results[name]['most_frequent_class']:.4f}",
                     "" if alone is None else f"{alone:.4f}"])
    table = print_table(["set", "train", "dev", "TF-IDF + logistic regression (dev accuracy)", "most frequent class",
                         "pairs: TF-IDF on the second text alone"], rows)
    write_json(args.output, {"results": results, "table": table})
    return results


if __name__ == "__main__":
    main()
