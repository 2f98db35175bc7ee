"""The caches that spare a fresh process work an earlier one did: parsed device profiles
(``<cache>/profile-docs.json``), parsed manifests and model-file scans (``<cache>/package-scans.json``).

Each is checked in real child processes sharing one cache folder: the second process gives exactly
what a first parse gives (and the same errors), picks up a changed or new file, and ignores a damaged
entry (rewriting it) instead of trusting it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_sdk import _toml
from edge_sdk.package.model_package import SCAN_CACHE_NAME, _scan_from_json, _scan_to_json
from edge_sdk.package.modelfile import inspect_tflite, scan_onnx
from edge_sdk.profiles.profile import DOC_CACHE_NAME, profiles_dir
from tests.conftest import mlp_manifest, mlp_onnx

ROOT = Path(__file__).resolve().parents[1]

PROFILES = """
import json, sys
from edge_sdk.profiles.profile import bundled_profiles
out = [p.to_dict() for p in bundled_profiles()]
print(json.dumps({"profiles": out, "tomllib": "tomllib" in sys.modules}, default=str))
"""

ONE = """
import json, sys
from edge_sdk.errors import ProfileError
from edge_sdk.profiles import load_profile
try:
    p = load_profile(sys.argv[1])
    print(json.dumps({"profile": p.to_dict(), "tomllib": "tomllib" in sys.modules}, default=str))
except ProfileError as e:
    print(json.dumps({"error": str(e), "tomllib": "tomllib" in sys.modules}))
"""

OPEN = """
import json, sys
from edge_sdk.errors import EdgeSDKError
from edge_sdk.package import ModelPackage
from edge_sdk.package import model_package as mp
try:
    pkg = ModelPackage.open(sys.argv[1])
except EdgeSDKError as e:
    print(json.dumps({"error": type(e).__name__ + ": " + str(e)}))
    raise SystemExit(0)
v = pkg.manifest.variants[0]
scan = mp._SCANS.get((v.format, v.sha256))
print(json.dumps({"manifest": pkg.manifest.to_dict(), "sha": pkg.manifest_sha256, "scan": mp._scan_to_json(v.format, scan),
                  "tomllib": "tomllib" in sys.modules}, default=str))
