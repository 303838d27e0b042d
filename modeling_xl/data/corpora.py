"""Corpora as `datasets.DatasetDict`s with a text column: Hub datasets, local files, or a built-in offline corpus.

`load_corpus(source, config)`:
- `"builtin"`: English prose from the Python standard library's docstrings and `pydoc_data` topics (needs no download;
  see `builtin_corpus`);
- a local file or folder: .txt/.tokens/.raw (one text per line), .json/.jsonl, .csv/.tsv, .parquet. A folder holds
  one file per split named train/valid(ation)/test (e.g. WikiText's train.txt, valid.txt, test.txt);
- anything else: a Hub dataset by name and config through `datasets.load_dataset(name, config)` (e.g. "wikitext",
  "wikitext-103-raw-v1"); offline this fails with an error saying so.
Splits are named train / validation / test.
"""

from __future__ import annotations

import ast
import codecs
import hashlib
import logging
import sys
import sysconfig
import zlib
from pathlib import Path

import datasets
import pyarrow.compute as pc

from .sources import CorpusSource

logger = logging.getLogger(__name__)

BUILTIN_NAMES = ("builtin", "stdlib-docs")
BUILTIN_VERSION = "1"
SPLIT_ALIASES = {"train": "train", "valid": "validation", "validation": "validation", "dev": "validation",
                 "test": "test"}
BUILDERS = {".txt": "text", ".tokens": "text", ".raw": "text", ".json": "json", ".jsonl": "json", ".csv": "csv",
            ".tsv": "csv", ".parquet": "parquet"}


def load_corpus(source: str | Path, config: str | None = None, *, text_column: str = "text",
                cache_dir: str | None = None) -> datasets.DatasetDict:
    """Load `source` (see module docstring) and check that it has text."""
    if str(source) in BUILTIN_NAMES:
        return builtin_corpus(cache_dir=cache_dir)
    path = Path(source)
    if path.exists():
        corpus = _load_local(path, cache_dir)
    else:
        corpus = _load_hub(str(source), config, cache_dir)
    check_corpus(corpus, text_column, str(source), single_file=path.is_file())
    return corpus


def _load_hub(name: str, config: str | None, cache_dir: str | None) -> datasets.DatasetDict:
    try:
        loaded = datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as error:  # offline, unknown name, missing config: all surface as one clear message
        raise OSError(f"could not load the corpus {name!r} (config {config!r}) from the Hugging Face Hub: "
                      f"{type(error).__name__}: {error}. Expected a Hub dataset reachable online, a local file or "
                      f"folder, or 'builtin' for the offline corpus") from error
    if not isinstance(loaded, datasets.DatasetDict):
        loaded = datasets.DatasetDict({"train": loaded})
    return datasets.DatasetDict({SPLIT_ALIASES.get(split, split): data for split, data in loaded.items()})


def ordered_splits(names) -> list[str]:
    """Split names in reading order: train, validation, test, then any others (sorted). Counting a vocabulary over
    every split in this order breaks frequency ties as the reference does (train, then valid, then test); folders
    and Hub datasets list them alphabetically."""
    rank = {"train": 0, "validation": 1, "test": 2}
    return sorted(names, key=lambda name: (rank.get(name, 3), name))


# how plain-text files are read (the `text` builder): one row per line without its line end, and a UTF-8 byte order
# mark at the start of a file dropped (Windows editors write one; kept, it would glue itself to the first word)
TEXT_OPTIONS = {"keep_linebreaks": False, "encoding": "utf-8-sig"}


def split_files(path: Path) -> dict[str, Path]:
    if path.is_file():
        return {"train": path}
    files = {}
    for file in sorted(path.iterdir()):
        split = SPLIT_ALIASES.get(file.stem.split(".")[-1] if file.stem.startswith("wiki.") else file.stem)
        if split and file.suffix in BUILDERS:
            files[split] = file
    if "train" not in files:
        raise ValueError(f"folder {path} has no train file; expected train/valid/test files with one of the "
                         f"extensions {sorted(BUILDERS)}")
    # corpus files the naming rule leaves out (more_train.txt beside train.txt): said, not silently dropped
    ignored = sorted(file.name for file in path.iterdir()
                     if file.is_file() and file.suffix in BUILDERS and file not in files.values())
    if ignored:
        logger.warning("folder %s: reading %s; ignoring %s (only files named train/valid/test are read)", path,
                       ", ".join(f.name for f in files.values()), ", ".join(ignored))
    return {split: files[split] for split in ordered_splits(files)}


