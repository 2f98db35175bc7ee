"""Which ONNX Runtime build is installed: real importlib.metadata over real ``*.dist-info`` folders.

Each case builds a site folder in tmp (``NAME-VERSION.dist-info/METADATA`` + ``RECORD``, and the
``onnxruntime/`` files the last-installed build wrote) and runs the detection in a fresh
``python -S`` whose sys.path is that folder and the repository, so nothing from the venv's
site-packages (the real CPU build) is seen.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

INFO = "onnxruntime/capi/build_and_package_info.py"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _info_text(package_name: str) -> bytes:
    return f"package_name = '{package_name}'\n__version__ = '1.20.0'\n".encode()


def add_dist(site: Path, name: str, version: str = "1.20.0", *, files: tuple[str, ...] = ("onnxruntime/__init__.py", INFO), info_for: str | None = None) -> None:
    """A ``*.dist-info`` as pip writes it. ``info_for``: the package_name whose build_and_package_info.py this RECORD hashes
    (default: ``name``, i.e. the file this build ships)."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for f in files:
        data = _info_text(info_for or name) if f == INFO else b"# fake\n"
        rows.append(f"{f},sha256={_b64(data)},{len(data)}")
    rows.append(f"{folder.name}/METADATA,,")
    rows.append(f"{folder.name}/RECORD,,")
    (folder / "RECORD").write_text("\n".join(rows) + "\n")


def write_module(site: Path, package_name: str) -> None:
    """The onnxruntime/ files on disk: those of the build installed last."""
    (site / "onnxruntime" / "capi").mkdir(parents=True, exist_ok=True)
    (site / "onnxruntime" / "__init__.py").write_text("# fake\n")
    (site / "onnxruntime" / "capi" / "build_and_package_info.py").write_bytes(_info_text(package_name))


def detect(site: Path) -> dict:
    code = (
        "import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "from edge_sdk._deps import onnxruntime_builds\n"
        "print(json.dumps(onnxruntime_builds().to_dict()))\n"
    )
    p = subprocess.run([sys.executable, "-S", "-c", code, str(site), str(ROOT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize(
    "name", ["onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-qnn", "onnxruntime-directml", "onnxruntime-training", "onnxruntime"]
)
def test_one_build_is_named(tmp_path: Path, name: str) -> None:
    add_dist(tmp_path, name)
    write_module(tmp_path, name)
    d = detect(tmp_path)
    assert [b["name"] for b in d["installed"]] == [name]
    assert d["installed"][0]["version"] == "1.20.0" and d["installed"][0]["location"] == str(tmp_path)
    assert d["active"] == name and d["warnings"] == []


def test_nightly_builds_match_by_prefix_and_genai_does_not_count(tmp_path: Path) -> None:
    add_dist(tmp_path, "ort-nightly-gpu", "1.21.0.dev20241010")
    # onnxruntime-genai ships onnxruntime_genai/, not onnxruntime/: it is not a build of the runtime
    add_dist(tmp_path, "onnxruntime-genai", "0.5.0", files=("onnxruntime_genai/__init__.py",))
    write_module(tmp_path, "ort-nightly-gpu")
    d = detect(tmp_path)
    assert [(b["name"], b["version"]) for b in d["installed"]] == [("ort-nightly-gpu", "1.21.0.dev20241010")]
    assert d["active"] == "ort-nightly-gpu" and d["warnings"] == []


def test_two_builds_warn_and_the_record_hash_says_which_won(tmp_path: Path) -> None:
    add_dist(tmp_path, "onnxruntime", "1.20.0")
    add_dist(tmp_path, "onnxruntime-gpu", "1.20.0")
    write_module(tmp_path, "onnxruntime-gpu")  # installed last: its files are the ones on disk
    d = detect(tmp_path)
    assert sorted(b["name"] for b in d["installed"]) == ["onnxruntime", "onnxruntime-gpu"]
    assert d["active"] == "onnxruntime-gpu" and "RECORD hash" in d["how"]
    (warning,) = d["warnings"]
    assert "2 ONNX Runtime builds are installed (onnxruntime 1.20.0, onnxruntime-gpu 1.20.0)" in warning
    assert "overwrite each other's files" in warning and "onnxruntime-gpu's" in warning
    assert "pip uninstall onnxruntime onnxruntime-gpu" in warning


def test_two_builds_without_a_matching_hash_fall_back_to_package_name(tmp_path: Path) -> None:
    # Both RECORDs hash some other build's file (as after a partial reinstall): the file's own package_name decides.
    add_dist(tmp_path, "onnxruntime-openvino", info_for="something-else")
    add_dist(tmp_path, "onnxruntime", info_for="something-else")
    write_module(tmp_path, "onnxruntime-openvino")
    d = detect(tmp_path)
    assert d["active"] == "onnxruntime-openvino" and "package_name = 'onnxruntime-openvino'" in d["how"]
    assert len(d["warnings"]) == 1


def test_no_build_installed(tmp_path: Path) -> None:
    d = detect(tmp_path)
    assert d["installed"] == [] and d["active"] is None and d["how"] == "not installed"


def _site_without_onnxruntime(tmp_path: Path) -> Path:
    """A site folder with numpy (linked from the venv) and no ONNX Runtime at all."""
    site = tmp_path / "site"
    site.mkdir()
    np_dir = Path(np.__file__).parent
    for entry in np_dir.parent.iterdir():
        if entry.name == "numpy" or entry.name.startswith(("numpy.libs", "numpy-")):
            (site / entry.name).symlink_to(entry)
    return site


def test_missing_onnxruntime_is_a_typed_error_naming_the_extras(tmp_path: Path) -> None:
    site = _site_without_onnxruntime(tmp_path)
    code = (
        "import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "from edge_sdk.backends import ort, open_session, ModelSource, SessionOptions\n"
        "from edge_sdk.errors import BackendUnavailableError\n"
        "s = ort.status()\n"
        "try:\n"
        "    open_session('onnxruntime', ModelSource(b'', sys.argv[1], ''), SessionOptions())\n"
        "except BackendUnavailableError as e:\n"
        "    unavailable = str(e)\n"
        "print(json.dumps({'available': s.available, 'detail': s.detail, 'build': s.build, 'unavailable': unavailable}))\n"
    )
    p = subprocess.run([sys.executable, "-S", "-c", code, str(site), str(ROOT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["available"] is False and d["build"] == ""
    for text in (d["detail"], d["unavailable"]):
        assert text.startswith("onnxruntime is not installed (No module named 'onnxruntime')"), text
        assert 'pip install "edge-sdk[cpu]"' in text and 'pip install "edge-sdk[gpu]"' in text and "Jetson" in text, text


def test_status_and_profile_name_the_installed_build() -> None:
    from edge_sdk.backends.base import backend_status

    s = backend_status("onnxruntime")
    assert s.available and s.build == "onnxruntime" and s.notes == ()  # the venv has the CPU build ([all] -> [cpu])
    p = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "profile", "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    backends = json.loads(p.stdout)["backends"]
    assert backends["onnxruntime"]["build"] == "onnxruntime" and backends["onnxruntime"]["notes"] == []
    p = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "profile"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert f"onnxruntime: onnxruntime {s.version} (build onnxruntime)" in p.stdout


def test_extras_make_the_flavour_a_choice() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("onnxruntime")]
    extras = project["optional-dependencies"]
    assert extras["cpu"] == ["onnxruntime>=1.16"] and extras["gpu"] == ["onnxruntime-gpu>=1.16"]
    assert "cpu" in extras["all"][0].split("[", 1)[1]  # CI and the README quick start install .[all]
