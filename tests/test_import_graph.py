"""qkv's modules import downwards only (docs/design.md §1): no import circle among them and no
arrow back up a floor. Imports inside functions count: a lazy import is still an arrow.

The floors, lowest first; a module may import its own group and any lower floor. Models and tasks
share a floor but not an arrow: a task never imports a model, nor a model a task. Inside
``attention/``, kernels take their shared helpers from ``attention/_ops.py``, not from each other.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import qkv
from qkv.registry import lookup, names

SRC = Path(qkv.__file__).resolve().parent

FLOORS: List[Dict[str, List[str]]] = [
    {"low": ["qkv._", "qkv.types", "qkv.registry"]},  # "qkv._": every qkv._name module
    {"parts": ["qkv.functional", "qkv.masks", "qkv.scores", "qkv.positional", "qkv.rotary", "qkv.alibi", "qkv.blocks"]},
    {"attention": ["qkv.attention"]},
    {"parallel": ["qkv.parallel"]},  # context parallelism: kernels on sequence shards
    {"pictures": ["qkv.viz", "qkv.viz_html"]},
    {"models": ["qkv.models"], "tasks": ["qkv.tasks"]},
    {"train": ["qkv.train"]},
    {"faces": ["qkv", "qkv.__main__", "qkv.cli", "qkv.runs", "qkv.linearize", "qkv.bench", "qkv.hf", "qkv.integrations"]},
]


def _modules() -> Dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = ["qkv", *path.relative_to(SRC).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _from_module(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <module> import ...`` written in module ``name``."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path) -> Set[str]:
    """The qkv modules ``name`` imports anywhere in its file (package ``__init__`` files that a
    dotted import runs on the way are not counted: only the module named)."""
    is_package = path.name == "__init__.py"
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(name, is_package, node)
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module for alias in node.names]
        else:
            continue
        for target in targets:
            if target != "qkv" and not target.startswith("qkv."):
                continue
            while target not in MODULES:  # qkv.attention.build_attention -> qkv.attention
                target = target.rsplit(".", 1)[0]
            if target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _place(name: str):
    """``(floor index, group)`` of a module: the most specific pattern that names it."""
    best = None
    for index, groups in enumerate(FLOORS):
        for group, patterns in groups.items():
            for pattern in patterns:
                hit = name.startswith(pattern) if pattern.endswith("_") else (
                    name == pattern or (pattern != "qkv" and name.startswith(pattern + ".")))
                if hit and (best is None or len(pattern) > best[0]):
                    best = (len(pattern), index, group)
    assert best is not None, f"{name} is on no floor: add it to FLOORS in {__file__} (and docs/design.md §1)"
    return best[1], best[2]


def test_every_module_is_on_a_floor():
    for name in MODULES:
        _place(name)


def test_no_arrow_back_up_a_floor():
    upward = []
    for name, targets in GRAPH.items():
        floor, group = _place(name)
        for target in sorted(targets):
            their_floor, their_group = _place(target)
            if their_floor > floor or (their_floor == floor and their_group != group):
                upward.append(f"{name} ({group}) imports {target} ({their_group})")
    assert not upward, "imports that go up a floor or across to a sibling:\n" + "\n".join(upward)


def test_the_low_floor_imports_only_the_low_floor():
    for name, targets in GRAPH.items():
        if _place(name)[1] == "low":
            assert all(_place(t)[1] == "low" for t in targets), (name, targets)


def test_tasks_and_attention_import_no_model():
    for name, targets in GRAPH.items():
        if name.startswith(("qkv.tasks", "qkv.attention")):
            assert not [t for t in targets if t.startswith("qkv.models")], (name, targets)


KERNEL_MODULES = {lookup("attention", n).__module__ for n in names("attention")}


def _helpers_from_siblings(name: str, source: str) -> List[str]:
    """What kernel module ``name`` imports from another kernel's module other than a class it
    subclasses: shared helpers belong in ``qkv.attention._ops``, below every kernel."""
    tree = ast.parse(source)
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for node in ast.walk(tree)
             if isinstance(node, ast.ClassDef) for b in node.bases}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in KERNEL_MODULES and a.name != name]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(name, False, node)
            for alias in node.names:
                if f"{module}.{alias.name}" in KERNEL_MODULES and f"{module}.{alias.name}" != name:
                    found.append(f"{module}.{alias.name}")  # a sibling kernel's module itself
                elif module in KERNEL_MODULES and module != name and alias.name not in bases:
                    found.append(f"{module}.{alias.name}")
    return found


def test_kernels_take_shared_helpers_from_ops_not_from_each_other():
    assert "qkv.attention.window" in KERNEL_MODULES and "qkv.attention._ops" not in KERNEL_MODULES
    found = {name: _helpers_from_siblings(name, MODULES[name].read_text(encoding="utf-8"))
             for name in sorted(KERNEL_MODULES)}
    assert not {k: v for k, v in found.items() if v}, "move these helpers to qkv/attention/_ops.py"


def test_the_sibling_check_finds_a_helper_and_allows_a_subclass():
    source = ("from .window import WindowAttention, unfold_band\n"
              "from . import softmax\n"
              "class Banded(WindowAttention):\n    pass\n")
    assert _helpers_from_siblings("qkv.attention.local", source) == ["qkv.attention.window.unfold_band",
                                                                     "qkv.attention.softmax"]


def test_no_import_circle():
    """Depth-first search for a back edge; the circle found is named in full."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                circle = path[path.index(target):] + [target]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def test_the_graph_sees_lazy_imports():
    """The parser finds an import inside a function (the kind that once hid both circles)."""
    assert "qkv.models.base" in GRAPH["qkv.models.transformer.gpt"]
    lazy = [n for n in ast.walk(ast.parse(MODULES["qkv.cli"].read_text())) if isinstance(n, ast.ImportFrom)
            and n.col_offset > 0 and (n.module or "").startswith("qkv")]
    assert lazy and all(_place(t)[0] <= _place("qkv.cli")[0] for t in GRAPH["qkv.cli"])


def test_import_qkv_fills_every_registry():
    """`import qkv` alone makes every registered name buildable (a fresh interpreter: this test
    session has imported the subpackages already)."""
    import subprocess
    import sys

    code = ("import qkv\n"
            "from qkv.registry import build, names\n"
            "assert {'shakespeare-char', 'bbc-news-tokens', 'listops'} <= set(names('task')), names('task')\n"
            "assert {'gpt', 'bert', 'reformer'} <= set(names('model')), names('model')\n"
            "assert {'softmax', 'performer', 'lsh'} <= set(names('attention')), names('attention')\n"
            "from qkv.registry import lookup\n"
            "print(type(lookup('model', 'gpt').from_config({'vocab_size': 11, 'n_layers': 1, 'd_model': 8, 'n_heads': 2})).__name__)\n"
            "print(build('task', 'copy').__class__.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "GPT" and out.stdout.split()[1]
