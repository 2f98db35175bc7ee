"""The structure, kept by CI: the import-linter contracts in pyproject.toml (layers from ``cli``
down to ``errors``, ``edge_sdk`` never importing ``converters``, no cycles between the modules of
any package) hold, and they bite: the same contracts over a copy of the tree with one upward
import, one converter import or one cycle planted in it are broken. The type checker (mypy,
strict, configured in pyproject.toml) finds nothing, and every subpackage has a face: an
``__init__`` whose ``__all__`` names resolve. docs/ARCHITECTURE.md draws the layers."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

LINT = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    assert LINT is not None, "lint-imports not installed: pip install -e '.[dev]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "400"}  # one contract per line
    # --no-cache: the copy's graph must be built from its own files
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept() -> None:
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("edge_sdk layers", "edge_sdk never imports converters", "no import cycles"):
        assert any(name in line and "KEPT" in line for line in r.stdout.splitlines()), (name, r.stdout)


def _copy_tree(dst: Path) -> Path:
    for name in ("edge_sdk", "converters"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "assets", "_profiles"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


PLANTS = {
    # an upward import: the governor reaching for the model it acts on (what budget/actions.py is for)
    "layers": ("edge_sdk/budget/types.py", "from ..model import Model  # planted\n", "edge_sdk layers"),
    # the device runtime depending on the model owner's tooling
    "converters": ("edge_sdk/selection.py", "import converters.packaging  # planted\n", "edge_sdk never imports converters"),
    # a cycle between two modules of one package, hidden in a function
    "cycle": ("edge_sdk/remote/privacy.py", "def _planted():\n    from .client import RemoteClient\n", "no import cycles"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_import_contracts_catch_a_planted_violation(tmp_path: Path, plant: str) -> None:
    root = _copy_tree(tmp_path)
    rel, code, contract = PLANTS[plant]
    with open(root / rel, "a", encoding="utf-8") as f:
        f.write("\n\n" + code)
    r = _lint(root)
    assert r.returncode != 0, r.stdout
    broken = [line for line in r.stdout.splitlines() if "BROKEN" in line]
    assert any(contract in line for line in broken), r.stdout
    assert len(broken) == 1, broken  # only the contract the plant breaks


def test_type_checker_finds_nothing() -> None:
    mypy = pytest.importorskip("mypy.api", reason="mypy is in the dev extra")
    out, err, status = mypy.run([])  # files, strictness and overrides: [tool.mypy] in pyproject.toml
    assert status == 0, out + err
    assert "Success: no issues found" in out


def test_py_typed_ships() -> None:
    assert (ROOT / "edge_sdk" / "py.typed").is_file()


SUBPACKAGES = sorted(
    "edge_sdk." + p.parent.relative_to(ROOT / "edge_sdk").as_posix().replace("/", ".")
    for p in (ROOT / "edge_sdk").glob("*/__init__.py")
    if p.parent.name != "assets"
)


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_subpackage_has_a_face(name: str) -> None:
    mod = importlib.import_module(name)
    names = getattr(mod, "__all__", None)
    assert names, f"{name}/__init__.py exports nothing (__all__)"
    missing = [n for n in names if getattr(mod, n, None) is None and not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names that do not resolve: {missing}"


LAZY_FACES = sorted(
    p for p in [ROOT / "edge_sdk" / "__init__.py", *(ROOT / "edge_sdk").glob("*/__init__.py")] if "_LAZY = {" in p.read_text(encoding="utf-8")
)


@pytest.mark.parametrize("path", LAZY_FACES, ids=lambda p: p.parent.name)
def test_a_lazy_face_shows_type_checkers_what_it_loads(path: Path) -> None:
    """The ``_LAZY`` table (what runs) and the ``if TYPE_CHECKING:`` imports (what mypy and readers
    see) name the same things from the same modules, and each lookup gives the real object."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    lazy: dict[str, str] = {}
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            lazy = ast.literal_eval(node.value)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for imp in ast.walk(node):
                if isinstance(imp, ast.ImportFrom) and imp.level == 1:
                    typed.update({a.name: imp.module or "" for a in imp.names})
    assert lazy and lazy == typed, sorted(set(lazy.items()) ^ set(typed.items()))
    package = "edge_sdk" if path.parent.name == "edge_sdk" else f"edge_sdk.{path.parent.name}"
    face = importlib.import_module(package)
    for name, mod in lazy.items():
        assert getattr(face, name) is getattr(importlib.import_module(f"{package}.{mod}"), name)
        assert name in vars(face)  # kept after the first lookup
