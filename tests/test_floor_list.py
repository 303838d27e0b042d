"""The floor pass's list (`floors.py`) names tests that exist: a renamed or deleted test would otherwise drop out of
the floor pass without a word."""

import ast
from pathlib import Path

from floors import FLOOR_FILES, FLOOR_TESTS, is_floor_test

TESTS = Path(__file__).resolve().parent


def functions_of(file: str) -> set[str]:
    tree = ast.parse((TESTS / file).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_listed_file_and_test_exists():
    missing = [f for f in FLOOR_FILES if not (TESTS / f).is_file()]
    missing += [t for t in FLOOR_TESTS if t.split("::")[1] not in functions_of(t.split("::")[0])]
    assert not missing, f"tests/floors.py names tests that do not exist: {missing}"


def test_node_ids_with_parameters_and_folders_are_matched():
    assert is_floor_test("tests/test_ecosystem.py::test_anything[a-b]")
    assert is_floor_test("tests/test_compile.py::test_training_step_compiles_to_one_graph_and_equals_eager[plm]")
    assert not is_floor_test("tests/test_compile.py::test_compiled_input_checks_stop_the_step[causal-div1]")
    assert not is_floor_test("tests/test_streams.py::test_x")
