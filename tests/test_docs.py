"""The docs name every command, option and error: docs/reference.md is generated
from the code and must be current; the README's commands exist."""

from __future__ import annotations

import re
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


_VARIANT = r"(?:fp32|fp16|int8|int4)-(?:onnx|tflite)"
_STATE = r"(?:normal|constrained|critical)"


def _shape(example: str) -> str:
    """A README example line -> the regex of lines of its shape: numbers, variant ids and governor states vary by machine."""
    rx = re.escape(" ".join(example.split()))
    rx = re.sub(r"(?<![A-Za-z0-9_])\d+(?:\\\.\d+)?", r"[\\d.]+", rx)  # measured numbers; not the digits of p50 or fp32
    rx = re.sub(r"(?:fp32|fp16|int8|int4)\\-(?:onnx|tflite)", _VARIANT, rx)
    return re.sub(r"\b(?:normal|constrained|critical)\b", _STATE, rx)


def test_readme_tour_runs_as_shown(tmp_path) -> None:
    """The README's tour is at most 20 lines and prints what the text under it says it prints."""
    import os

    from edge_sdk.assets import demo_samples

    readme = (ROOT / "README.md").read_text()
    m = re.search(r"## A 20-line tour\n.*?```python\n(.*?)```\n\n(It prints.*?)\n\n", readme, re.S)
    assert m, "README.md: no '## A 20-line tour' section with a python block and an 'It prints' paragraph"
    code, text = m.group(1), " ".join(m.group(2).split())
    assert len(code.splitlines()) <= 20
    (tmp_path / "tour.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT), EDGE_SDK_PROFILE="generic-x86_64")
    p = subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    # every output line the text quotes has a line of its shape in the output, in the order the text gives
    examples = [e for e in re.findall(r"`([^`]+)`", text) if " " in e]
    assert len(examples) >= 7, examples
    at = 0
    for example in examples:
        rx = re.compile(_shape(example))
        hits = [i for i, line in enumerate(out) if i >= at and rx.fullmatch(line)]
        assert hits, f"README says the tour prints {example!r}; no such line (after line {at}) in:\n" + "\n".join(out)
        at = hits[0]
    # the claims about those lines
    chosen = next(ln.removeprefix("chosen: ") for ln in out if ln.startswith("chosen: "))
    first_line = next(ln for ln in out if re.fullmatch(rf"\w+ \d\.\d\d first [\d.]+ ms, warm [\d.]+ ms {_VARIANT}", ln))
    label, score, _, first_ms, _, _, warm_ms, _, variant = first_line.replace(",", "").split()
    assert variant == chosen  # the variant the selection chose is the one that ran
    assert label == demo_samples()[0].stem.rsplit("_", 1)[0] and float(score) >= 0.5
    assert float(first_ms) > float(warm_ms)  # the first call includes importing OpenCV
    assert "InputDTypeError input 'image': expected dtype float32, got float64" in p.stdout
    n = len(demo_samples())
    frames = [ln.split() for ln in out if re.fullmatch(rf"\d+ \w+ {_STATE}", ln)]
    assert [int(f[0]) for f in frames] == list(range(n))
    assert [f[1] for f in frames] == [s.stem.rsplit("_", 1)[0] for s in demo_samples()]
    states = [f[2] for f in frames]
    # normal until the governor's first sample, then constrained (no temperature readable in CI), never back within the run
    assert set(states) <= {"normal", "constrained"} and states == sorted(states, key=["normal", "constrained"].index), states
    assert f"frames_in={n} processed={n} dropped={{}} in_flight=0 (stopped)" in out
    p50, p99 = (float(v) for v in next(ln for ln in out if ln.startswith("p50/p99 ms: ")).split()[2:])
    assert p50 <= p99 and p50 < float(first_ms) and p99 >= float(warm_ms)


def test_readme_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    docs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert docs and [d for d in docs if f"`{d}`" not in readme] == []
    assert "`samples/README.md`" in readme and "`docs/benchmarks/README.md`" in readme


def test_device_profiles_doc_lists_every_bundled_profile() -> None:
    """docs/device-profiles.md's table names every profile that ships (a new board is documented)."""
    text = (ROOT / "docs" / "device-profiles.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z0-9_-]+)` \|", text, re.M))
    shipped = {p.stem for p in (ROOT / "device_profiles").glob("*.toml")}
    assert shipped <= listed, sorted(shipped - listed)
