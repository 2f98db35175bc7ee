"""Hostile packages against the model store: links, FIFOs, devices and oversize files in a folder or
archive (refused before a byte is copied), names that would share an on-disk slot, files the
signature does not cover, rollback past the highest version installed, and refusal messages that
say what was expected. Real files, links and FIFOs on disk; every wait is bounded."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
from store_helpers import bad_op_onnx, make_pkg

from edge_sdk import _toml
from edge_sdk.errors import UnsafePackageError
from edge_sdk.store import ModelStore, StoreConfig, StoreNameError, generate_keypair, sign_package
from edge_sdk.store.intake import _folder_entries
from edge_sdk.store.store import check_model_name, check_version

FAST: dict[str, Any] = dict(health_start_method="fork", health_timeout_s=30.0)
SECRET = b"TOP-SECRET-OUTSIDE-THE-PACKAGE\n" * 4


def _store(root: Path, **kw: Any) -> ModelStore:
    return ModelStore(root, StoreConfig(**{**FAST, **kw}))


def _bounded(fn: Callable[[], Any], limit_s: float = 30.0) -> Any:
    """Run ``fn`` in a thread; fail (instead of hanging) if it blocks past ``limit_s``."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"blocked for more than {limit_s} s"
    return out[0]


def _nothing_installed(store: ModelStore) -> None:
    assert store.versions() == [] and store.models() == []
    assert not any((store.root / "staging").iterdir())
    for dirpath, _d, files in os.walk(store.root):
        for fn in files:
            p = Path(dirpath) / fn
            assert not p.is_symlink()
            assert SECRET not in p.read_bytes(), p


def _refused(store: ModelStore, source: Path, *needles: str) -> str:
    r = _bounded(lambda: store.install(source))
    assert r.state == "failed_no_change", r
    for n in needles:
        assert n in r.reason, r.reason
    assert "corrupt" not in r.reason
    _nothing_installed(store)
    return str(r.reason)


def _rename(pkg: Path, name: str) -> Path:
    mf = pkg / "edge-model.toml"
    d = _toml.loads(mf.read_text())
    d["name"] = name
    mf.write_text(_toml.dumps(d))
    return pkg


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    p = tmp_path / "outside" / "secret.txt"
    p.parent.mkdir()
    p.write_bytes(SECRET)
    return p


# -- 1. links, FIFOs, devices, oversize: refused before a byte is copied ------------------------------


