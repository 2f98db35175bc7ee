"""Hostile packages, by class: each class is fixed at its root (a budget, a type check before an
open, a bound before a size is used), and each test here attacks that root in a different way.

Everything is real: package folders under tmp_path, zip and tar archives built with zipfile/tarfile
(bombs by compressing zeros, header fields patched where an attack needs a lie), FIFOs by
os.mkfifo. Anything that could hang runs in a thread with a bounded wait, so a regression fails
instead of blocking the suite.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import stat
import struct
import sys
import tarfile
import threading
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

import edge_sdk
from converters.packaging import write_package
from edge_sdk import _toml, errors
from edge_sdk.package import MANIFEST_NAME, ModelPackage, archive, extract_archive, package_folder
from edge_sdk.package.modelfile import looks_pickled, sniff_format

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, devices and POSIX modes")

MiB = 1024**2


# --- helpers ------------------------------------------------------------------------------


def bounded(fn: Callable[[], Any], timeout: float = 20.0, fifo: Path | None = None) -> BaseException | None:
    """Run ``fn`` in a thread; fail (not hang) if it takes longer than ``timeout``. Returns what it raised."""
    out: dict[str, BaseException | None] = {"exc": None}

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["exc"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo is not None:  # release a reader blocked on the FIFO so the thread can end
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"call still running after {timeout} s (hung on a non-regular file?)")
    return out["exc"]


def refused(fn: Callable[[], Any], exc: type[BaseException], match: str, **kw: Any) -> BaseException:
    e = bounded(fn, **kw)
    assert e is not None, "expected a refusal, the call succeeded"
    assert isinstance(e, exc), f"expected {exc.__name__}, got {type(e).__name__}: {e}"
    import re

    assert re.search(match, str(e)), f"{match!r} not in {e}"
    return e


def good(root: Path, manifest: dict | None = None, model: bytes | None = None, verify: bool = True) -> Path:
    write_package(root, manifest or mlp_manifest(), {"m.onnx": model if model is not None else mlp_onnx()}, overwrite=True, verify=verify)
    return root


def good_files(tmp: Path) -> dict[str, bytes]:
    root = tmp / "_good"
    if not root.exists():
        good(root)
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def edit_manifest(root: Path, edit: Callable[[dict], None]) -> Path:
    """Change the manifest as written (bypassing the writer's own checks: this is the attacker's file)."""
    p = root / MANIFEST_NAME
    d = _toml.loads(p.read_text())
    edit(d)
    p.write_text(_toml.dumps(d))
    return root


def cache_leftovers(cache: Path) -> list[str]:
    """Everything an extraction left in the cache (refusals must leave nothing)."""
    pk = cache / "packages"
    return sorted(str(p.relative_to(cache)) for p in pk.rglob("*")) if pk.exists() else []


def zip_zeros(path: Path, members: dict[str, int], extra: dict[str, bytes] | None = None) -> Path:
    """A zip whose members named in ``members`` hold that many zero bytes (compressed as they are written)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in (extra or {}).items():
            z.writestr(name, data)
        for name, size in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w", force_zip64=True) as w:
                left = size
                block = bytes(MiB)
                while left > 0:
                    w.write(block[: min(left, MiB)])
                    left -= MiB
    return path


def patch_zip_headers(data: bytes, name: str, *, flags_or: int = 0, method: int | None = None, sizes: int | None = None) -> bytes:
    """Patch member ``name``'s local and central headers: OR its general purpose flags, set its
    compression method, or set its declared uncompressed size (32-bit field)."""
    b = bytearray(data)
    raw = name.encode()
    for sig, flag_at, method_at, usize_at, name_at in ((b"PK\x03\x04", 6, 8, 22, 30), (b"PK\x01\x02", 8, 10, 24, 46)):
        pos = b.find(sig)
        while pos != -1:
            n = struct.unpack_from("<H", b, pos + name_at - (4 if sig == b"PK\x03\x04" else 18))[0]
            if bytes(b[pos + name_at : pos + name_at + n]) == raw:
                if flags_or:
                    struct.pack_into("<H", b, pos + flag_at, struct.unpack_from("<H", b, pos + flag_at)[0] | flags_or)
                if method is not None:
                    struct.pack_into("<H", b, pos + method_at, method)
                if sizes is not None:
                    struct.pack_into("<I", b, pos + usize_at, sizes)
            pos = b.find(sig, pos + 1)
    return bytes(b)