"""


def _child(code: str, cache: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "EDGE_SDK_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _damage(store: Path, pick: str) -> None:
    """Change the JSON text of the entry whose key starts with ``pick``, leaving its checksum as it was."""
    data = json.loads(store.read_text())
    key = next(k for k in data["entries"] if k.startswith(pick))
    text, check = data["entries"][key]
    data["entries"][key] = [text.replace("1", "7", 1) if "1" in text else text + " ", check]
    store.write_text(json.dumps(data))


def test_bundled_profiles_from_the_cache_are_those_a_parse_gives(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _child(PROFILES, cache)
    assert first["tomllib"] and (cache / DOC_CACHE_NAME).is_file()
    second = _child(PROFILES, cache)
    assert second["profiles"] == first["profiles"]
    assert not second["tomllib"]  # no TOML parsed: every document came from the cache
    names = sorted(p.stem for p in profiles_dir().glob("*.toml"))
    assert [p["name"] for p in second["profiles"]] == names


def test_a_damaged_or_garbage_profile_cache_is_ignored_and_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    good = _child(PROFILES, cache)["profiles"]
    store = cache / DOC_CACHE_NAME
    _damage(store, "")
    again = _child(PROFILES, cache)
    assert again["profiles"] == good and again["tomllib"]  # the damaged entry was parsed afresh
    assert not _child(PROFILES, cache)["tomllib"]  # and written again
    store.write_text("{not json")
    assert _child(PROFILES, cache)["profiles"] == good
    assert not _child(PROFILES, cache)["tomllib"]


def test_a_cached_document_that_fails_validation_is_not_trusted(tmp_path: Path) -> None:
    """An entry with a valid checksum but a document the schema refuses: the file itself decides."""
    cache = tmp_path / "cache"
    good = _child(PROFILES, cache)["profiles"]
    store = cache / DOC_CACHE_NAME
    data = json.loads(store.read_text())
    for key, (text, _check) in data["entries"].items():
        doc = json.loads(text)
        doc["schema"] = 99
        t = json.dumps(doc, ensure_ascii=False)
        data["entries"][key] = [t, __import__("hashlib").sha256(t.encode()).hexdigest()]
    store.write_text(json.dumps(data))
    assert _child(PROFILES, cache)["profiles"] == good


def test_a_changed_profile_file_is_parsed_again_and_errors_stay_the_same(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    src = (profiles_dir() / "raspberry-pi-5.toml").read_text()
    p = tmp_path / "raspberry-pi-5.toml"
    p.write_text(src)
    a = _child(ONE, cache, str(p))
    assert a["tomllib"] and not _child(ONE, cache, str(p))["tomllib"]
    p.write_text(src.replace('display_name = "', 'display_name = "Rewritten ', 1))
    b = _child(ONE, cache, str(p))
    assert b["profile"]["display_name"].startswith("Rewritten ") and b["tomllib"]
    assert not a["profile"]["display_name"].startswith("Rewritten ")
    assert _child(ONE, cache, str(p))["profile"] == b["profile"]
    # a file that parses but fails validation: the same error from a fresh parse and from the cached document
    p.write_text(src.replace("schema = 1", "schema = 2", 1))
    e1 = _child(ONE, cache, str(p))
    e2 = _child(ONE, cache, str(p))
    assert "schema: expected 1, got 2" in e1["error"] and e2["error"] == e1["error"]
    # bad TOML is never cached: the same error each time
    p.write_text(src + "\n[[[")
    t1, t2 = _child(ONE, cache, str(p)), _child(ONE, cache, str(p))
    assert "not valid TOML" in t1["error"] and t2["error"] == t1["error"]


def test_json_store_keeps_only_what_json_gives_back(tmp_path: Path) -> None:
    import datetime

    store = _toml.JsonStore(tmp_path / "s.json", "t1")
    store.put("a", {"x": [1, 2.5, "s", True, None]})
    store.put("date", {"when": datetime.date(2024, 1, 1)})
    store.put("tuple", {"t": (1, 2)})
    store.put("nan", {"f": float("nan")})
    store.flush()
    again = _toml.JsonStore(tmp_path / "s.json", "t1")
    assert again.get("a") == {"x": [1, 2.5, "s", True, None]}
    assert again.get("date") is None and again.get("tuple") is None and again.get("nan") is None
    assert _toml.JsonStore(tmp_path / "s.json", "t2").get("a") is None  # another tag (SDK version): empty


def _tflite(quant_scale: float | None = None) -> bytes:
    import struct

    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.input("x", shape=(1, 8), dtype="float32" if quant_scale is None else "int8", quant=None if quant_scale is None else (0.5, 0))
    b.output(b.relu(x), "y")
    data = b.build()
    if quant_scale is not None:
        data = data.replace(struct.pack("<f", 0.5), struct.pack("<f", quant_scale))
    return data


def _tflite_package(root: Path, model: bytes) -> Path:
    from converters.packaging import write_package

    m = mlp_manifest(8, 8, file="m.tflite")
    m["inputs"][0].update(shape=[1, 8])
    del m["inputs"][0]["dims"]
    m["outputs"][0].update(shape=[1, 8])
    m["variants"][0].update(backend="litert")
    root.mkdir(parents=True, exist_ok=True)
    (root / "m.tflite").write_bytes(model)
    write_package(root, m, {}, overwrite=True, verify=False)
    return root


@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_scans_and_manifests_are_remembered_across_processes(tmp_path: Path, fmt: str) -> None:
    from converters.packaging import write_package

    cache = tmp_path / "cache"
    if fmt == "onnx":
        pkg = tmp_path / "mlp"
        write_package(pkg, mlp_manifest(), {"m.onnx": mlp_onnx()})
        model = mlp_onnx()
        fresh = _scan_to_json("onnx", scan_onnx(model))
    else:
        model = _tflite()
        pkg = _tflite_package(tmp_path / "tfl", model)
        fresh = _scan_to_json("tflite", inspect_tflite(model))
    first = _child(OPEN, cache, str(pkg))
    assert first["tomllib"] and first["scan"] == fresh
    second = _child(OPEN, cache, str(pkg))
    assert not second["tomllib"]  # the manifest document came from the cache
    assert second["scan"] == fresh and second["manifest"] == first["manifest"] and second["sha"] == first["sha"]
    entries = json.loads((cache / SCAN_CACHE_NAME).read_text())["entries"]
    assert any(k.startswith(f"{fmt}:") for k in entries) and any(k.startswith("manifest:") for k in entries)
    # a damaged scan entry is scanned again (same result) and rewritten; so is a damaged manifest entry
    _damage(cache / SCAN_CACHE_NAME, f"{fmt}:")
    _damage(cache / SCAN_CACHE_NAME, "manifest:")
    third = _child(OPEN, cache, str(pkg))
    assert third["scan"] == fresh and third["manifest"] == first["manifest"] and third["tomllib"]
    assert not _child(OPEN, cache, str(pkg))["tomllib"]


def test_a_changed_model_is_scanned_again(tmp_path: Path) -> None:
    """An entry is keyed by the digest of the bytes: a model replaced (and re-digested in its manifest) by one
    with a corrupt quantization scale is refused even though the good one passed from the same cache."""
    cache = tmp_path / "cache"
    pkg = _tflite_package(tmp_path / "tfl", _tflite(0.5))
    assert "error" not in _child(OPEN, cache, str(pkg))
    _tflite_package(pkg, _tflite(float("nan")))
    bad = _child(OPEN, cache, str(pkg))
    assert bad["error"].startswith("ModelFormatError") and "quantization.scale" in bad["error"]
    assert _child(OPEN, cache, str(pkg))["error"] == bad["error"]  # a failed scan is not remembered
    # and the manifest digest is still checked: bytes changed behind the manifest are refused
    (pkg / "m.tflite").write_bytes(_tflite(0.25))
    assert _child(OPEN, cache, str(pkg))["error"].startswith("IntegrityError")


def test_scan_entries_that_are_not_well_formed_are_refused() -> None:
    good = _scan_to_json("tflite", inspect_tflite(_tflite()))
    assert _scan_from_json("tflite", good) == inspect_tflite(_tflite())
    assert _scan_from_json("tflite", good).weights == inspect_tflite(_tflite()).weights
    for bad in ({**good, "version": "3"}, {**good, "weights": [[1, 2]]}, {**good, "extra": 1}, [], None, {**good, "size": True}):
        assert _scan_from_json("tflite", bad) is None
    onnx = _scan_to_json("onnx", scan_onnx(mlp_onnx()))
    back = _scan_from_json("onnx", onnx)
    assert back == scan_onnx(mlp_onnx()) and back.weights == scan_onnx(mlp_onnx()).weights
    assert _scan_from_json("onnx", {**onnx, "inputs": [["x", 1, "float32"]]}) is None
    assert _scan_from_json("onnx", {**onnx, "op_types": "MatMul"}) is None
    assert _scan_from_json("sniff", 3) is None and _scan_from_json("sniff", "onnx") == "onnx"


@pytest.mark.parametrize(
    "raw",
    [b"schema = 1\n", b"S\n", b"S'abc'\n.", b'S"abc"\n.', b"Sabc\n.", b"S", b"Sabc", b"S'x\n", b"S \nremain", b"Sno newline found\n"],
)
def test_looks_pickled_shortcut_agrees_with_pickletools(raw: bytes) -> None:
    import io
    import pickletools
    import warnings

    from edge_sdk.package.modelfile import looks_pickled

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pickletools.dis(raw, out=io.StringIO())
        expected = True
    except Exception:  # noqa: BLE001
        expected = False
    assert looks_pickled(raw) is expected
