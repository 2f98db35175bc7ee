"""The samples run as a user runs them (a subprocess, from another folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_classify_images_sample(tmp_path: Path) -> None:
    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"nope")
    from edge_sdk.assets import demo_package_path, demo_samples

    imgs = [str(p) for p in demo_samples()[:3]] + [str(bad)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), EDGE_SDK_PROFILE="raspberry-pi-5")
    p = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "classify_images.py"), str(demo_package_path()), *imgs],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "profile raspberry-pi-5" in p.stdout and "chosen:" in p.stdout
    for img in demo_samples()[:3]:
        label = img.stem.rsplit("_", 1)[0]
        assert f"{img.name}: {label} (" in p.stdout
    assert "not-an-image.png: skipped (" in p.stdout and "median" in p.stdout


def test_every_sample_is_listed_run_by_a_test_and_has_help() -> None:
    """samples/README.md lists every sample; some test runs each one; each answers --help."""
    readme = (ROOT / "samples" / "README.md").read_text()
    tests = "".join(p.read_text() for p in (ROOT / "tests").glob("test_samples*.py"))
    samples = sorted(p for p in (ROOT / "samples").glob("*.py") if not p.name.startswith("_"))
    assert len(samples) >= 8
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for s in samples:
        assert f"`{s.name}" in readme, f"samples/README.md does not list {s.name}"
        assert f'"{s.name}"' in tests, f"no tests/test_samples*.py runs {s.name}"
        p = subprocess.run([sys.executable, str(s), "--help"], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0 and "usage:" in p.stdout.lower(), f"{s.name} --help: {p.stderr}"