def open_in(tmp: Path) -> Callable[[Path], Callable[[], ModelPackage]]:
    return lambda p: lambda: ModelPackage.open(p, cache_dir=tmp / "cache")


# --- 1. archive budgets: declared size, bytes written, compression ratio, cleanup ---------------


def test_zip_bomb_member_is_refused_by_ratio_before_any_byte_is_written(tmp_path: Path) -> None:
    z = zip_zeros(tmp_path / "bomb.zip", {"pkg/weights.bin": 300 * MiB}, {f"pkg/{k}": v for k, v in good_files(tmp_path).items()})
    assert z.stat().st_size < 2 * MiB
    t0 = time.perf_counter()
    refused(open_in(tmp_path)(z), errors.UnsafePackageError, r"ratio over 200:1.*refused before extraction")
    assert time.perf_counter() - t0 < 5  # refused from the headers, not after inflating 300 MiB
    assert cache_leftovers(tmp_path / "cache") == []


def test_zip_bomb_spread_over_members_is_refused_by_the_archive_ratio(tmp_path: Path) -> None:
    # each member is under the per-member floor; together they declare far more than the archive could hold
    z = zip_zeros(
        tmp_path / "spread.zip", {f"pkg/pad{i}.bin": 40 * MiB for i in range(3)}, {f"pkg/{k}": v for k, v in good_files(tmp_path).items()}
    )
    refused(open_in(tmp_path)(z), errors.UnsafePackageError, r"members declare \d+ bytes from a \d+-byte archive")
    assert cache_leftovers(tmp_path / "cache") == []


def test_tar_gz_bomb_is_refused_at_its_header_before_its_data_are_inflated(tmp_path: Path) -> None:
    class Zeros(io.RawIOBase):
        def __init__(self, n: int) -> None:
            self.left = n

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    t = tmp_path / "bomb.tar.gz"
    with tarfile.open(t, "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo("pkg/weights.bin")
        info.size = 300 * MiB
        tf.addfile(info, io.BufferedReader(Zeros(info.size)))
        for k, v in good_files(tmp_path).items():
            i = tarfile.TarInfo(f"pkg/{k}")
            i.size = len(v)
            tf.addfile(i, io.BytesIO(v))
    t0 = time.perf_counter()
    refused(open_in(tmp_path)(t), errors.UnsafePackageError, r"ratio over 200:1")
    assert time.perf_counter() - t0 < 5
    assert cache_leftovers(tmp_path / "cache") == []


def test_member_that_inflates_past_its_declared_size_is_stopped(tmp_path: Path) -> None:
    # the headers say 1000 bytes, the deflate stream holds 1 MiB: no more than 1000 bytes are ever written
    files = {f"pkg/{k}": v for k, v in good_files(tmp_path).items()}
    z = tmp_path / "liar.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for k, v in files.items():
            zf.writestr(k, v)
        zf.writestr("pkg/pad.bin", bytes(MiB))
    z.write_bytes(patch_zip_headers(z.read_bytes(), "pkg/pad.bin", sizes=1000))
    dest = tmp_path / "out"
    refused(lambda: extract_archive(z, dest), errors.ModelFormatError, r"corrupt zip archive at member 'pkg/pad.bin'")
    assert not dest.exists() or list(dest.rglob("*")) == []


def test_byte_limit_with_stored_members_and_partial_tar_output_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "MAX_ARCHIVE_BYTES", 50_000)
    files = good_files(tmp_path)
    t = tmp_path / "big.tar"
    with tarfile.open(t, "w") as tf:  # tar is read member by member: the good files are written first
        for k, v in files.items():
            i = tarfile.TarInfo(f"pkg/{k}")
            i.size = len(v)
            tf.addfile(i, io.BytesIO(v))
        i = tarfile.TarInfo("pkg/pad.bin")
        i.size = 60_000
        tf.addfile(i, io.BytesIO(bytes(i.size)))
    dest = tmp_path / "out"
    dest.mkdir()
    refused(lambda: extract_archive(t, dest), errors.UnsafePackageError, "expands past 50000 bytes")
    assert list(dest.iterdir()) == []  # what was written before the refusal is gone again
    refused(open_in(tmp_path)(t), errors.UnsafePackageError, "expands past 50000 bytes")
    assert cache_leftovers(tmp_path / "cache") == []