def _load_local(path: Path, cache_dir: str | None) -> datasets.DatasetDict:
    files = split_files(path)
    suffixes = {file.suffix for file in files.values()}
    if len(suffixes) != 1 or next(iter(suffixes)) not in BUILDERS:
        raise ValueError(f"corpus files {sorted(map(str, files.values()))} have extensions {sorted(suffixes)}; "
                         f"expected one of {sorted(BUILDERS)} for all splits")
    suffix = suffixes.pop()
    for file in files.values():
        if file.stat().st_size == 0:  # datasets cannot infer a schema from no rows: a DatasetGenerationError
            raise ValueError(f"{file} is empty (0 bytes); expected a corpus file with at least one line of text")
        if file.suffix != ".parquet":
            check_utf8(file)
    options = dict(TEXT_OPTIONS) if BUILDERS[suffix] == "text" else {}
    if suffix == ".tsv":
        options["delimiter"] = "\t"
    return load_split_files(BUILDERS[suffix], files, cache_dir=cache_dir, **options)


def load_split_files(builder: str, files: dict, cache_dir: str | None = None, **options) -> datasets.DatasetDict:
    """{split: file} loaded one split at a time, so splits may differ in columns (GLUE's test.tsv has `index` and no
    `label`); loaded together, datasets would fail to cast one split's rows to another's columns."""
    return datasets.DatasetDict({
        split: datasets.load_dataset(builder, data_files={split: str(file)}, cache_dir=cache_dir, **options)[split]
        for split, file in files.items()})


def check_utf8(path: Path, chunk_bytes: int = 1 << 20) -> None:
    """ValueError naming the file, line and byte offset of the first byte sequence that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 1
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                bad = offset + error.start
                lines += chunk[: error.start].count(b"\n")
                raise ValueError(f"{path}: bytes {chunk[error.start:error.end]!r} at byte {bad} (line {lines}) are "
                                 f"not valid UTF-8; expected a UTF-8 text file") from error
            offset += len(chunk)
            lines += chunk.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} ends inside a UTF-8 character; expected a UTF-8 text file") from error


def check_corpus(corpus: datasets.DatasetDict, text_column: str, name: str, single_file: bool = False) -> None:
    """ValueError when the text column is missing or the training split has no text (`single_file`: the corpus is
    one file, loaded as its "train" split, whatever role the caller gives it: the messages name no split)."""
    if "train" not in corpus:
        raise ValueError(f"corpus {name!r} has splits {sorted(corpus)}; expected a 'train' split")
    for split, data in corpus.items():
        if text_column not in data.column_names:
            where = f"corpus {name!r}" if single_file else f"corpus {name!r} split {split!r}"
            raise ValueError(f"{where} has columns {data.column_names}; expected a text column {text_column!r} "
                             "(pass text_column=...)")
    train = corpus["train"]
    if train.num_rows == 0 or not any(_has_text(chunk) for chunk in train.data.column(text_column).chunks):
        what = "no text" if single_file else "an empty training split"
        raise ValueError(f"corpus {name!r} has {what} ({train.num_rows} rows, all blank); expected at least one "
                         "non-empty line")


def _has_text(chunk, rows: int = 100_000) -> bool:
    """Whether a column chunk has a non-blank line, read `rows` at a time (a corpus larger than memory is never
    copied whole) and stopping at the first one."""
    for start in range(0, len(chunk), rows):
        part = pc.fill_null(chunk.slice(start, rows), "")
        if (pc.max(pc.utf8_length(pc.utf8_trim_whitespace(part))).as_py() or 0) > 0:
            return True
    return False


# ---- built-in offline corpus -----------------------------------------------------------------------------------

def builtin_corpus(cache_dir: str | None = None) -> datasets.DatasetDict:
    """English prose shipped with Python: docstrings of the standard library and the `pydoc_data` help topics.

    One row per prose paragraph (wrapped lines joined). Deterministic for a given Python version: files are read in
    sorted order and assigned to a split by the CRC32 of their relative path (~90% train, 5% validation, 5% test),
    so no document spans two splits. Built with `Dataset.from_generator` and cached (keyed on the Python version and
    `BUILTIN_VERSION`). Python 3.11 gives about 1.33M characters (214k words; train 1.18M).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    splits = {"train": [], "validation": [], "test": []}
    for file in _stdlib_sources(root):
        bucket = zlib.crc32(str(file.relative_to(root)).encode()) % 20
        splits["test" if bucket == 0 else "validation" if bucket == 1 else "train"].append(str(file))
    key = hashlib.sha256(f"{BUILTIN_VERSION} {sys.version} {root}".encode()).hexdigest()[:16]
    return datasets.DatasetDict({
        split: datasets.Dataset.from_generator(_prose_rows, gen_kwargs={"files": files, "root": str(root), "key": key},
                                               features=datasets.Features({"text": datasets.Value("string")}),
                                               cache_dir=cache_dir, split=datasets.NamedSplit(split))
        for split, files in splits.items()})


