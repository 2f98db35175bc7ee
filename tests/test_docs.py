"""The docs name every command, option and error: docs/reference.md is generated
from the code and must be current; the README's commands exist."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_reference_is_current() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_reference.py"), "--check"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_readme_names_every_cli_command() -> None:
    import edge_sdk.cli as sdk_cli

    readme = (ROOT / "README.md").read_text()
    ref = (ROOT / "docs" / "reference.md").read_text()
    for sub in ("profile", "inspect", "predict", "demo"):
        assert f"edge-sdk {sub}" in readme and f"### `edge-sdk {sub}`" in ref
    for sub in ("package", "verify", "quantize", "validate", "inspect"):
        assert f"edge-convert {sub}" in readme and f"### `edge-convert {sub}`" in ref
    assert sdk_cli.build_parser().prog == "edge-sdk"


def test_ci_runs_the_readme_test_command() -> None:
    ci_last = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()][-1]
    assert "python3 -m pytest" in ci_last and ci_last in (ROOT / "README.md").read_text()


def test_readme_tour_runs_as_shown(tmp_path) -> None:
    """The README's tour is at most 20 lines and does what the text under it says."""
    import os
    import re

    from edge_sdk.assets import demo_samples

    readme = (ROOT / "README.md").read_text()
    m = re.search(r"## A 20-line tour\n.*?```python\n(.*?)```", readme, re.S)
    assert m, "README.md: no '## A 20-line tour' section with a python block"
    code = m.group(1)
    assert len(code.splitlines()) <= 20
    (tmp_path / "tour.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT), EDGE_SDK_PROFILE="generic-x86_64")
    p = subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    first = demo_samples()[0].stem.rsplit("_", 1)[0]
    assert "chosen: " in out and re.search(rf"^{first} \d\.\d\d [\d.]+ ms \S+-\w+$", out, re.M), out
    assert "InputDTypeError input 'image': expected dtype float32, got float64" in out
    n = len(demo_samples())
    lines = [ln.split() for ln in out.splitlines() if re.match(r"^\d+ \w+ (normal|constrained|critical)$", ln)]
    assert [int(ln[0]) for ln in lines] == list(range(n))
    assert [ln[1] for ln in lines] == [s.stem.rsplit("_", 1)[0] for s in demo_samples()]
    assert f"frames_in={n} processed={n} dropped={{}} in_flight=0 (stopped)" in out
    assert re.search(r"^p99 [\d.]+ ms$", out, re.M)


def test_readme_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    docs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert docs and [d for d in docs if f"`{d}`" not in readme] == []
    assert "`samples/README.md`" in readme and "`docs/benchmarks/README.md`" in readme