def test_corrupt_second_member_removes_the_first(tmp_path: Path) -> None:
    z = tmp_path / "c.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/a.bin", b"a" * 1000)
        zf.writestr("pkg/b.bin", bytes(range(256)) * 64)
    data = bytearray(z.read_bytes())
    at = data.index(b"pkg/b.bin") + len("pkg/b.bin") + 8
    for i in range(at, at + 16):
        data[i] ^= 0x5A
    z.write_bytes(bytes(data))
    dest = tmp_path / "out"
    dest.mkdir()
    refused(lambda: extract_archive(z, dest), errors.ModelFormatError, r"corrupt zip archive at member 'pkg/b.bin'")
    assert list(dest.rglob("*")) == []


def test_archive_without_a_manifest_is_not_kept_in_the_cache(tmp_path: Path) -> None:
    z = tmp_path / "nomanifest.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("pkg/m.onnx", mlp_onnx())
    refused(open_in(tmp_path)(z), errors.ManifestError, "no edge-model.toml")
    assert cache_leftovers(tmp_path / "cache") == []


def test_good_archives_still_extract_once_and_open(tmp_path: Path) -> None:
    files = good_files(tmp_path)
    z = tmp_path / "ok.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for k, v in files.items():
            zf.writestr(f"pkg/{k}", v)
    t = tmp_path / "ok.tar.gz"
    with tarfile.open(t, "w:gz") as tf:
        tf.add(tmp_path / "_good", arcname="pkg")
    for a in (z, t):
        pkg = ModelPackage.open(a, cache_dir=tmp_path / "cache")
        assert pkg.manifest.name == "mlp" and (pkg.root.parent / ".complete").exists()
        assert package_folder(a, tmp_path / "cache") == pkg.root  # cached by digest


# --- 2. non-regular files: type-checked before (and after) every open, never waited on -------------


def test_fifo_anywhere_in_a_folder_is_refused_without_hanging(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    os.mkfifo(root / "notes.txt")
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, r"notes.txt.*FIFO", fifo=root / "notes.txt")


def test_fifo_as_the_model_file_is_refused_without_hanging(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    (root / "m.onnx").unlink()
    os.mkfifo(root / "m.onnx")
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, "FIFO", fifo=root / "m.onnx")
    refused(lambda: ModelPackage.open(root, verify=False), errors.UnsafePackageError, "FIFO", fifo=root / "m.onnx")


def test_fifo_as_the_manifest_is_refused_without_hanging(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    (root / MANIFEST_NAME).unlink()
    os.mkfifo(root / MANIFEST_NAME)
    e = refused(lambda: ModelPackage.open(root), errors.ModelPackageError, "FIFO", fifo=root / MANIFEST_NAME)
    assert MANIFEST_NAME in str(e)


def test_fifo_named_like_an_archive_is_refused_without_hanging(tmp_path: Path) -> None:
    f = tmp_path / "pkg.zip"
    os.mkfifo(f)
    refused(open_in(tmp_path)(f), errors.UnsafePackageError, "FIFO", fifo=f)
    g = tmp_path / "pkg.bin"
    os.mkfifo(g)
    refused(open_in(tmp_path)(g), errors.UnsafePackageError, "FIFO", fifo=g)


def test_fifo_swapped_in_after_open_is_refused_by_read_and_open_verified(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    pkg = ModelPackage.open(root)
    v = pkg.manifest.variants[0]
    (root / "m.onnx").unlink()
    os.mkfifo(root / "m.onnx")
    refused(lambda: pkg.read_verified(v), errors.UnsafePackageError, "FIFO", fifo=root / "m.onnx")
    refused(lambda: pkg.open_verified(v), errors.UnsafePackageError, "FIFO", fifo=root / "m.onnx")


def test_socket_and_device_in_a_folder_are_refused(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(root / "sock"))
        refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, r"sock.*socket")
    finally:
        s.close()
        (root / "sock").unlink()
    try:
        os.mknod(root / "dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    except (PermissionError, OSError):
        pytest.skip("creating device nodes needs privileges")
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, r"dev.*character device")


def test_symlinks_to_devices_and_outside_files_are_refused(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    os.symlink("/dev/zero", root / "zero.bin")
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, "outside the package")
    (root / "zero.bin").unlink()
    (root / "m.onnx").unlink()
    os.symlink("/dev/zero", root / "m.onnx")
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, "outside the package")


