"""A named corpus of hostile inputs, each fed through its entry point.

The files are generated here at run time (small, reviewable builders instead of
opaque binaries; the zip bomb would be large on disk).  Every case names the
typed error it must raise and a fragment of the message; ``CASES`` is grouped by
class of attack (see ``CLASSES``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

from converters.calibration import CalibrationError, load_data
from converters.packaging import write_package
from edge_sdk import errors
from edge_sdk.backends import sandbox as _sandbox
from edge_sdk.package import MANIFEST_NAME, ModelPackage, TensorSpec
from edge_sdk.remote import protocol


def _tflite(quant_scale: float | None = None, shape: tuple[int, ...] = (1, 8)) -> bytes:
    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder()
    if quant_scale is None:
        x = b.input("x", shape=shape, dtype="float32")
    else:
        x = b.input("x", shape=shape, dtype="int8", quant=(0.5, 0))
    b.output(b.relu(x), "y")
    data = b.build()
    if quant_scale is not None:  # the builder refuses bad scales: patch the stored float
        data = data.replace(struct.pack("<f", 0.5), struct.pack("<f", quant_scale))
    return data


def _tflite_manifest() -> dict:
    m = mlp_manifest(8, 8, file="m.tflite")
    m["inputs"][0].update(shape=[1, 8])
    del m["inputs"][0]["dims"]
    m["outputs"][0].update(shape=[1, 8])
    m["variants"][0].update(backend="litert")
    return m


def _package(root: Path, model: bytes, *, name: str = "m.onnx", manifest: dict | None = None) -> Path:
    """A package whose manifest digests ``model`` as it is (so only format checks can refuse it)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(model)
    m = manifest or (mlp_manifest(file=name) if name.endswith(".onnx") else {**_tflite_manifest(), "variants": [
        {**_tflite_manifest()["variants"][0], "file": name}]})
    write_package(root, m, {}, overwrite=True, verify=False)
    return root


def _good_files(tmp: Path) -> dict[str, bytes]:
    root = tmp / "good"
    if not root.exists():
        write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def _zip(path: Path, members: dict[str, bytes], *, links: dict[str, str] | None = None, level: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", level) as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)  # S_IFLNK
            z.writestr(info, target)
    return path


def _tar(path: Path, members: dict[str, bytes], *, sym: dict[str, str] | None = None, hard: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, sym or {}), (tarfile.LNKTYPE, hard or {})):
            for name, target in links.items():
                info = tarfile.TarInfo(name)
                info.type = kind
                info.linkname = target
                t.addfile(info)
    return path


def _open(path: Path) -> Callable[[], object]:
    return lambda: ModelPackage.open(path, cache_dir=path.parent / "cache")


# --- the corpus ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    cls: str  # class of attack
    name: str
    build: Callable[[Path], Callable[[], object]]  # tmp -> the call that must fail
    error: type[BaseException]
    match: str


def _truncated_onnx(tmp: Path):
    return _open(_package(tmp / "p", mlp_onnx()[:100]))


def _truncated_tflite(tmp: Path):
    data = _tflite()
    return _open(_package(tmp / "p", data[: len(data) - 40], name="m.tflite"))


