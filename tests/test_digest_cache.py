"""The process-wide digest cache (edge_sdk/package/archive.py ``DIGESTS``): a load hashes the model file
at most once, a second load of the unchanged package not at all, and any change to the file (bytes,
size, mtime, inode, even with the mtime put back) makes it hashed and checked again."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk import errors
from edge_sdk.package import ModelPackage
from edge_sdk.package.archive import (
    DIGEST_CACHE_ENTRIES,
    DIGESTS,
    RACY_WINDOW_NS,
    clear_digest_cache,
    digest_cache_stats,
    verify_file,
)
from edge_sdk.package.manifest import FileRef
from tests.conftest import mlp_manifest, mlp_onnx

N_FILES = DIGEST_CACHE_ENTRIES + 44


@pytest.fixture(scope="module")
def aged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Packages and loose files written once, then left alone past the racy window (digests of files
    changed more recently are not remembered), so the tests see the cache remember them."""
    from converters.packaging import write_package

    base = tmp_path_factory.mktemp("aged")
    out: dict[str, Path] = {}
    for name in ("twice", "rewritten", "utime_back", "replaced"):
        write_package(base / name, mlp_manifest(), {"m.onnx": mlp_onnx()})
        out[name] = base / name
    files = base / "files"
    files.mkdir()
    for i in range(N_FILES):
        (files / f"f{i:03d}.bin").write_bytes(b"x%d" % i * 100)
    out["files"] = files
    out["ort_cache"] = base / "ort_cache"
    with edge_sdk.load(out["twice"], cache_dir=out["ort_cache"]):  # writes ONNX Runtime's optimised model, aged below
        pass
    time.sleep(RACY_WINDOW_NS / 1e9 + 0.2)
    return out


def _ref(root: Path, rel: str) -> FileRef:
    data = (root / rel).read_bytes()
    return FileRef(rel, hashlib.sha256(data).hexdigest(), len(data))


def test_a_load_hashes_the_model_once_and_a_second_load_not_at_all(aged: dict[str, Path]) -> None:
    """A load hashes the model once (open() verifies it; the bytes are read again, a digest-cache hit, only
    if the sandbox has not seen this digest pass) and ONNX Runtime's cached optimised model once; a second
    load of the unchanged package hashes nothing: every check is a hit."""
    root, cache = aged["twice"], aged["ort_cache"]
    size = (root / "m.onnx").stat().st_size
    (opt,) = (cache / "ort-optimized").glob("*.onnx")
    clear_digest_cache()
    with edge_sdk.load(root, cache_dir=cache) as m:
        assert m.variant.id == "fp32" and m.session.info.optimized_cache.startswith("hit ")
    s = digest_cache_stats()
    assert (s["hashes"], s["bytes_hashed"]) == (2, size + opt.stat().st_size)
    assert s["hits"] <= 1 and s["entries"] == 2
    with edge_sdk.load(root, cache_dir=cache) as m:
        r = m.predict({"x": np.ones((1, 8), "float32")})
        assert r.model_sha256 == m.variant.sha256 and m.session.info.optimized_cache.startswith("hit ")
    s2 = digest_cache_stats()
    assert s2["hashes"] == 2 and s2["hits"] - s["hits"] >= 2  # no new hash: the model's check and the optimised model were hits


@pytest.mark.parametrize("put_mtime_back", [False, True], ids=["mtime-bumped", "mtime-restored"])
def test_a_rewritten_file_is_hashed_again_and_refused(aged: dict[str, Path], put_mtime_back: bool) -> None:
    root = aged["utime_back" if put_mtime_back else "rewritten"]
    f = root / "m.onnx"
    clear_digest_cache()
    ModelPackage.open(root)  # digest remembered
    assert digest_cache_stats()["entries"] == 1
    st = f.stat()
    other = mlp_onnx(seed=9)
    assert len(other) == st.st_size and other != f.read_bytes()
    with open(f, "r+b") as w:  # same inode, same size, different bytes
        w.write(other)
    if put_mtime_back:  # size, inode and mtime as cached: only the ctime the kernel stamped tells
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (f.stat().st_mtime_ns, f.stat().st_ino, f.stat().st_size) == (st.st_mtime_ns, st.st_ino, st.st_size)
    else:
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    before = digest_cache_stats()["hashes"]
    with pytest.raises(errors.IntegrityError, match="sha256"):
        edge_sdk.load(root)
    assert digest_cache_stats()["hashes"] == before + 1


