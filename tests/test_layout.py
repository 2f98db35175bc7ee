"""tools/ layout: tests/ and samples/ import fixtures (tools.fixtures), never a benchmark
(tools.bench); tools/fixtures imports nothing from tools.bench either. So editing a benchmark
changes no test input and no fixture cache key (the face package's, for one). A test that runs a
benchmark end to end runs it as a script (``python tools/bench/NAME.py``), as a user does."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

BENCH = "tools.bench"
#: Code handed to ``python -c`` (or exec) in a string: an import of a benchmark there counts too.
_CODE_IMPORT = re.compile(r"(?:^|[\s;])(?:from\s+tools\.bench\b|import\s+tools\.bench\b|from\s+tools\s+import\s+(?:[\w\s,]*,\s*)?bench\b)")


def _is_bench(module: str) -> bool:
    return module == BENCH or module.startswith(BENCH + ".")


def _package_of(path: Path) -> str:
    """The dotted package of a file in the checkout (for its relative imports): tools/fixtures/x.py
    is in ``tools.fixtures``; a file in tests/ or samples/ (not packages) in none ('')."""
    parts = list(path.resolve().parent.relative_to(ROOT).parts)
    if not all((ROOT.joinpath(*parts[: i + 1]) / "__init__.py").exists() for i in range(len(parts))):
        return ""
    return ".".join(parts)


def bench_imports(path: Path, package: str | None = None) -> list[str]:
    """``file:line: what`` for every import of tools.bench (or a module under it) in ``path``:
    ``import``, ``from ... import`` (relative ones resolved against ``package``, by default the
    file's own), ``importlib.import_module`` / ``__import__`` with a literal name, and imports in
    code strings (``python -c``)."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    inside = path.resolve().is_relative_to(ROOT)
    rel = path.resolve().relative_to(ROOT).as_posix() if inside else str(path)
    pkg = package if package is not None else _package_of(path) if inside else ""
    found: list[str] = []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{rel}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_bench(a.name):
                    hit(node, f"import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = pkg.split(".") if pkg else []
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            if any(_is_bench(t) for t in targets):
                hit(node, f"from {'.' * node.level}{node.module or ''} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__") and _is_bench(node.args[0].value):
                hit(node, f"{name}({node.args[0].value!r})")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CODE_IMPORT.search(node.value):
            if not (path.resolve() == Path(__file__).resolve()):  # this file's own patterns and examples
                hit(node, f"code string importing {BENCH}: {node.value.strip()[:80]!r}")
    return found


def _py_files(*folders: str) -> list[Path]:
    return sorted(p for d in folders for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_tests_and_samples_import_no_benchmark() -> None:
    files = _py_files("tests", "samples")
    assert len(files) > 50 and ROOT / "tests" / "test_samples_vision.py" in files  # the walk really found them
    found = [f for p in files for f in bench_imports(p)]
    assert not found, (
        "tests/ and samples/ must not import tools.bench (move what they need into tools/fixtures, or run "
        "the benchmark as a script):\n" + "\n".join(found)
    )


def test_fixtures_import_no_benchmark() -> None:
    files = _py_files("tools/fixtures")
    assert ROOT / "tools" / "fixtures" / "face_package.py" in files
    found = [f for p in files for f in bench_imports(p)]
    assert not found, "tools/fixtures must not import tools.bench (the benchmarks build on the fixtures):\n" + "\n".join(found)


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    """The guard is not vacuous: each way of importing a benchmark is reported, with its line."""
    forms = [
        "import tools.bench",
        "import tools.bench.bench_pipeline as bp",
        "from tools.bench import bench_thermal",
        "from tools.bench.soak import run_soak",
        "from tools import bench",
        "from tools import fixtures, bench",
        "importlib.import_module('tools.bench.bench_overhead')",
        "code = \"import sys; from tools.bench.bench_overhead import main\"",
    ]
    fine = ["import tools.fixtures.face_package", "from tools.fixtures.soak_runs import run_soak", "from tools import fixtures",
            "import tools.benchmarks_notes", "s = 'tools/bench/soak.py'"]  # fmt: skip
    probe = tmp_path / "test_probe.py"
    probe.write_text("import importlib\n" + "\n".join(fine + forms) + "\n")
    found = bench_imports(probe)
    lines = [int(f.split(":")[1]) for f in found]
    first = 2 + len(fine)
    assert lines == list(range(first, first + len(forms))), found


def test_a_relative_import_in_a_fixture_resolves(tmp_path: Path) -> None:
    assert _package_of(ROOT / "tools" / "fixtures" / "face_package.py") == "tools.fixtures"
    assert _package_of(ROOT / "tests" / "conftest.py") == ""
    probe = tmp_path / "probe.py"  # as if it were a module of tools/fixtures
    probe.write_text("from ..bench import soak\nfrom . import face_clip\nfrom ..bench.bench_pipeline import main\n")
    found = bench_imports(probe, package="tools.fixtures")
    assert [int(f.split(":")[1]) for f in found] == [1, 3], found


def test_the_face_package_key_covers_no_benchmark() -> None:
    """The face package's cache key hashes the code it builds from (tools/fixtures/face_package.py,
    the translator, the fp16 converter): no benchmark file, so editing one never rebuilds it."""
    from tools.fixtures.face_package import key_sources

    srcs = key_sources()
    assert srcs and all(p.is_file() for p in srcs), srcs
    names = {p.resolve().relative_to(ROOT).as_posix() for p in srcs}
    assert names == {
        "tools/fixtures/face_package.py", "tools/fixtures/tflite_to_onnx.py", "converters/tflite_import.py", "converters/quantize.py",
    }, names  # fmt: skip
    assert not any(n.startswith("tools/bench/") for n in names)
