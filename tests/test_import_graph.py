"""No module of the package imports one that imports it back, directly or through others.

The graph is read from the source with `ast`, not by importing: every `import` and `from ... import` anywhere in a
file (module level, inside functions, under `if TYPE_CHECKING`) is an edge, relative or absolute. Importing
`a.b.c` also runs the `__init__.py` of `a` and `a.b`, so those packages are edges too, except the importer's own
enclosing packages (already being imported when the importer runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("modeling_xl", "tokenization")


def module_names(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `packages` under `root` (a package is its __init__.py)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _with_packages(target: str, importer: str, known: dict) -> set[str]:
    """`target` and the packages above it whose __init__ importing it runs (not the importer's own packages)."""
    parts = target.split(".")
    names = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {n for n in names if n in known and n != importer and not importer.startswith(n + ".")}


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """The modules among `known` that module `name` (file `path`) imports anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _with_packages(alias.name, name, known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found |= _with_packages(module, name, known)
            for alias in node.names:  # `from pkg import submodule`
                if f"{module}.{alias.name}" in known:
                    found |= _with_packages(f"{module}.{alias.name}", name, known)
    found.discard(name)
    return found


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    known = module_names(root, packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle `[a, b, ..., a]` per strongly connected component that has one (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]

    def strongconnect(start):
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(component)

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return [_cycle_through(min(component), component, graph) for component in components]


def _cycle_through(start: str, component: set, graph: dict) -> list[str]:
    """A shortest path start -> ... -> start inside `component` (breadth first)."""
    parents, frontier = {}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1] + [start]
                if child in component and child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in no cycle of {sorted(component)}")


def test_cycle_finder_on_a_synthetic_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a", "e"}, "f": {"g"}, "g": {"f"}}
    cycles = find_cycles(graph)
    assert sorted(cycles) == [["a", "b", "c", "a"], ["e", "e"], ["f", "g", "f"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_walker_sees_function_level_relative_and_absolute_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .top import Top\n")
    (pkg / "top.py").write_text("def load():\n    from .sub.leaf import Leaf\n    return Leaf\nclass Top: pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("from .. import top\nimport pkg.sub.other\nclass Leaf: pass\n")
    (pkg / "sub" / "other.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from pkg.top import Top\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {
        "pkg": {"pkg.top"},
        "pkg.top": {"pkg.sub", "pkg.sub.leaf"},
        "pkg.sub": set(),
        "pkg.sub.leaf": {"pkg.top", "pkg.sub.other"},
        "pkg.sub.other": {"pkg.top"},
    }
    assert find_cycles(graph) == [["pkg.sub.leaf", "pkg.top", "pkg.sub.leaf"]]


def test_importing_a_sibling_package_module_runs_its_init(tmp_path):
    """`from ..train.steps import x` runs `train/__init__.py`, which may import the importer back."""
    pkg = tmp_path / "pkg"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "evaluation.py").write_text("from .train.steps import score\n")
    (pkg / "train" / "__init__.py").write_text("from .loop import run\n")
    (pkg / "train" / "steps.py").write_text("def score(): pass\n")
    (pkg / "train" / "loop.py").write_text("def run():\n    from ..evaluation import x\n")
    cycles = find_cycles(import_graph(tmp_path, ("pkg",)))
    assert cycles == [["pkg.evaluation", "pkg.train", "pkg.train.loop", "pkg.evaluation"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = import_graph(ROOT)
    assert any(name.startswith(package) for name in graph)
    cycles = [c for c in find_cycles(graph) if c[0].split(".")[0] == package]
    assert not cycles, "import cycles (each module imports the next):\n" + "\n".join(" -> ".join(c) for c in cycles)


def _saved_folder(tmp_path, kind: str) -> Path:
    from modeling_xl import (
        TransformerXLConfig,
        TransformerXLForCausalLM,
        TransformerXLForPermutationLM,
        TransformerXLForSequenceClassification,
    )

    uni = TransformerXLConfig.from_preset("debug")
    bi = TransformerXLConfig.from_preset("debug", adaptive=False, cutoffs=[], tie_projs=[False], attn_type="bi")
    model = {"causal_lm": lambda: TransformerXLForCausalLM(uni),
             "permutation_lm": lambda: TransformerXLForPermutationLM(bi),
             "classifier": lambda: TransformerXLForSequenceClassification(uni),
             "bidirectional_classifier": lambda: TransformerXLForSequenceClassification(bi)}[kind]()
    model.save_pretrained(tmp_path / kind)
    return tmp_path / kind


@pytest.mark.parametrize("kind", ["causal_lm", "permutation_lm", "classifier", "bidirectional_classifier"])
def test_saved_folder_code_is_self_contained(tmp_path, kind):
    """Every module a saved folder's auto_map names is in it, and so is every module those import (anywhere in their
    text): trust_remote_code loads the folder where this package cannot be imported."""
    import json

    folder = _saved_folder(tmp_path, kind)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    files = {path.stem: path for path in folder.glob("*.py")}
    named = {reference.split(".")[0] for reference in auto_map.values()}
    assert named <= set(files), f"auto_map names {sorted(named - set(files))}, absent from {sorted(files)}"
    graph = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module, f"{path.name}: `from {'.' * node.level}{node.module or ''} " \
                    "import` reaches outside the folder (transformers copies single-dot module imports only)"
                graph[name].add(node.module)
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
            outside = [m for m in modules if m.split(".")[0] in PACKAGES]
            assert not outside, f"{path.name} imports {outside}, which a remote-code process cannot import"
    missing = {name: sorted(imported - set(files)) for name, imported in graph.items() if imported - set(files)}
    assert not missing, f"saved folder {kind} lacks the modules its code imports: {missing}"
    assert not find_cycles(graph)