def test_fifo_and_device_members_in_archives_are_refused(tmp_path: Path) -> None:
    files = good_files(tmp_path)
    z = tmp_path / "fifo.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for k, v in files.items():
            zf.writestr(f"pkg/{k}", v)
        info = zipfile.ZipInfo("pkg/pipe")
        info.external_attr = (stat.S_IFIFO | 0o644) << 16
        zf.writestr(info, b"")
    refused(open_in(tmp_path)(z), errors.UnsafePackageError, r"'pkg/pipe' is a FIFO")
    for kind, what in ((tarfile.FIFOTYPE, "FIFO"), (tarfile.CHRTYPE, "character device"), (tarfile.BLKTYPE, "block device")):
        t = tmp_path / f"{what.split()[0]}.tar"
        with tarfile.open(t, "w") as tf:
            for k, v in files.items():
                i = tarfile.TarInfo(f"pkg/{k}")
                i.size = len(v)
                tf.addfile(i, io.BytesIO(v))
            i = tarfile.TarInfo("pkg/node")
            i.type = kind
            tf.addfile(i)
        refused(open_in(tmp_path)(t), errors.UnsafePackageError, f"'pkg/node' is a {what}")
    assert cache_leftovers(tmp_path / "cache") == []


# --- 3. declared sizes: bounded before use, against sane maxima and the device's memory budget -------


def test_huge_manifest_is_refused_after_a_bounded_read(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    with open(root / MANIFEST_NAME, "r+b") as f:
        f.truncate(1_200_000_000)  # sparse: 1.2 GB declared, nothing on disk
    tracemalloc.start()
    try:
        refused(lambda: ModelPackage.open(root), errors.ManifestError, r"over the limit of \d+ bytes")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * MiB  # the limit plus one byte, not 1.2 GB


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["inputs"][0].update(shape=[1, 3, 60000, 60000], layout="NCHW", dims={},
                                         preprocess={"kind": "image", "size_hw": [60000, 60000]}), r"size_hw: 60000 is over the limit of 16384"),
        (lambda d: d["inputs"][0].update(shape=[1, 3, 12000, 12000], layout="NCHW", dims={},
                                         preprocess={"kind": "image", "size_hw": [12000, 12000]}), r"size_hw: 144000000 is over the limit .*MAX_IMAGE_PIXELS"),
        (lambda d: d["inputs"][0].update(dims={"batch": [1, 10**12]}), r"dims\.batch: 1000000000000 is over the limit of 16777216"),
        (lambda d: d["inputs"][0].update(shape=[2**40, 8], dims={}), r"shape\[0\]: 1099511627776 is over the limit"),
        (lambda d: d["inputs"][0].update(shape=["batch", 4096, 4096], dims={"batch": [1, 4096]}), r"shape: \d+ is over the limit of 2147483648 .*MAX_TENSOR_ELEMENTS"),
        (lambda d: d["inputs"][0].update(shape=[1] * 17, dims={}), r"shape: 17 items, over the limit of 16"),
        (lambda d: d["variants"][0].update(size=2**50), r"size: 1125899906842624 is over the limit .*MAX_FILE_BYTES"),
        (lambda d: d["variants"][0].update(external_data=[{"file": "w.bin", "sha256": "0" * 64, "size": -5}]), r"external_data\[0\]\.size: expected >= 0"),
        (lambda d: d.update(variants=[dict(d["variants"][0], id=f"v{i}") for i in range(257)]), r"variants: 257 items, over the limit of 256"),
        (lambda d: d["variants"][0].update(benchmarks=[{"profile": "p", "latency_ms": 1.0, "threads": 1, "batch": 10**9}]), r"batch: 1000000000 is over the limit"),
        (lambda d: d["outputs"][0].update(shape=["batch", 2**30]), r"shape\[1\]: 1073741824 is over the limit"),
    ],
    ids=["size_hw 60000", "size_hw pixels", "batch bound", "fixed dim", "tensor elements", "rank", "file size", "negative external size",
         "variants count", "benchmark batch", "output dim"],
)  # fmt: skip
def test_declared_sizes_and_counts_are_bounded_with_the_field_named(tmp_path: Path, edit: Callable[[dict], None], match: str) -> None:
    root = edit_manifest(good(tmp_path / "p"), edit)
    refused(lambda: ModelPackage.open(root), errors.ManifestError, match)


