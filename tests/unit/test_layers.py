"""The package's folders import in data-flow order: a lower folder never imports a higher one.

The order is the pipeline's: the shared vocabulary, the reference models, then trace,
rewrite, strategies, cost, the ILP, memory, the result, the planner, the runtime,
calibration and the user's tools. Read from the source (every import, those inside
functions too), so a lazy import that runs against the order fails here as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PACKAGE = REPO / "autoplan"
ORDER = [
    "core",
    "models",
    "trace",
    "rewrite",
    "strategies",
    "cost",
    "ilp",
    "memory",
    "result",
    "planner",
    "runtime",
    "calibrate",
    "tools",
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every autoplan module ``path`` imports, by absolute name."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.startswith("autoplan"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("autoplan"))
    return found


def _folder(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def test_every_folder_is_in_the_order():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ORDER)


def test_no_relative_imports():
    """Absolute imports only, so the check below sees every import."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        relative = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
        assert not relative, f"{path}: relative imports at lines {relative}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: _module_name(p))
def test_a_folder_imports_only_its_own_and_lower_folders(path):
    own = _folder(_module_name(path))
    assert own is not None
    higher = sorted(
        name
        for name in _imports(path)
        if (folder := _folder(name)) is not None and ORDER.index(folder) > ORDER.index(own)
    )
    assert not higher, f"{_module_name(path)} ({own}) imports higher folders: {higher}"


def test_the_top_level_holds_few_modules_and_each_folder_says_what_it_is():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    for folder in ORDER:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 15, f"autoplan/{folder}/__init__.py needs a docstring"
        assert "May import" in doc, f"autoplan/{folder}/__init__.py: say what it may import"