def _stdlib_sources(root: Path) -> list[Path]:
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))


def builtin_source_files() -> tuple[Path, list[Path]]:
    """(the standard library's folder, the files the built-in corpus reads, sorted)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return root, _stdlib_sources(root)


def prose_paragraphs(file: Path):
    """The prose paragraphs of one file's docstrings (wrapped lines joined), in order: the built-in corpus's rows."""
    for text in _documents(Path(file)):
        for paragraph in text.split("\n\n"):
            if _is_prose(paragraph):
                yield " ".join(line.strip() for line in paragraph.splitlines())


def _prose_rows(files: list[str], root: str, key: str):
    """Rows {"text": paragraph} of every file (key only identifies the cache entry)."""
    for file in files:
        for paragraph in prose_paragraphs(Path(file)):
            yield {"text": paragraph}


def _documents(file: Path):
    """Docstrings of the module, its classes and functions; for pydoc_data/topics.py, the topic texts."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    if file.parent.name == "pydoc_data" and file.name == "topics.py":
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                yield from (v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node)
            if docstring:
                yield docstring


def _is_prose(paragraph: str) -> bool:
    """Sentences, not code, tables or lists: starts with a capital, mostly letters, no indented or prompt lines."""
    lines = paragraph.splitlines()
    text = " ".join(line.strip() for line in lines)
    if len(text) < 30 or not text[0].isalpha() or any(line.startswith((" ", "\t", ">>>", "...")) for line in lines):
        return False
    letters = sum(c.isalpha() or c == " " for c in text)
    return letters / len(text) >= 0.8


# held out from the end of the training rows when the corpus has no validation split
VALIDATION_FRACTION = 0.05


def load_splits(source: CorpusSource):
    """DatasetDict with train and validation splits (the validation split: `source.validation_file`, the corpus's
    own, or the training split's last `VALIDATION_FRACTION` of rows), and the corpus's name for the model card."""
    location, name = source.location, source.argument
    try:
        corpus = load_corpus(location, source.dataset_config_name, text_column=source.text_column)
    except OSError as error:
        raise ValueError(f"{name}={location!r} could not be loaded: {error}") from None
    except ValueError as error:
        raise ValueError(f"{name}={location!r}: {error}") from None
    if source.validation_file:
        try:
            validation = load_corpus(source.validation_file, text_column=source.text_column)["train"]
        except (OSError, ValueError) as error:
            raise ValueError(f"validation_file={source.validation_file!r}: {error}") from None
        corpus = datasets.DatasetDict({**corpus, "validation": validation})
    if "validation" not in corpus:
        rows = corpus["train"].num_rows
        held_out = max(1, int(rows * VALIDATION_FRACTION))
        if rows < 2:
            raise ValueError(f"{name}={location!r} has {rows} row(s) and no validation split; expected a "
                             "--validation_file or a corpus with at least two lines")
        logger.info("no validation split: holding out the last %d of %d training rows", held_out, rows)
        corpus = datasets.DatasetDict({"train": corpus["train"].select(range(rows - held_out)),
                                       "validation": corpus["train"].select(range(rows - held_out, rows))})
    return datasets.DatasetDict({"train": corpus["train"], "validation": corpus["validation"]}), str(location)