def test_counts_are_bounded_before_the_items_are_parsed() -> None:
    from edge_sdk.package import Manifest

    d = mlp_manifest()
    d["variants"][0].update(sha256="0" * 64, size=10)
    with pytest.raises(errors.ManifestError, match=r"labels: 1048577 items, over the limit of 1048576"):
        Manifest.from_dict({**d, "labels": ["x"] * (2**20 + 1)})
    with pytest.raises(errors.ManifestError, match=r"inputs: 1025 items, over the limit of 1024"):
        Manifest.from_dict({**d, "inputs": [d["inputs"][0]] * 1025})
    with pytest.raises(errors.ManifestError, match=r"external_data: 4097 items"):
        Manifest.from_dict({**d, "variants": [dict(d["variants"][0], external_data=[{}] * 4097)]})


def test_generation_sizes_are_bounded() -> None:
    from edge_sdk.package import GenerationSpec, VariantGeneration

    base = {"architecture": "llama", "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8, "vocab_size": 10, "context_length": 64,
            "tokenizer": {"file": "t.json", "sha256": "0" * 64, "size": 10}}  # fmt: skip
    GenerationSpec.from_dict(base, "g")
    for key, value, match in (
        ("context_length", 2**40, r"context_length: \d+ is over the limit"),
        ("n_layers", 10**6, r"n_layers: 1000000 is over the limit"),
        ("tokenizer", {"file": "t.json", "sha256": "0" * 64, "size": 2**40}, r"tokenizer\.size: \d+ is over the limit"),
    ):
        with pytest.raises(errors.ManifestError, match=match):
            GenerationSpec.from_dict({**base, key: value}, "g")
    vg = {"bits": 4, "kv_dtype": "float32", "kv_bytes_per_token": 2**40, "weight_bytes_per_token": 10}
    with pytest.raises(errors.ManifestError, match=r"kv_bytes_per_token: \d+ is over the limit"):
        VariantGeneration.from_dict(vg, "v")


BUDGET_MIB = 512


def small_profile(tmp: Path) -> Path:
    """generic-x86_64 with a 512 MiB memory budget (a small board)."""
    src = Path(__file__).resolve().parents[1] / "device_profiles" / "generic-x86_64.toml"
    text = src.read_text().replace("memory_budget_mb = 8192", f"memory_budget_mb = {BUDGET_MIB}")
    assert f"memory_budget_mb = {BUDGET_MIB}" in text
    p = tmp / "generic-x86_64.toml"
    p.write_text(text)
    return p


