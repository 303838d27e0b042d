"""A built-in offline multi-class task: paragraphs of the built-in corpus (standard-library docstrings and the
language reference) labelled by the topic of the module they come from, so a fine-tuning demo needs no download.

Eight classes (`TOPICS`). A paragraph goes to the dev split when the CRC32 of its text is 0 mod 5 (about 20%), else
to train; duplicates are dropped; each class keeps at most `TRAIN_PER_CLASS` / `DEV_PER_CLASS` paragraphs in file
order, so the task is balanced and the same on every run of a given Python version (the paragraphs come from that
version's standard library; CI uses 3.11).

`long_documents=True` ("builtin-long"): the same paragraphs, `PARAGRAPHS_PER_DOCUMENT` consecutive ones of a class
joined into one document (a few hundred tokens), for comparing `--long_document` with truncation.
"""

from __future__ import annotations

import zlib

import datasets

from ..data.corpora import builtin_source_files, prose_paragraphs

TOPICS = {
    "gui": ("tkinter", "turtle"),
    "language reference": ("pydoc_data",),
    "concurrency": ("asyncio", "multiprocessing", "threading", "concurrent", "queue", "sched"),
    "mail": ("email", "mailbox", "smtplib", "imaplib", "poplib"),
    "web and networking": ("http", "urllib", "xmlrpc", "wsgiref", "socketserver", "socket", "ssl", "ftplib"),
    "xml": ("xml",),
    "numbers": ("_pydecimal", "decimal", "statistics", "fractions", "numbers", "random", "math"),
    "testing and debugging": ("unittest", "doctest", "pdb", "bdb", "trace", "traceback", "faulthandler"),
}
TRAIN_PER_CLASS, DEV_PER_CLASS = 300, 75
PARAGRAPHS_PER_DOCUMENT = 8


def topic_paragraphs() -> dict[str, list[str]]:
    """{topic: its paragraphs in file order, duplicates dropped}."""
    root, files = builtin_source_files()
    module_topic = {module: topic for topic, modules in TOPICS.items() for module in modules}
    found, seen = {topic: [] for topic in TOPICS}, set()
    for file in files:
        topic = module_topic.get(file.relative_to(root).parts[0].removesuffix(".py"))
        if topic is None:
            continue
        for paragraph in prose_paragraphs(file):
            if paragraph not in seen:
                seen.add(paragraph)
                found[topic].append(paragraph)
    return found


def builtin_task(long_documents: bool = False) -> datasets.DatasetDict:
    """{"train", "validation"} with columns `sentence` (the text) and `label` (the topic's name)."""
    rows = {"train": {"sentence": [], "label": []}, "validation": {"sentence": [], "label": []}}
    for topic, paragraphs in topic_paragraphs().items():
        by_split = {"train": [], "validation": []}
        for paragraph in paragraphs:
            by_split["validation" if zlib.crc32(paragraph.encode()) % 5 == 0 else "train"].append(paragraph)
        for split, texts in by_split.items():
            limit = TRAIN_PER_CLASS if split == "train" else DEV_PER_CLASS
            if long_documents:
                texts = [" ".join(texts[i:i + PARAGRAPHS_PER_DOCUMENT])
                         for i in range(0, len(texts) - PARAGRAPHS_PER_DOCUMENT + 1, PARAGRAPHS_PER_DOCUMENT)]
                limit //= PARAGRAPHS_PER_DOCUMENT // 2  # fewer, longer rows
            rows[split]["sentence"] += texts[:limit]
            rows[split]["label"] += [topic] * len(texts[:limit])
    return datasets.DatasetDict({split: datasets.Dataset.from_dict(columns) for split, columns in rows.items()})
