"""The layout rules docs/structure.md states, checked on the source: no library function longer than 60 lines, the
model file a backbone and its head, and a README that is a map whose first screen holds the install and the test
command."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("modeling_xl", "tokenization")
MAX_FUNCTION_LINES = 60
MAX_MODEL_FILE_LINES = 420  # "about 400 lines or fewer": the backbone and the causal-LM head
MAX_README_LINES = 150
FIRST_SCREEN = 24  # lines of a terminal or a repository page before a reader scrolls


def long_functions(root: Path, packages=LIBRARY, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str, int]]:
    """(file, function, lines) of every function or method over `limit` lines, docstring and comments included."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        found.append((str(path.relative_to(root)), node.name, lines))
    return found


def test_the_length_check_finds_a_long_function_and_a_long_method(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n\n\n"
                                           f"class A:\n    def method(self):\n{body.replace('    ', '        ')}\n")
    assert long_functions(tmp_path, ("pkg",)) == [("pkg/m.py", "long", 61), ("pkg/m.py", "method", 61)]


def test_no_library_function_is_longer_than_60_lines():
    found = long_functions(ROOT)
    assert not found, "functions over 60 lines (split them): " + ", ".join(f"{f}:{n} ({k})" for f, n, k in found)


def test_the_model_file_stays_a_backbone_and_its_head():
    lines = len((ROOT / "modeling_xl" / "modeling_transformer_xl.py").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODEL_FILE_LINES, (f"modeling_transformer_xl.py has {lines} lines; expected at most "
                                           f"{MAX_MODEL_FILE_LINES}: plumbing goes to a module of its own")


def test_the_readme_is_a_map_with_both_commands_on_its_first_screen():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (f"README.md has {len(lines)} lines; expected at most {MAX_README_LINES}: "
                                            "measurements go to benchmarks/README.md and docs/, the README links them")
    first = "\n".join(lines[:FIRST_SCREEN])
    for what, text in (("the install", "pip install -e"), ("the main command", "scripts/pretrain.py"),
                       ("the test command", "python -m pytest")):
        assert text in first, f"README.md's first {FIRST_SCREEN} lines lack {what} ({text!r})"
