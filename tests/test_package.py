"""Model packages: manifest parsing, digests, containment, hostile packages.

Every hostile package must fail with a typed error *before any runtime is
called*: the `no_runtime` fixture makes both backends' session constructors
raise if they are reached.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

import edge_sdk
from converters.packaging import write_package
from edge_sdk import errors
from edge_sdk.package import MANIFEST_NAME, Manifest, ModelPackage


@pytest.fixture
def no_runtime(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) any attempt to open a runtime session."""
    calls: list[str] = []
    from edge_sdk.backends import litert, ort

    def refuse(name: str):
        def _f(*a, **k):
            calls.append(name)
            raise AssertionError(f"runtime {name} was called for a hostile package")

        return _f

    monkeypatch.setattr(ort, "OrtSession", refuse("onnxruntime"))
    monkeypatch.setattr(litert, "LiteRTSession", refuse("litert"))
    return calls


def _write_manifest(root: Path, m: dict) -> None:
    (root / MANIFEST_NAME).write_text(Manifest.from_dict(m).to_toml())


def _good(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    return root


def _tflite_bytes() -> bytes:
    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.input("x", shape=(1, 8), dtype="float32")
    y = b.fully_connected(x, np.ones((4, 8), np.float32), np.zeros(4, np.float32))
    b.output(y, "y")
    return b.build()


def test_good_package_opens_and_loads(tmp_path: Path) -> None:
    root = _good(tmp_path)
    pkg = ModelPackage.open(root)
    assert pkg.manifest.variants[0].size == (root / "m.onnx").stat().st_size
    with edge_sdk.load(pkg, "generic-x86_64") as m:
        r = m.predict(np.ones((2, 8), np.float32))
        assert r.outputs["y"].shape == (2, 4)
        assert r.model_sha256 == pkg.manifest.variants[0].sha256


# -- hostile folders: (what to do to a good package, expected error, message part) ----------


def _digest_mismatch(root: Path) -> None:  # a byte changed after packaging
    data = bytearray((root / "m.onnx").read_bytes())
    data[-1] ^= 0xFF
    (root / "m.onnx").write_bytes(bytes(data))


def _truncated(root: Path) -> None:  # file cut short
    data = (root / "m.onnx").read_bytes()
    (root / "m.onnx").write_bytes(data[: len(data) // 2])


def _truncated_rehashed(root: Path) -> None:  # cut short AND manifest re-digested: format check must catch it
    data = mlp_onnx()[:60]
    _rewrite(root, data)


def _random_rehashed(root: Path) -> None:  # random bytes with a matching digest
    _rewrite(root, np.random.default_rng(3).bytes(500))


def _tflite_named_onnx(root: Path) -> None:  # TFLite bytes in an ONNX variant
    _rewrite(root, _tflite_bytes())


def _pickle_as_model(root: Path) -> None:  # a pickle posing as the model
    _rewrite(root, pickle.dumps({"w": [1, 2, 3]}, protocol=4))


def _stray_pickle(root: Path) -> None:  # any pickle anywhere in the package
    (root / "extra.pkl").write_bytes(pickle.dumps([1]))


def _stray_pickle_renamed(root: Path) -> None:  # a pickle under an innocent name
    (root / "labels.txt").write_bytes(pickle.dumps(["cat"], protocol=2))


def _absolute_path(root: Path) -> None:
    m = mlp_manifest(file="/etc/passwd")
    m["variants"][0].update(sha256="0" * 64, size=10)
    _write_manifest(root, m)


def _dotdot_path(root: Path) -> None:
    m = mlp_manifest(file="../m.onnx")
    m["variants"][0].update(sha256="0" * 64, size=10)
    _write_manifest(root, m)


def _symlink_out(root: Path) -> None:  # the model file is a symlink leaving the package
    outside = root.parent / "outside.onnx"
    outside.write_bytes(mlp_onnx())
    (root / "m.onnx").unlink()
    os.symlink(outside, root / "m.onnx")


def _stray_symlink_out(root: Path) -> None:  # an unreferenced symlink leaving the package
    os.symlink("/etc/hostname", root / "notes.txt")


def _missing_file(root: Path) -> None:
    (root / "m.onnx").unlink()


def _rewrite(root: Path, data: bytes) -> None:
    (root / "m.onnx").write_bytes(data)
    write_package(root, mlp_manifest(), {}, overwrite=True, verify=False)


HOSTILE = [
    (_digest_mismatch, errors.IntegrityError, "sha256"),
    (_truncated, errors.IntegrityError, "bytes"),
    (_truncated_rehashed, errors.ModelFormatError, "onnx|truncat|past the end|expected"),
    (_random_rehashed, errors.ModelFormatError, "looks like"),
    (_tflite_named_onnx, errors.ModelFormatError, "looks like tflite"),
    (_pickle_as_model, errors.UnsafePackageError, "pickle"),
    (_stray_pickle, errors.UnsafePackageError, "pickle"),
    (_stray_pickle_renamed, errors.UnsafePackageError, "pickle"),
    (_absolute_path, errors.UnsafePackageError, "absolute"),
    (_dotdot_path, errors.UnsafePackageError, ".."),
    (_symlink_out, errors.UnsafePackageError, "outside the package"),
    (_stray_symlink_out, errors.UnsafePackageError, "outside the package"),
    (_missing_file, errors.IntegrityError, "missing"),
]


@pytest.mark.parametrize("damage,exc,msg", HOSTILE, ids=[h[0].__name__.strip("_") for h in HOSTILE])
def test_hostile_folder_is_refused_before_any_runtime(tmp_path: Path, no_runtime: list[str], damage, exc, msg) -> None:
    root = _good(tmp_path)
    damage(root)
    with pytest.raises(exc, match=msg):
        edge_sdk.load(root, "generic-x86_64")
    assert no_runtime == []


def test_manifest_model_mismatch_is_an_error_at_load(tmp_path: Path) -> None:
    # The manifest says 6 input features and float16; the model has 8 and float32.
    root = tmp_path / "pkg"
    m = mlp_manifest()
    m["inputs"][0].update(shape=["batch", 6], dtype="float16")
    write_package(root, m, {"m.onnx": mlp_onnx()})
    with pytest.raises(errors.SignatureMismatchError) as ei:
        edge_sdk.load(root, "generic-x86_64")
    assert "dtype: manifest float16, model float32" in str(ei.value)
    assert "dim 1: manifest 6, model 8" in str(ei.value)


def test_manifest_names_mismatch(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    m = mlp_manifest()
    m["outputs"][0]["name"] = "probs"
    write_package(root, m, {"m.onnx": mlp_onnx()})
    with pytest.raises(errors.SignatureMismatchError, match=r"output names: manifest \['probs'\], model \['y'\]"):
        edge_sdk.load(root, "generic-x86_64")


def test_manifest_dynamic_but_model_fixed(tmp_path: Path) -> None:
    # The manifest promises batches up to 8; the model fixes batch at 1: refused at load, not at call 2.
    root = tmp_path / "pkg"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx(batch=1)})
    with pytest.raises(errors.SignatureMismatchError, match="model fixes it at 1"):
        edge_sdk.load(root, "generic-x86_64")


# -- ONNX external data ------------------------------------------------------------------


def _external_model(tmp: Path, location: str) -> bytes:
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    m = onnx.load_from_string(mlp_onnx(64, 32))
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location=location, size_threshold=0)
    # write tensors next to a temp model, then return the model bytes (refs only)
    onnx.save_model(m, str(tmp / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0)
    return (tmp / "m.onnx").read_bytes()


def test_external_data_inside_and_covered_loads(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    _external_model(root, "weights.bin")
    m = mlp_manifest(64, 32)
    m["variants"][0]["external_data"] = ["weights.bin"]
    write_package(root, m, {}, overwrite=True)
    rng = np.random.default_rng(0)  # mlp_onnx's seeded weights: the external file really is read
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    x = np.linspace(-1, 1, 64, dtype=np.float32)[None]
    with edge_sdk.load(root, "generic-x86_64") as model:
        np.testing.assert_allclose(model.predict(x).outputs["y"], np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_external_data_not_covered_by_a_digest(tmp_path: Path, no_runtime: list[str]) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    _external_model(root, "weights.bin")
    write_package(root, mlp_manifest(64, 32), {}, overwrite=True, verify=False)
    with pytest.raises(errors.UnsafePackageError, match="no digest in the manifest covers"):
        edge_sdk.load(root, "generic-x86_64")
    assert no_runtime == []


def test_external_data_outside_the_package(tmp_path: Path, no_runtime: list[str]) -> None:
    import onnx

    root = tmp_path / "pkg"
    root.mkdir()
    _external_model(root, "weights.bin")
    # onnx refuses to write '..' itself; a hostile tool would not: rewrite the reference.
    (root / "weights.bin").rename(tmp_path / "outside.bin")
    m = onnx.load(str(root / "m.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside.bin"
    (root / "m.onnx").write_bytes(m.SerializeToString())
    write_package(root, mlp_manifest(64, 32), {}, overwrite=True, verify=False)
    with pytest.raises(errors.UnsafePackageError, match=r"'\.\.'"):
        edge_sdk.load(root, "generic-x86_64")
    assert no_runtime == []


def test_external_data_tampered(tmp_path: Path, no_runtime: list[str]) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    _external_model(root, "weights.bin")
    m = mlp_manifest(64, 32)
    m["variants"][0]["external_data"] = ["weights.bin"]
    write_package(root, m, {}, overwrite=True)
    data = bytearray((root / "weights.bin").read_bytes())
    data[10] ^= 1
    (root / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(errors.IntegrityError, match="weights.bin sha256"):
        edge_sdk.load(root, "generic-x86_64")
    assert no_runtime == []


# -- archives ------------------------------------------------------------------------------


def _zip_of(root: Path, out: Path, extra: dict[str, bytes] | None = None, prefix: str = "pkg/") -> Path:
    with zipfile.ZipFile(out, "w") as z:
        for p in sorted(root.iterdir()):
            z.write(p, prefix + p.name)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return out


def test_zip_and_tar_packages_load_read_only(tmp_path: Path) -> None:
    root = _good(tmp_path)
    z = _zip_of(root, tmp_path / "pkg.zip")
    t = tmp_path / "pkg.tar.gz"
    with tarfile.open(t, "w:gz") as tf:
        tf.add(root, arcname="pkg")
    before = {p: p.stat().st_mtime_ns for p in (z, t)}
    x = np.full((1, 8), 0.5, np.float32)
    outs = []
    for archive in (z, t):
        with edge_sdk.load(archive, "generic-x86_64") as m:
            outs.append(m.predict(x).outputs["y"])
            assert m.package.root != root  # extracted into the cache, not next to the archive
    np.testing.assert_array_equal(outs[0], outs[1])
    assert {p: p.stat().st_mtime_ns for p in (z, t)} == before


@pytest.mark.parametrize(
    "member",
    [
        "../evil.txt",  # classic zip-slip
        "pkg/../../evil.txt",  # slip through a nested path
        "/abs/evil.txt",  # absolute member
    ],
)
def test_zip_slip_members_refused(tmp_path: Path, no_runtime: list[str], member: str) -> None:
    root = _good(tmp_path)
    z = _zip_of(root, tmp_path / "pkg.zip", {member: b"x"})
    with pytest.raises(errors.UnsafePackageError, match="outside the package"):
        edge_sdk.load(z, "generic-x86_64")
    assert not (tmp_path / "evil.txt").exists()
    assert no_runtime == []


def test_tar_symlink_member_refused(tmp_path: Path, no_runtime: list[str]) -> None:
    root = _good(tmp_path)
    t = tmp_path / "pkg.tar"
    with tarfile.open(t, "w") as tf:
        tf.add(root, arcname="pkg")
        info = tarfile.TarInfo("pkg/link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tf.addfile(info)
    with pytest.raises(errors.UnsafePackageError, match="link"):
        edge_sdk.load(t, "generic-x86_64")
    assert no_runtime == []


def test_zip_symlink_member_refused(tmp_path: Path, no_runtime: list[str]) -> None:
    root = _good(tmp_path)
    z = tmp_path / "pkg.zip"
    _zip_of(root, z)
    with zipfile.ZipFile(z, "a") as zf:
        info = zipfile.ZipInfo("pkg/link")
        info.external_attr = (0o120777 << 16)
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(errors.UnsafePackageError, match="symlink"):
        edge_sdk.load(z, "generic-x86_64")
    assert no_runtime == []


def test_corrupt_archive(tmp_path: Path) -> None:
    z = tmp_path / "pkg.zip"
    z.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    with pytest.raises(errors.ModelFormatError, match="corrupt zip"):
        ModelPackage.open(z)


def test_tampered_extracted_cache_is_caught(tmp_path: Path) -> None:
    # Extraction is cached by archive digest, but digests are checked on every open.
    root = _good(tmp_path)
    z = _zip_of(root, tmp_path / "pkg.zip")
    pkg = ModelPackage.open(z)
    (pkg.root / "m.onnx").write_bytes(b"\x00" * pkg.manifest.variants[0].size)
    with pytest.raises(errors.IntegrityError):
        ModelPackage.open(z)


# -- manifest validation: (mutation, message) --------------------------------------------

MANIFEST_ERRORS = [
    (lambda m: m.pop("variants"), "missing required key 'variants'"),
    (lambda m: m.update(colour="red"), "unknown key"),  # typos never pass silently
    (lambda m: m.update(schema=2), "reads schema 1"),
    (lambda m: m["inputs"][0].update(dtype="float"), "expected one of"),
    (lambda m: m["inputs"][0].pop("dims"), "need bounds"),  # dynamic dim without bounds
    (lambda m: m["inputs"][0].update(dims={"batch": [0, 4]}), "1 <= min <= max"),
    (lambda m: m["inputs"][0].update(shape=["batch", 0]), "must be > 0"),
    (lambda m: m["variants"][0].update(precision="int3"), "precision"),
    (lambda m: m["variants"][0].update(backend="tensorflow"), "backend"),
    (lambda m: m["variants"][0].update(sha256="abc"), "64 lower-case hex"),
    (lambda m: m["variants"][0].update(size=True), "got bool"),
    (lambda m: m["variants"].append(dict(m["variants"][0])), "duplicate id"),
    (lambda m: m.update(decoder={"kind": "classification", "output": "nope"}), "is not an output"),
    (lambda m: m.update(state=[{"input": "x", "output": "zz"}]), "must name an input and an output"),
    (lambda m: m["inputs"][0].update(layout="NCHW"), "has 4 axes"),
    # TOML has inf and nan: a non-finite normalisation constant would make every input non-finite
    (lambda m: m["inputs"][0].update(shape=[1, 3, 2, 2], layout="NCHW", dims={}, preprocess={"kind": "image", "size_hw": [2, 2], "mean": [float("inf"), 0, 0]}), "must be finite"),
]


@pytest.mark.parametrize("mutate,msg", MANIFEST_ERRORS)
def test_manifest_errors(mutate, msg: str) -> None:
    m = mlp_manifest()
    m["variants"][0].update(sha256="a" * 64, size=100)
    mutate(m)
    with pytest.raises(errors.ManifestError, match=msg):
        Manifest.from_dict(m)


def test_manifest_round_trips_through_toml() -> None:
    from edge_sdk import _toml

    m = mlp_manifest()
    m["variants"][0].update(sha256="a" * 64, size=100, quality={"cosine": 0.99, "dataset": "d"})
    parsed = Manifest.from_dict(m)
    again = Manifest.from_dict(_toml.loads(parsed.to_toml()))
    assert again == parsed


def test_not_a_package(tmp_path: Path) -> None:
    with pytest.raises(errors.ManifestError, match="does not exist"):
        ModelPackage.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.ManifestError, match="no edge-model.toml"):
        ModelPackage.open(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MANIFEST_NAME).write_bytes(b"name = [unclosed")
    with pytest.raises(errors.ManifestError, match="not valid UTF-8 TOML"):
        ModelPackage.open(tmp_path / "bad")
    f = tmp_path / "model.onnx"
    f.write_bytes(mlp_onnx())
    with pytest.raises(errors.ModelFormatError, match="expected a package folder"):
        ModelPackage.open(f)


def test_read_verified_catches_swap_after_open(tmp_path: Path) -> None:
    # A file swapped between open() and load: the bytes handed to the runtime are re-verified.
    root = _good(tmp_path)
    pkg = ModelPackage.open(root)
    (root / "m.onnx").write_bytes(mlp_onnx(seed=9))
    with pytest.raises(errors.IntegrityError):
        pkg.read_verified(pkg.manifest.variants[0])


def test_demo_package_is_intact(demo_package: Path) -> None:
    pkg = ModelPackage.open(demo_package)
    ids = {v.id: v for v in pkg.manifest.variants}
    assert {"fp32-onnx", "int8-onnx", "fp32-tflite"} <= set(ids)
    for vid in ("int8-onnx", "fp32-tflite"):
        q = ids[vid].quality
        assert q is not None and q.cosine is not None and q.cosine > 0.99 and q.reference == "fp32-onnx"
    assert ids["fp32-onnx"].quality.value > 0.95  # accuracy on the held-out split


def test_error_tree() -> None:
    # Grouped by cause; input errors are also ValueErrors for callers that catch those.
    assert issubclass(errors.IntegrityError, errors.ModelPackageError)
    assert issubclass(errors.UnsafePackageError, errors.ModelPackageError)
    assert issubclass(errors.InputDTypeError, ValueError)
    assert issubclass(errors.SessionClosedError, errors.BackendError)
    assert all(issubclass(e, errors.EdgeSDKError) for e in (errors.ProfileError, errors.SelectionError, errors.MissingDependencyError))


def test_io_of_bytes_model_is_the_verified_bytes(tmp_path: Path) -> None:
    root = _good(tmp_path)
    pkg = ModelPackage.open(root)
    vm = pkg.read_verified(pkg.manifest.variants[0])
    assert vm.data == (root / "m.onnx").read_bytes()
    assert io.BytesIO(vm.data).getbuffer().nbytes == pkg.manifest.variants[0].size


def test_archive_size_and_member_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_runtime: list[str]) -> None:
    from edge_sdk.package import archive as pk  # the limits live where the extraction runs

    root = _good(tmp_path)
    z = _zip_of(root, tmp_path / "pkg.zip", {"pkg/pad.bin": b"\x00" * 5000})
    monkeypatch.setattr(pk, "MAX_ARCHIVE_BYTES", 4000)  # a zip bomb expands past the limit
    with pytest.raises(errors.UnsafePackageError, match="expands past 4000 bytes"):
        ModelPackage.open(z)
    monkeypatch.setattr(pk, "MAX_ARCHIVE_BYTES", 10**9)
    monkeypatch.setattr(pk, "MAX_ARCHIVE_MEMBERS", 2)
    with pytest.raises(errors.UnsafePackageError, match="members, limit 2"):
        ModelPackage.open(z)
    assert no_runtime == []


def test_manifest_with_a_bare_classification_decoder_round_trips() -> None:
    """decoder.output unset (the model's single output) survives to_dict / to_toml and back."""
    from edge_sdk import _toml

    m = mlp_manifest()
    m["variants"][0].update(sha256="a" * 64, size=100)
    m.update(decoder={"kind": "classification"}, labels=["a", "b", "c", "d"])
    parsed = Manifest.from_dict(m)
    assert parsed.decoder.output is None
    assert Manifest.from_dict(parsed.to_dict()) == parsed
    assert Manifest.from_dict(_toml.loads(parsed.to_toml())) == parsed