def _truncated_zip(tmp: Path):
    z = _zip(tmp / "a.zip", _good_files(tmp))
    data = z.read_bytes()
    z.write_bytes(data[: len(data) // 2])
    return _open(z)


def _truncated_tar(tmp: Path):
    t = _tar(tmp / "a.tar", _good_files(tmp))
    data = t.read_bytes()
    t.write_bytes(data[:700])
    return _open(t)


def _truncated_toml(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    text = (root / MANIFEST_NAME).read_text()
    (root / MANIFEST_NAME).write_text(text[: text.index("[[inputs]]") + 5])
    return _open(root)


def _tflite_named_onnx(tmp: Path):
    return _open(_package(tmp / "p", _tflite(), name="m.onnx"))


def _onnx_named_tflite(tmp: Path):
    return _open(_package(tmp / "p", mlp_onnx(), name="m.tflite"))


def _zip_named_tar(tmp: Path):
    z = _zip(tmp / "a.zip", _good_files(tmp))
    return _open(z.rename(tmp / "a.tar"))


def _png_named_onnx(tmp: Path):
    import cv2

    png = cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes()
    return _open(_package(tmp / "p", png))


def _zip_dotdot(tmp: Path):
    return _open(_zip(tmp / "a.zip", {**_good_files(tmp), "../evil.txt": b"x"}))


def _tar_dotdot(tmp: Path):
    return _open(_tar(tmp / "a.tar", {**_good_files(tmp), "pkg/../../evil.txt": b"x"}))


def _tar_absolute(tmp: Path):
    return _open(_tar(tmp / "a.tar", {**_good_files(tmp), "/tmp/evil.txt": b"x"}))


def _manifest_dotdot(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    text = (root / MANIFEST_NAME).read_text().replace('file = "m.onnx"', 'file = "../m.onnx"')
    (root / MANIFEST_NAME).write_text(text)
    return _open(root)


def _zip_symlink(tmp: Path):
    return _open(_zip(tmp / "a.zip", _good_files(tmp), links={"passwd": "/etc/passwd"}))


def _tar_symlink(tmp: Path):
    return _open(_tar(tmp / "a.tar", _good_files(tmp), sym={"passwd": "/etc/passwd"}))


def _tar_hardlink(tmp: Path):
    return _open(_tar(tmp / "a.tar", _good_files(tmp), hard={"passwd": "/etc/passwd"}))


def _folder_symlink_model(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    (tmp / "outside.onnx").write_bytes(mlp_onnx())
    (root / "m.onnx").unlink()
    os.symlink(tmp / "outside.onnx", root / "m.onnx")
    return _open(root)


def _folder_symlink_dir(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    os.symlink("/etc", root / "etc")
    return _open(root)


def _zip_bomb_ratio(tmp: Path):
    # 40 MB of zeros in ~40 KB: refused by the sandboxed load's memory limit, not by extraction
    # (the extraction caps the declared total at 8 GiB); here we check that the extracted
    # oversize "model" never reaches a runtime: its digest does not match.
    files = _good_files(tmp)
    files["m.onnx"] = bytes(40 << 20)
    return _open(_zip(tmp / "a.zip", files))


def _zip_many_members(tmp: Path):
    path = tmp / "a.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in _good_files(tmp).items():
            z.writestr(name, data)
        for i in range(10_001):
            z.writestr(f"f/{i}", b"")
    return _open(path)


def _huge_dims_tflite(tmp: Path):
    data = _tflite(shape=(1 << 16, 1 << 14))
    return lambda: _sandbox.check_load("litert", data, memory_limit_mb=512)


def _huge_initializer_onnx(tmp: Path):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros(32 << 20, np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    data = m.SerializeToString()
    return lambda: _sandbox.check_load("onnxruntime", data, memory_limit_mb=64)


def _toml_deep(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    (root / MANIFEST_NAME).write_text("x = " + "[" * 100_000)
    return _open(root)


def _toml_huge(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    with open(root / MANIFEST_NAME, "a") as f:
        f.write("".join(f"k{i} = {i}\n" for i in range(200_000)))
    return _open(root)


def _nan_scale(tmp: Path):
    return _open(_package(tmp / "p", _tflite(float("nan")), name="m.tflite"))


def _inf_scale(tmp: Path):
    return _open(_package(tmp / "p", _tflite(float("inf")), name="m.tflite"))


def _labels_mismatch(tmp: Path):
    m = mlp_manifest(task="classification", labels=["a", "b", "c", "d"])
    m["outputs"][0]["shape"] = ["batch", 4]
    root = _package(tmp / "p", mlp_onnx(), manifest=m)
    toml = root / "edge-model.toml"  # then hand-edited to 3 labels for the 4 classes (write_package refuses to write it)
    text = toml.read_text()
    assert '"d"' in text
    toml.write_text(text.replace(', "d"', "", 1))
    return _open(root)


def _pickle_model(tmp: Path):
    return _open(_package(tmp / "p", pickle.dumps({"w": [1, 2]}, protocol=4)))


def _pickle_stray(tmp: Path):
    root = _package(tmp / "p", mlp_onnx())
    (root / "notes.bin").write_bytes(pickle.dumps(object, protocol=2))
    return _open(root)


def _pickle_calibration(tmp: Path):
    path = tmp / "data.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    spec = TensorSpec("x", "float32", ("batch", 4), "NC", (("batch", 1, 8),))
    return lambda: load_data(path, [spec], progress=False)


def _protocol_overlong(tmp: Path):
    doc = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1 << 40], "parameters": {"binary_data_size": 1 << 40}}]}).encode()
    return lambda: protocol.decode_request(doc, {protocol.HEADER_LENGTH: str(len(doc))})


def _corrupt_deflate_zip(tmp: Path):
    files = _good_files(tmp)
    files["m.onnx"] = bytes(range(256)) * 64 + b"a" * 5000
    z = _zip(tmp / "a.zip", files)
    data = bytearray(z.read_bytes())
    start = data.index(b"m.onnx") + len("m.onnx") + 40  # inside m.onnx's deflate stream
    for i in range(start, start + 16):
        data[i] ^= 0xA5
    z.write_bytes(bytes(data))
    return _open(z)


E = errors
CASES = [
    Case("truncation", "onnx", _truncated_onnx, E.ModelFormatError, "ONNX|onnx|truncat|past the end"),
    Case("truncation", "tflite", _truncated_tflite, E.ModelFormatError, "TFLite|truncated|looks like"),
    Case("truncation", "zip", _truncated_zip, E.ModelFormatError, "corrupt zip"),
    Case("truncation", "tar", _truncated_tar, E.ModelFormatError, "corrupt tar|expected"),
    Case("truncation", "toml", _truncated_toml, E.ManifestError, "TOML"),
    Case("format confusion", "tflite named .onnx", _tflite_named_onnx, E.ModelFormatError, "looks like tflite"),
    Case("format confusion", "onnx named .tflite", _onnx_named_tflite, E.ModelFormatError, "TFL3|tflite|TFLite"),
    Case("format confusion", "zip named .tar", _zip_named_tar, E.ModelFormatError, "corrupt tar"),
    Case("format confusion", "png named .onnx", _png_named_onnx, E.ModelFormatError, "looks like|ONNX|onnx"),
    Case("path traversal", "zip ../ member", _zip_dotdot, E.UnsafePackageError, "outside the package"),
    Case("path traversal", "tar ../ member", _tar_dotdot, E.UnsafePackageError, "outside the package"),
    Case("path traversal", "tar absolute member", _tar_absolute, E.UnsafePackageError, "outside the package"),
    Case("path traversal", "manifest ../ path", _manifest_dotdot, E.UnsafePackageError, r"\.\."),
    Case("links", "zip symlink", _zip_symlink, E.UnsafePackageError, "link"),
    Case("links", "tar symlink", _tar_symlink, E.UnsafePackageError, "link"),
    Case("links", "tar hard link", _tar_hardlink, E.UnsafePackageError, "link"),
    Case("links", "folder symlinked model", _folder_symlink_model, E.UnsafePackageError, "outside the package"),
    Case("links", "folder symlinked dir", _folder_symlink_dir, E.UnsafePackageError, "outside the package"),
    Case("zip bombs", "high ratio", _zip_bomb_ratio, E.IntegrityError, "sha256|bytes"),
    Case("zip bombs", "many members", _zip_many_members, E.UnsafePackageError, "members, limit"),
    Case("huge declared dims", "tflite 4 GiB tensors", _huge_dims_tflite, _sandbox.SandboxMemoryError, "MiB"),
    Case("huge declared dims", "onnx 128 MiB initializer", _huge_initializer_onnx, _sandbox.SandboxMemoryError, "memory limit"),
    Case("billion laughs", "deeply nested toml", _toml_deep, E.ManifestError, "nested too deeply"),
    Case("billion laughs", "huge toml", _toml_huge, E.ManifestError, "over the limit"),
    Case("non-finite quantization", "nan scale", _nan_scale, E.ModelFormatError, "scale"),
    Case("non-finite quantization", "inf scale", _inf_scale, E.ModelFormatError, "scale"),
    Case("labels mismatch", "3 labels for 4 classes", _labels_mismatch, E.ManifestError, "labels"),
    Case("pickles", "pickle as model", _pickle_model, E.UnsafePackageError, "pickle"),
    Case("pickles", "stray pickle", _pickle_stray, E.UnsafePackageError, "pickle"),
    Case("pickles", "pickled calibration array", _pickle_calibration, CalibrationError, "pickle"),
    Case("hostile protocol", "over-long binary_data_size", _protocol_overlong, protocol.ProtocolError, "binary_data_size"),
    Case("truncation", "corrupt deflate stream in zip", _corrupt_deflate_zip, E.ModelFormatError, "corrupt zip"),
]
CLASSES = sorted({c.cls for c in CASES})

#: Cases that expose a bug in a module this suite does not own (reported to the maintainer).
KNOWN_BUGS: dict[str, str] = {}  # (all three found by this suite are fixed in package.py)


def _params() -> list:
    out = []
    for c in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[c.name])] if c.name in KNOWN_BUGS else []
        out.append(pytest.param(c, id=f"{c.cls}: {c.name}", marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_hostile_input_is_refused_with_a_typed_error(tmp_path: Path, case: Case) -> None:
    if case.cls == "links" and sys.platform == "win32":
        pytest.skip("symlinks need privileges on Windows")
    call = case.build(tmp_path)
    with pytest.raises(case.error, match=case.match):
        call()


def test_corpus_covers_every_class() -> None:
    assert CLASSES == sorted([
        "billion laughs", "format confusion", "hostile protocol", "huge declared dims", "labels mismatch", "links",
        "non-finite quantization", "path traversal", "pickles", "truncation", "zip bombs",
    ])
