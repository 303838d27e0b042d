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
    if SST2.is_dir():
        out["sst2"] = {"train": read_tsv(SST2 / "train.tsv"), "validation": read_tsv(SST2 / "dev.tsv")}
    if UD_EWT.is_dir():
        out["ud-genre"] = {"train": ud_genre(UD_EWT / "train.jsonl"), "validation": ud_genre(UD_EWT / "dev.jsonl")}
    return out


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
    x_train = vectorizer.fit_transform(train[0])
    model = LogisticRegression(C=10.0, max_iter=2000).fit(x_train, train[1])
    predictions = model.predict(vectorizer.transform(dev[0]))
    return sum(p == y for p, y in zip(predictions, dev[1])) / len(dev[1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="benchmarks/results/baselines.json")
    parser.add_argument("--write_ud_genre", help="also write the ud-genre task as train.tsv / dev.tsv into this folder")
    args = parser.parse_args(argv)
    if args.write_ud_genre:
        write_ud_genre(Path(args.write_ud_genre))
    results, rows = {}, []
    for name, data in sets().items():
        train, dev = data["train"], data["validation"]
        majority = Counter(train[1]).most_common(1)[0][0]
        results[name] = {"train": len(train[0]), "dev": len(dev[0]),
                         "tfidf_logistic_regression": tfidf_logistic_regression(train, dev),
                         "most_frequent_class": sum(y == majority for y in dev[1]) / len(dev[1])}
        rows.append([name, results[name]["train"], results[name]["dev"],
                     f"{results[name]['tfidf_logistic_regression']:.4f}", f"{results[name]['most_frequent_class']:.4f}"])
    table = print_table(["set", "train", "dev", "TF-IDF + logistic regression (dev accuracy)", "most frequent class"],
                        rows)
    write_json(args.output, {"results": results, "table": table})
    return results


if __name__ == "__main__":
    main()