def test_huge_minimum_batch_is_refused_by_selection_before_anything_is_allocated(tmp_path: Path) -> None:
    # within the sane maxima, but the smallest declared batch alone is twice the device's memory budget
    features = 1024
    batch = 2 * BUDGET_MIB * MiB // (4 * features)
    m = mlp_manifest(features, 4)
    m["inputs"][0]["dims"] = {"batch": [batch, batch]}
    m["variants"] = [
        {"id": "fp32-a", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"},
        {"id": "fp32-b", "file": "m.onnx", "backend": "litert", "precision": "fp32"},  # a tie on precision (timed at load)
    ]
    root = tmp_path / "p"
    write_package(root, m, {"m.onnx": mlp_onnx(features, 4)}, verify=False)
    edit_manifest(root, lambda d: d["variants"].pop())  # the litert entry would need a .tflite; one variant shows the bound
    tracemalloc.start()
    try:
        e = refused(
            lambda: edge_sdk.load(root, small_profile(tmp_path), cache_dir=tmp_path / "cache"),
            errors.SelectionError,
            r"declared inputs need",
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "smallest shape" in str(e) and "budget" in str(e)
    assert peak < 256 * MiB
    with pytest.raises(errors.SelectionError, match="cannot run here"):  # a forced variant is held to the same bound
        edge_sdk.load(root, small_profile(tmp_path), cache_dir=tmp_path / "cache", variant="fp32-a")


def test_image_size_is_checked_against_the_memory_budget(tmp_path: Path) -> None:
    side = 8192  # within the sane maximum (64 Mpx): 8192^2 x 3 float32 is 768 MiB, plus the tensor
    m = mlp_manifest()
    m["inputs"][0] = {"name": "x", "dtype": "float32", "shape": [1, 3, side, side], "layout": "NCHW",
                      "preprocess": {"kind": "image", "size_hw": [side, side]}}  # fmt: skip
    root = tmp_path / "p"
    write_package(root, m, {"m.onnx": mlp_onnx()}, verify=False)
    refused(
        lambda: edge_sdk.load(root, small_profile(tmp_path), cache_dir=tmp_path / "cache"),
        errors.SelectionError,
        r"preprocess\.size_hw \[8192, 8192\]",
    )


def test_measurement_feeds_are_bounded_before_allocating() -> None:
    from edge_sdk.model import _random_feeds
    from edge_sdk.package import TensorSpec

    spec = TensorSpec("x", "float32", ("batch", 1 << 20), "NC", (("batch", 1 << 10, 1 << 10),))  # 4 GiB at its smallest
    with pytest.raises(errors.ManifestError, match=r"input 'x'.*over the limit of \d+ bytes"):
        _random_feeds([spec])
    small = TensorSpec("x", "float32", ("batch", 8), "NC", (("batch", 1, 8),))
    assert _random_feeds([small])["x"].shape == (1, 8)


# --- 4. typed archive errors, duplicates, pickles, precision labels, messages --------------------------


def _zip_of_good(tmp: Path, name: str, extra: dict[str, bytes] | None = None, method: int = zipfile.ZIP_DEFLATED) -> Path:
    z = tmp / name
    with zipfile.ZipFile(z, "w", method) as zf:
        for k, v in good_files(tmp).items():
            zf.writestr(f"pkg/{k}", v)
        for k, v in (extra or {}).items():
            zf.writestr(k, v)
    return z


@pytest.mark.parametrize(
    "patch, match",
    [
        ({"flags_or": 0x1}, r"member 'pkg/m.onnx' is encrypted"),
        ({"method": 9}, r"member 'pkg/m.onnx' uses compression method 9 \(deflate64\), which is not supported"),
        ({"method": 93}, r"member 'pkg/m.onnx' uses compression method 93 \(zstandard\)"),
        ({"method": 98}, r"method 98 \(PPMd\)"),
        ({"method": 77}, r"method 77 \(unknown\)"),
    ],
    ids=["encrypted", "deflate64", "zstd", "ppmd", "unknown method"],
)
def test_unreadable_zip_members_are_typed_errors_naming_the_member(tmp_path: Path, patch: dict, match: str) -> None:
    z = _zip_of_good(tmp_path, "a.zip")
    z.write_bytes(patch_zip_headers(z.read_bytes(), "pkg/m.onnx", **patch))
    refused(open_in(tmp_path)(z), errors.ModelFormatError, match)
    assert cache_leftovers(tmp_path / "cache") == []


def test_duplicate_members_are_refused_not_last_wins(tmp_path: Path) -> None:
    files = good_files(tmp_path)
    z = tmp_path / "dup.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns "Duplicate name" and writes it anyway
        with zipfile.ZipFile(z, "w") as zf:
            for k, v in files.items():
                zf.writestr(f"pkg/{k}", v)
            zf.writestr("pkg/m.onnx", mlp_onnx(seed=9))  # the swapped model an unwary extractor would keep
    refused(open_in(tmp_path)(z), errors.UnsafePackageError, r"'pkg/m.onnx' appears more than once")
    t = tmp_path / "dup.tar"
    with tarfile.open(t, "w") as tf:
        for name, data in [*((f"pkg/{k}", v) for k, v in files.items()), ("pkg/m.onnx", mlp_onnx(seed=9))]:
            i = tarfile.TarInfo(name)
            i.size = len(data)
            tf.addfile(i, io.BytesIO(data))
    refused(open_in(tmp_path)(t), errors.UnsafePackageError, "appears more than once")
    refused(open_in(tmp_path)(_zip_of_good(tmp_path, "case.zip", {"pkg/M.ONNX": b"x"})), errors.UnsafePackageError, "differs only in case")
    refused(
        open_in(tmp_path)(_zip_of_good(tmp_path, "dot.zip", {"pkg/./m.onnx": b"x"})), errors.UnsafePackageError, "appears more than once"
    )
    refused(
        open_in(tmp_path)(_zip_of_good(tmp_path, "under.zip", {"pkg/m.onnx/x": b"x"})), errors.UnsafePackageError, "which is a file member"
    )
    assert cache_leftovers(tmp_path / "cache") == []


def test_over_long_member_names_say_so_instead_of_corrupt(tmp_path: Path) -> None:
    e = refused(open_in(tmp_path)(_zip_of_good(tmp_path, "long.zip", {"pkg/" + "a" * 300: b"x"})), errors.UnsafePackageError,
                r"path component 'a+'\.\.\. is 300 bytes long, limit 255")  # fmt: skip
    assert "corrupt" not in str(e)
    refused(open_in(tmp_path)(_zip_of_good(tmp_path, "path.zip", {"pkg/" + "/".join(["b" * 200] * 6): b"x"})), errors.UnsafePackageError,
            r"is 12\d\d bytes long, limit 1024")  # fmt: skip
    refused(
        open_in(tmp_path)(_zip_of_good(tmp_path, "deep.zip", {"pkg/" + "d/" * 40 + "x": b"x"})),
        errors.UnsafePackageError,
        "nested 42 folders deep",
    )


@pytest.mark.parametrize("protocol", range(6))
def test_pickles_of_every_protocol_are_refused(tmp_path: Path, protocol: int) -> None:
    blob = pickle.dumps({"w": [1.5, 2], "cls": Path}, protocol=protocol)
    assert looks_pickled(blob) and sniff_format(blob) == "pickle"
    root = good(tmp_path / "stray")
    (root / "weights.bin").write_bytes(blob)
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, r"weights.bin: file content is a Python pickle")
    model = good(tmp_path / "model", model=mlp_onnx(), verify=False)
    (model / "m.onnx").write_bytes(blob)
    edit_manifest(model, lambda d: d["variants"][0].update(size=len(blob), sha256=__import__("hashlib").sha256(blob).hexdigest()))
    refused(lambda: ModelPackage.open(model), errors.UnsafePackageError, "pickle")


def test_large_protocol_0_and_1_pickles_are_recognised_from_their_head(tmp_path: Path) -> None:
    for protocol in (0, 1):
        blob = pickle.dumps(["x" * 200_000, {"k": list(range(20_000))}], protocol=protocol)
        assert len(blob) > 100_000 and looks_pickled(blob[: 1 << 16], whole=False)
        root = good(tmp_path / f"p{protocol}")
        (root / "big.dat").write_bytes(blob)
        refused(lambda root=root: ModelPackage.open(root), errors.UnsafePackageError, "pickle")


def test_text_and_model_files_are_not_mistaken_for_pickles(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    texts = {
        "labels.txt": b"cat\ndog\nbird\n",
        "tokenizer.json": b'{"model": {"vocab": {"a": 1}}}',
        "README.md": b"# Model card\nIt classifies.\n",
        "config.yaml": b"name: mlp\nsize: 8\n",
        "numbers.csv": b"1,2,3\n4,5,6\n",
        "Notes": b"I think this is fine.\n",
    }
    for name, data in texts.items():
        (root / name).write_bytes(data)
        assert not looks_pickled(data), name
    np.save(root / "x.npy", np.zeros(4, np.float32))
    assert not looks_pickled(mlp_onnx())
    ModelPackage.open(root)


def test_zip_holding_a_pickle_under_another_name_is_refused(tmp_path: Path) -> None:
    root = good(tmp_path / "p")
    with zipfile.ZipFile(root / "weights.bin", "w") as zf:  # a PyTorch checkpoint, renamed
        zf.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
        zf.writestr("archive/version", b"3\n")
    refused(lambda: ModelPackage.open(root), errors.UnsafePackageError, r"weights.bin: is a zip holding a pickle")


def _int8_onnx() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    wq = numpy_helper.from_array(np.arange(32, dtype=np.int8).reshape(8, 4), "wq")
    scale = numpy_helper.from_array(np.array(0.02, np.float32), "scale")
    zp = numpy_helper.from_array(np.array(0, np.int8), "zp")
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "scale", "zp"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])],
        "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [wq, scale, zp],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _fp32_with_int8_zero_point() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    zp = numpy_helper.from_array(np.array(0, np.int8), "zp")  # a lone int8 scalar cannot pass the weights off as int8
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w, zp],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize(
    "model, label, ok",
    [
        (mlp_onnx, "int8", False),
        (mlp_onnx, "int4", False),
        (mlp_onnx, "fp16", False),
        (mlp_onnx, "fp32", True),
        (_int8_onnx, "int8", True),
        (_int8_onnx, "fp32", True),  # a higher label than the weights is not a claim selection would prefer
        (_int8_onnx, "int4", False),
        (_fp32_with_int8_zero_point, "int8", False),
    ],
    ids=[
        "fp32 as int8",
        "fp32 as int4",
        "fp32 as fp16",
        "fp32 as fp32",
        "int8 as int8",
        "int8 as fp32",
        "int8 as int4",
        "fp32 + int8 zero point as int8",
    ],
)
def test_precision_label_is_checked_against_the_weights(tmp_path: Path, model: Callable[[], bytes], label: str, ok: bool) -> None:
    m = mlp_manifest()
    m["variants"][0]["precision"] = label
    root = good(tmp_path / "p", m, model(), verify=False)
    if ok:
        ModelPackage.open(root)
    else:
        refused(lambda: ModelPackage.open(root), errors.SignatureMismatchError, rf"labelled precision '{label}'.*relabel")