def test_a_replaced_file_is_hashed_again_and_refused(aged: dict[str, Path]) -> None:
    root = aged["replaced"]
    clear_digest_cache()
    pkg = ModelPackage.open(root)
    tmp = root / "m.onnx.new"
    tmp.write_bytes(mlp_onnx(seed=9))
    os.replace(tmp, root / "m.onnx")  # a new inode under the same name
    with pytest.raises(errors.IntegrityError, match="sha256"):
        pkg.read_verified(pkg.manifest.variants[0])
    assert digest_cache_stats()["hashes"] == 2


def test_a_freshly_written_file_is_not_remembered(tmp_path: Path) -> None:
    # Changed within the racy window: a rewrite in the same timestamp tick would leave the stat key
    # as it was, so the digest is not kept and every check hashes.
    from converters.packaging import write_package

    root = tmp_path / "fresh"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    clear_digest_cache()
    pkg = ModelPackage.open(root)
    pkg.read_verified(pkg.manifest.variants[0])
    s = digest_cache_stats()
    assert (s["hashes"], s["hits"], s["entries"]) == (2, 0, 0) and s["not_kept_racy"] == 2
    (root / "m.onnx").write_bytes(mlp_onnx(seed=9))  # swapped at once, same size: still caught
    with pytest.raises(errors.IntegrityError):
        pkg.read_verified(pkg.manifest.variants[0])


def test_the_cache_is_bounded_least_recently_used_first(aged: dict[str, Path]) -> None:
    files = aged["files"]
    names = sorted(p.name for p in files.iterdir())
    assert len(names) == N_FILES > DIGEST_CACHE_ENTRIES
    refs = [_ref(files, n) for n in names]
    clear_digest_cache()
    for r in refs:
        verify_file(files, r, "loose file")
    s = digest_cache_stats()
    assert (s["hashes"], s["entries"]) == (N_FILES, DIGEST_CACHE_ENTRIES)
    verify_file(files, refs[-1], "loose file")  # among the newest: remembered
    assert digest_cache_stats()["hashes"] == N_FILES
    verify_file(files, refs[0], "loose file")  # the oldest was dropped: hashed again
    assert digest_cache_stats()["hashes"] == N_FILES + 1
    assert digest_cache_stats()["entries"] == DIGEST_CACHE_ENTRIES


def test_the_cache_is_safe_to_share_between_threads(aged: dict[str, Path]) -> None:
    files = aged["files"]
    refs = [_ref(files, n) for n in sorted(p.name for p in files.iterdir())][:100]
    bad = FileRef(refs[0].file, "0" * 64, refs[0].size)
    clear_digest_cache()
    failures: list[BaseException] = []
    refused: list[int] = []
    start = threading.Barrier(8)

    def worker(k: int) -> None:
        try:
            start.wait()
            for rnd in range(5):
                for r in refs[k % 7 :] + refs[: k % 7]:
                    verify_file(files, r, "loose file")
                try:  # a wrong manifest digest is refused even when the file's digest is remembered
                    verify_file(files, bad, "loose file")
                except errors.IntegrityError:
                    refused.append(rnd)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    assert len(refused) == 8 * 5
    s = digest_cache_stats()
    calls = 8 * 5 * (len(refs) + 1)
    assert s["hashes"] + s["hits"] == calls  # every check either hashed or hit, none lost
    assert len(refs) <= s["hashes"] <= 8 * len(refs)  # each file hashed at least once, at most once per thread
    assert s["entries"] == len(refs)
    assert DIGESTS.lookup(os.stat(files / refs[5].file)) == refs[5].sha256
