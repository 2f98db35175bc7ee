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