def test_symlink_to_outside_file_as_extra_entry(tmp_path: Path, secret: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    (pkg / "notes.txt").symlink_to(secret)
    _refused(_store(tmp_path / "s"), pkg, "UnsafePackageError", "notes.txt", "symlink", "only regular files and folders")


def test_symlink_replacing_model_file_with_same_bytes_outside(tmp_path: Path) -> None:
    """The digest would match: the link itself must be refused, not followed."""
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    outside = tmp_path / "outside.onnx"
    shutil.move(pkg / "m.onnx", outside)
    (pkg / "m.onnx").symlink_to(outside)
    _refused(_store(tmp_path / "s"), pkg, "m.onnx", "symlink")


def test_symlink_inside_package_is_refused_too(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    os.rename(pkg / "m.onnx", pkg / "real.onnx")
    (pkg / "m.onnx").symlink_to("real.onnx")
    _refused(_store(tmp_path / "s"), pkg, "symlink")


def test_symlink_to_dev_zero_is_refused_quickly(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0")
    (pkg / "golden_in.npz").unlink()
    (pkg / "golden_in.npz").symlink_to("/dev/zero")
    t0 = time.monotonic()
    _refused(_store(tmp_path / "s"), pkg, "golden_in.npz", "symlink", "/dev/zero")
    assert time.monotonic() - t0 < 10


def test_relative_symlink_escaping(tmp_path: Path, secret: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    (pkg / "sub").mkdir()
    (pkg / "sub" / "x").symlink_to(Path("..") / ".." / "outside" / secret.name)
    _refused(_store(tmp_path / "s"), pkg, "sub/x", "symlink")


def test_symlinked_folder(tmp_path: Path, secret: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    (pkg / "data").symlink_to(secret.parent, target_is_directory=True)
    _refused(_store(tmp_path / "s"), pkg, "data", "symlink")


@pytest.mark.parametrize("where", ["m.onnx", "extra.fifo", "sub/deep.fifo"])
def test_fifo_is_refused_without_blocking(tmp_path: Path, where: str) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    target = pkg / where
    target.parent.mkdir(exist_ok=True)
    if target.exists():
        target.unlink()
    os.mkfifo(target)
    _refused(_store(tmp_path / "s"), pkg, "a FIFO", "only regular files and folders")


def test_hard_link_is_refused(tmp_path: Path, secret: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    os.link(pkg / "m.onnx", tmp_path / "elsewhere.onnx")
    _refused(_store(tmp_path / "s"), pkg, "m.onnx", "hard links", "expected")


def test_file_larger_than_declared_is_refused_before_copy(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    with open(pkg / "m.onnx", "ab") as f:
        f.write(b"\0" * 4096)
    _refused(_store(tmp_path / "s"), pkg, "IntegrityError", "manifest says", "nothing copied")


def test_package_over_the_byte_budget(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    _refused(_store(tmp_path / "s", max_package_bytes=1000), pkg, "max_package_bytes", "nothing copied")
    with pytest.raises(Exception, match="max_package_bytes"):
        StoreConfig(max_package_bytes=0)


def test_file_swapped_after_listing_is_refused_at_open(tmp_path: Path, secret: Path) -> None:
    """TOCTOU: listed as a regular file, replaced by a link (and by another file) before the copy."""
    from contextlib import ExitStack

    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    with ExitStack() as stack:
        entries = {e.rel: e for e in _folder_entries(pkg, stack)}
        (pkg / "m.onnx").unlink()
        (pkg / "m.onnx").symlink_to(secret)
        with pytest.raises(UnsafePackageError, match="without following links"):
            entries["m.onnx"].open()
        (tmp_path / "other").write_bytes(SECRET)  # made before the link goes: a different inode
        os.replace(tmp_path / "other", pkg / "m.onnx")
        with pytest.raises(UnsafePackageError, match="replaced while being installed"):
            entries["m.onnx"].open()


def _zip_with(src: Path, out: Path, extra: Callable[[zipfile.ZipFile], None]) -> Path:
    with zipfile.ZipFile(out, "w") as zf:
        for p in sorted(src.iterdir()):
            zf.write(p, f"pkg/{p.name}")
        extra(zf)
    return out


def test_zip_symlink_member(tmp_path: Path) -> None:
    def link(zf: zipfile.ZipFile) -> None:
        info = zipfile.ZipInfo("pkg/evil")
        info.create_system = 3
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")

    archive = _zip_with(make_pkg(tmp_path / "p", "1.0", golden=False), tmp_path / "a.zip", link)
    _refused(_store(tmp_path / "s"), archive, "pkg/evil", "a symlink", "expected only regular files")


@pytest.mark.parametrize("kind", ["sym", "hard", "fifo", "chr"])
def test_tar_special_members(tmp_path: Path, kind: str) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(pkg, "pkg")
        m = tarfile.TarInfo("pkg/special")
        m.type = {"sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
        m.linkname = "/dev/zero" if kind in ("sym", "hard") else ""
        tf.addfile(m)
    _refused(_store(tmp_path / "s"), archive, "pkg/special", "expected only regular files and folders")


def test_archive_path_that_is_a_fifo_or_a_device(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    os.mkfifo(tmp_path / "x.zip")
    _refused(store, tmp_path / "x.zip", "a FIFO", "expected a regular .zip/.tar file")
    (tmp_path / "z.tar").symlink_to("/dev/zero")
    _refused(store, tmp_path / "z.tar", "a character device", "expected a regular")


# -- 2. names map one-to-one to on-disk names, or are refused -----------------------------------------


@pytest.mark.parametrize(
    "name",
    ["cam det", "Cam_det", "CAM_DET", "cam/det", "../cam", ".cam", "caf\u00e9", "cafe\u0301", "cam_det\n", "a" * 65, "", "cam\x00det"],
)
def test_names_that_would_be_rewritten_are_refused(tmp_path: Path, name: str) -> None:
    pkg = _rename(make_pkg(tmp_path / "p", "1.0", golden=False), name)
    _refused(_store(tmp_path / "s"), pkg, "StoreNameError", "lower-case ASCII", "never rewritten")


def test_near_names_get_their_own_slots_and_lookups_are_not_rewritten(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    assert store.install(_rename(make_pkg(tmp_path / "a", "1.0", golden=False), "cam_det")).ok
    ptr = store.pointer("cam_det")
    r = store.install(_rename(make_pkg(tmp_path / "b", "2.0", golden=False, seed=1), "cam det"))
    assert r.state == "failed_no_change" and "StoreNameError" in r.reason
    assert store.pointer("cam_det") == ptr
    assert store.install(_rename(make_pkg(tmp_path / "c", "2.0", golden=False, seed=1), "cam-det")).ok
    assert store.pointer("cam_det") == ptr and store.models() == ["cam-det", "cam_det"]
    for bad in ("cam det", "Cam_det", "cam_det "):
        with pytest.raises(StoreNameError, match="expected 1-64 characters"):
            store.pointer(bad)
        with pytest.raises(StoreNameError):
            store.rollback(bad)
        with pytest.raises(StoreNameError):
            store.versions(bad)


def test_name_and_version_forms() -> None:
    assert check_model_name("a" * 64) == "a" * 64 and check_model_name("x.y_z-1") == "x.y_z-1"
    for bad in ("a" * 65, "-a", "A", "a b", 3):
        with pytest.raises(StoreNameError):
            check_model_name(bad)
    assert check_version("1!2.0rc1+local.3") == "1!2.0rc1+local.3"
    for bad in ("1.0 beta", "1/0", "", "v" * 65, ".1"):
        with pytest.raises(StoreNameError, match="version"):
            check_version(bad)


def test_bad_version_is_refused(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0 beta", golden=False)
    _refused(_store(tmp_path / "s"), pkg, "StoreNameError", "version '1.0 beta'")


# -- 3. files the manifest (so the signature) does not cover ------------------------------------------


@pytest.mark.parametrize("extra", ["README.txt", ".env", "sub/payload.bin", "edge-model.toml.bak"])
def test_unreferenced_file_with_a_valid_signature_is_refused_when_asked(tmp_path: Path, extra: str) -> None:
    priv, pub = generate_keypair()
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    sign_package(pkg, priv)
    (pkg / extra).parent.mkdir(exist_ok=True)
    (pkg / extra).write_bytes(SECRET)
    store = _store(tmp_path / "s", require_signatures=True, trusted_keys=(pub,), refuse_unreferenced=True)
    _refused(store, pkg, "does not reference", extra, "remove them or add them to the manifest")
    (pkg / extra).unlink()
    assert store.install(pkg).ok  # the same package without it installs


@pytest.mark.parametrize("extra", ["README.txt", ".env", "sub/payload.bin", "run.sh"])
def test_unreferenced_file_is_not_installed_and_is_reported(tmp_path: Path, extra: str) -> None:
    """By default: everything installed is covered by the signature; the rest is left out and listed."""
    priv, pub = generate_keypair()
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    sign_package(pkg, priv)
    (pkg / extra).parent.mkdir(exist_ok=True)
    (pkg / extra).write_bytes(SECRET)
    store = _store(tmp_path / "s", require_signatures=True, trusted_keys=(pub,))
    r = store.install(pkg)
    assert r.ok and r.skipped == (extra,), r
    active = store.active_path("mlp")
    assert active is not None and not (active / extra).exists()
    assert sorted(p.name for p in active.iterdir()) == [".store-install.json", "edge-model.sig", "edge-model.toml", "m.onnx"]
    for dirpath, _d, files in os.walk(store.root):
        for fn in files:
            assert SECRET not in (Path(dirpath) / fn).read_bytes()
    verifying = [r for r in store.journal.records() if r.get("phase") == "verifying"]
    assert verifying[-1]["skipped"] == [extra]


def test_unreferenced_file_in_an_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edge_sdk.cli import main

    archive = _zip_with(
        make_pkg(tmp_path / "p", "1.0", golden=False), tmp_path / "a.zip", lambda zf: zf.writestr("pkg/run.sh", "#!/bin/sh\n")
    )
    _refused(_store(tmp_path / "s", refuse_unreferenced=True), archive, "does not reference", "run.sh")
    root = tmp_path / "s2"
    _store(root)
    assert main(["models", "install", str(archive), "--store", str(root)]) == 0
    assert "not installed, not named by the manifest: run.sh" in capsys.readouterr().out


def test_empty_folders_are_not_installed(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "p", "1.0", golden=False)
    (pkg / "cache" / "deep").mkdir(parents=True)
    store = _store(tmp_path / "s")
    assert store.install(pkg).ok
    active = store.active_path("mlp")
    assert active is not None
    assert sorted(p.name for p in active.iterdir()) == [".store-install.json", "edge-model.toml", "m.onnx"]


# -- 4. anti-rollback against the highest version ever made active -------------------------------------


def test_old_signed_version_refused_after_a_rollback(tmp_path: Path) -> None:
    priv, pub = generate_keypair()
    for v in ("1.0", "1.5", "2.0"):
        sign_package(make_pkg(tmp_path / v, v, golden=False, seed=int(float(v) * 10)), priv)
    root = tmp_path / "s"
    store = _store(root, require_signatures=True, trusted_keys=(pub,))
    assert store.install(tmp_path / "1.0").ok and store.install(tmp_path / "2.0").ok
    assert store.rollback("mlp").state == "rolled_back"
    r = store.install(tmp_path / "1.5")  # newer than the active 1.0, older than the 2.0 installed
    assert (
        r.state == "failed_no_change" and "downgrade refused" in r.reason and "2.0" in r.reason and "expected a version >= 2.0" in r.reason
    )
    assert store.highest_version("mlp") == "2.0"
    # the record survives a restart and the removal of 2.0 from disk
    for v in store.versions("mlp"):
        if v.version == "2.0":
            shutil.rmtree(v.path)
    store = ModelStore(root)
    r = store.install(tmp_path / "1.5")
    assert r.state == "failed_no_change" and "downgrade refused" in r.reason
    assert store.install(tmp_path / "1.5", allow_downgrade=True).ok
    assert store.highest_version("mlp") == "2.0"  # an allowed downgrade never lowers the record
    assert store.install(tmp_path / "2.0").ok  # the highest version itself is not a downgrade


def test_rolled_back_health_failure_does_not_raise_the_record(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    assert store.install(make_pkg(tmp_path / "v1", "1.0", golden=False)).ok
    r = store.install(make_pkg(tmp_path / "v3", "3.0", model=bad_op_onnx(), golden=False))
    assert r.state == "rolled_back"
    assert store.highest_version("mlp") == "1.0"
    assert store.install(make_pkg(tmp_path / "v2", "2.0", golden=False, seed=2)).ok


def test_cli_downgrade_needs_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edge_sdk.cli import main

    root = tmp_path / "s"
    _store(root)
    for v in ("1.0", "2.0"):
        assert main(["models", "install", str(make_pkg(tmp_path / v, v, golden=False, seed=int(float(v)))), "--store", str(root)]) == 0
    assert main(["models", "rollback", "mlp", "--store", str(root)]) == 0
    v15 = make_pkg(tmp_path / "1.5", "1.5", golden=False, seed=5)
    capsys.readouterr()
    assert main(["models", "install", str(v15), "--store", str(root)]) == 1
    assert "--allow-downgrade" in capsys.readouterr().out
    assert main(["models", "install", str(v15), "--store", str(root), "--allow-downgrade"]) == 0


# -- 5. refusals name what was expected -----------------------------------------------------------------


def test_too_long_member_name_is_not_called_corrupt(tmp_path: Path) -> None:
    archive = _zip_with(make_pkg(tmp_path / "p", "1.0", golden=False), tmp_path / "a.zip", lambda zf: zf.writestr("pkg/" + "n" * 300, "x"))
    _refused(_store(tmp_path / "s"), archive, "300 bytes", "expected at most 255 bytes")


@pytest.mark.parametrize(
    "make, needles",
    [
        (lambda d: d / "missing", ("does not exist", "expected a package folder")),
        (lambda d: _write(d / "model.bin", b"x"), ("without a .zip/.tar name", "expected a package folder")),
        (lambda d: _write(d / "junk.zip", os.urandom(256)), ("not a readable zip archive", "expected a valid")),
        (lambda d: _write(d / "junk.tar.gz", os.urandom(256)), ("not a readable tar archive", "expected a valid")),
        (lambda d: _zip_bytes(d / "empty.zip", {"a/readme": b"x", "b/readme": b"y"}), ("no edge-model.toml", "expected it at the top")),
        (lambda d: _zip_bytes(d / "slip.zip", {"../evil": b"x"}), ("outside the package", "expected a relative path")),
        (lambda d: _zip_bytes(d / "big.zip", {"edge-model.toml": b"#" * (5 << 20)}), ("larger than", "expected at most")),
    ],
)
def test_refusal_messages_name_what_was_expected(tmp_path: Path, make: Callable[[Path], Path], needles: tuple[str, ...]) -> None:
    _refused(_store(tmp_path / "s"), make(tmp_path), *needles)


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def _zip_bytes(p: Path, members: dict[str, bytes]) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return _write(p, buf.getvalue())