def test_tflite_precision_label_is_checked(tmp_path: Path) -> None:
    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.input("x", shape=(1, 8), dtype="float32")
    b.output(b.fully_connected(x, np.ones((4, 8), np.float32), np.zeros(4, np.float32)), "y")
    data = b.build()
    m = mlp_manifest(file="m.tflite")
    m["inputs"][0].update(shape=[1, 8])
    del m["inputs"][0]["dims"]
    m["outputs"][0].update(shape=[1, 4])
    m["variants"][0].update(backend="litert", precision="int8")
    root = tmp_path / "p"
    write_package(root, m, {"m.tflite": data}, verify=False)
    refused(lambda: ModelPackage.open(root), errors.SignatureMismatchError, r"labelled precision 'int8'.*fp32")
    edit_manifest(root, lambda d: d["variants"][0].update(precision="fp32"))
    ModelPackage.open(root)


def test_mislabelled_variant_is_not_preferred_by_load(tmp_path: Path) -> None:
    # the attack: an fp32 file labelled int8 so that int8-first selection picks it; refused at open, before selection
    m = mlp_manifest()
    m["variants"] = [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"},
                     {"id": "int8", "file": "m.onnx", "backend": "onnxruntime", "precision": "int8"}]  # fmt: skip
    root = good(tmp_path / "p", m, verify=False)
    refused(lambda: edge_sdk.load(root, "generic-x86_64", cache_dir=tmp_path / "cache"), errors.SignatureMismatchError, "variant int8")
