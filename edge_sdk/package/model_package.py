"""The opened, verified model package: :class:`ModelPackage`.

Opening a package (:meth:`ModelPackage.open`) parses and validates the
manifest, checks that every path stays inside the package, refuses pickles,
and verifies the sha256 and size of every file a runtime could read — before
any runtime is involved.  :meth:`ModelPackage.read_verified` reads a variant's
bytes once and checks them again, so the bytes handed to a runtime are the
bytes that were verified (no time-of-check/time-of-use gap). Each check takes
the digest of a file left unchanged since it was last hashed in this process
from :data:`~edge_sdk.package.archive.DIGESTS` (keyed by the ``fstat`` of the
open file: device, inode, size, mtime and ctime), so a load hashes each file
at most once and loading an unchanged package again hashes nothing.

Example::

    pkg = ModelPackage.open("shapes-classifier/")
    for v in pkg.manifest.variants:
        print(v.id, v.backend, v.precision, v.size)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from .. import _toml
from .._record import frozen
from .._version import __version__
from ..errors import IntegrityError, ManifestError, ModelFormatError, SignatureMismatchError, UnsafePackageError
from .archive import (
    DIGESTS,
    contained,
    default_cache_dir,
    open_regular,
    package_folder,
    read_digest,
    read_regular,
    refuse_unsafe_files,
    verify_file,
)
from .manifest import MANIFEST_NAME, FileRef, Manifest, Variant, check_relpath
from .modelfile import Buffer, ExternalRef, OnnxInfo, TensorSig, TFLiteInfo, inspect_tflite, precision_mismatch, scan_onnx, sniff_format

#: Largest ``edge-model.toml`` read (bytes): the TOML parser's own limit is 1 Mi characters, at most
#: 4 bytes each. The file is read with a bounded read, so a larger one costs ``limit + 1`` bytes.
MAX_MANIFEST_BYTES = 4 * 1024**2


@frozen
class VerifiedModel:
    """A variant's bytes, verified against the manifest, ready for a runtime.

    ``path`` is the file on disk (for runtimes that must resolve external data
    next to it); ``data`` are the verified bytes themselves.
    """

    variant: Variant
    data: bytes
    path: Path
    sha256: str


def _without_frames(e: BaseException) -> BaseException:
    """``e`` (and its causes) with their tracebacks dropped: the frames of a failed scan hold views of
    a memory map, which cannot be closed while they live. The messages say what was wrong."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        x.__traceback__ = None
        x = x.__cause__ or x.__context__
    return e


#: What scan_onnx / inspect_tflite found in a model, by (format, sha256): both callers check the bytes' digest
#: against the manifest first, so an entry describes exactly those bytes. A second load of the same model (in
#: a warm process) skips the parse (7 ms per scan for MobileNetV2 on Zen 3; a load scanned twice).
_SCANS: dict[tuple[str, str], Any] = {}
_SCANS_MAX = 64


#: The same across processes, and the parsed manifests by the sha256 of their bytes: ``<cache>/`` this file
#: (:class:`edge_sdk._toml.JsonStore`, tagged with the SDK version, so another version scans again). A fresh
#: process would otherwise parse every model it loads (14 ms for the BlazeFace .tflite) and import the TOML
#: parser for its manifest. Only what a scan found is kept (a scan that raised is run again, and raises again);
#: the digest of the bytes is checked against the manifest on every load before an entry is looked up, and an
#: entry that does not describe a well-formed result is ignored and rewritten.
SCAN_CACHE_NAME = "package-scans.json"
_SCAN_CACHE_TAG = f"package-scans 1, edge_sdk {__version__}"


def _store(cache_dir: Path | None) -> _toml.JsonStore:
    return _toml.JsonStore.shared((cache_dir if cache_dir is not None else default_cache_dir()) / SCAN_CACHE_NAME, _SCAN_CACHE_TAG)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _opt(x: Any, check: Callable[[Any], bool]) -> bool:
    return x is None or check(x)


def _weights_from(j: Any) -> tuple[tuple[int, int, int], ...]:
    if not isinstance(j, list) or not all(isinstance(w, list) and len(w) == 3 and all(_is_int(n) for n in w) for w in j):
        raise ValueError("weights")
    return tuple((w[0], w[1], w[2]) for w in j)


def _sig_from(j: Any) -> TensorSig:
    if not (isinstance(j, list) and len(j) == 4):
        raise ValueError("tensor")
    name, elem, dtype, dims = j
    ok_dims = dims is None or (isinstance(dims, list) and all(d is None or isinstance(d, str) or _is_int(d) for d in dims))
    if not (isinstance(name, str) and _is_int(elem) and _opt(dtype, lambda x: isinstance(x, str)) and ok_dims):
        raise ValueError("tensor")
    return TensorSig(name, elem, dtype, None if dims is None else tuple(dims))


def _ext_from(j: Any) -> ExternalRef:
    if not (isinstance(j, list) and len(j) == 4):
        raise ValueError("external")
    name, loc, off, length = j
    if not (isinstance(name, str) and isinstance(loc, str) and _opt(off, _is_int) and _opt(length, _is_int)):
        raise ValueError("external")
    return ExternalRef(name, loc, off, length)


def _scan_to_json(kind: str, got: Any) -> Any:
    if kind == "sniff":
        return got if isinstance(got, str) else None
    if kind == "tflite" and isinstance(got, TFLiteInfo):
        return {"version": got.version, "size": got.size, "weights": [list(w) for w in got.weights]}
    if kind == "onnx" and isinstance(got, OnnxInfo):
        return {
            "ir_version": got.ir_version,
            "opsets": dict(got.opsets),
            "producer_name": got.producer_name,
            "graph_name": got.graph_name,
            "inputs": [[t.name, t.elem_type, t.dtype, None if t.dims is None else list(t.dims)] for t in got.inputs],
            "outputs": [[t.name, t.elem_type, t.dtype, None if t.dims is None else list(t.dims)] for t in got.outputs],
            "external_data": [[e.tensor_name, e.location, e.offset, e.length] for e in got.external_data],
            "op_types": sorted(got.op_types),
            "node_count": got.node_count,
            "weights": [list(w) for w in got.weights],
        }
    return None


def _scan_from_json(kind: str, j: Any) -> Any:
    """The scan result ``j`` describes, or None when it is not a well-formed one of ``kind``."""
    try:
        if kind == "sniff":
            return j if isinstance(j, str) else None
        if not isinstance(j, dict):
            return None
        if kind == "tflite":
            if set(j) != {"version", "size", "weights"} or not (_is_int(j["version"]) and _is_int(j["size"])):
                return None
            return TFLiteInfo(version=j["version"], size=j["size"], weights=_weights_from(j["weights"]))
        if kind == "onnx":
            keys = {"ir_version", "opsets", "producer_name", "graph_name", "inputs", "outputs", "external_data", "op_types", "node_count", "weights"}
            opsets, ops = j.get("opsets"), j.get("op_types")
            if (
                set(j) != keys
                or not (_is_int(j["ir_version"]) and _is_int(j["node_count"]))
                or not (isinstance(j["producer_name"], str) and isinstance(j["graph_name"], str))
                or not (isinstance(opsets, dict) and all(_is_int(v) for v in opsets.values()))
                or not (isinstance(ops, list) and all(isinstance(o, str) for o in ops))
                or not all(isinstance(j[k], list) for k in ("inputs", "outputs", "external_data"))
            ):
                return None
            return OnnxInfo(
                ir_version=j["ir_version"],
                opsets=dict(opsets),
                producer_name=j["producer_name"],
                graph_name=j["graph_name"],
                inputs=tuple(_sig_from(t) for t in j["inputs"]),
                outputs=tuple(_sig_from(t) for t in j["outputs"]),
                external_data=tuple(_ext_from(e) for e in j["external_data"]),
                op_types=frozenset(ops),
                node_count=j["node_count"],
                weights=_weights_from(j["weights"]),
            )
    except ValueError:
        return None
    return None


def _scanned(kind: str, sha256: str, data: Buffer, scan: Callable[[Buffer], Any], store: _toml.JsonStore | None = None) -> Any:
    key = (kind, sha256)
    got = _SCANS.get(key)
    if got is None:
        skey = f"{kind}:{sha256}"
        if store is not None:
            got = _scan_from_json(kind, store.get(skey))
        if got is None:
            got = scan(data)
            if store is not None:
                j = _scan_to_json(kind, got)
                if j is not None:
                    store.put(skey, j)
                    store.flush()
        if len(_SCANS) >= _SCANS_MAX:
            _SCANS.clear()
        _SCANS[key] = got
    return got


def _parse_manifest(mpath: Path, raw: bytes, digest: str, store: _toml.JsonStore) -> Manifest:
    """The manifest whose bytes are ``raw``: from its document in ``store`` (by their sha256) when that
    validates, else parsed and remembered (the errors of a first open)."""
    key = f"manifest:{digest}"
    doc = store.get(key)
    if isinstance(doc, dict):
        try:
            return Manifest.from_dict(doc, source=str(mpath.name))
        except ManifestError:
            pass  # a cached document is not trusted to be wrong: the bytes decide
    try:
        doc = _toml.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, _toml.TOMLDecodeError) as e:
        raise ManifestError(f"{mpath}: not valid UTF-8 TOML: {e}") from e
    store.put(key, doc)
    store.flush()
    return Manifest.from_dict(doc, source=str(mpath.name))


class ModelPackage:
    """An opened, verified model package. Use :meth:`open`."""

    def __init__(self, root: Path, source: Path, manifest: Manifest, manifest_sha256: str) -> None:
        self.root = root
        self.source = source
        self.manifest = manifest
        self.manifest_sha256 = manifest_sha256
        self._scan_store: _toml.JsonStore | None = None  # set by open(): where scans are remembered across processes
        # (variant id, sha256) whose format checks passed: the checks are a pure
        # function of the bytes, so equal digests need not be scanned twice.
        self._format_checked: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return (
            f"ModelPackage({self.manifest.name!r} {self.manifest.version}, {len(self.manifest.variants)} variants, root={str(self.root)!r})"
        )

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None, verify: bool = True) -> "ModelPackage":
        """Open a package folder or archive and verify it.

        Raises ManifestError, UnsafePackageError, IntegrityError or
        ModelFormatError; no runtime is touched.
        """
        source = Path(path)
        root = package_folder(source, cache_dir)
        mpath = root / MANIFEST_NAME
        if not os.path.lexists(mpath):
            raise ManifestError(f"{root}: no {MANIFEST_NAME}; a model package is a folder with a manifest")
        contained(root, MANIFEST_NAME, "manifest")  # a symlink out of the package is refused, not read
        try:
            raw = read_regular(mpath, MANIFEST_NAME, MAX_MANIFEST_BYTES)
        except IntegrityError as e:
            raise ManifestError(f"{mpath}: {e}") from e
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{mpath}: manifest is over the limit of {MAX_MANIFEST_BYTES} bytes (refused after reading {len(raw)})")
        store = _store(Path(cache_dir) if cache_dir is not None else None)
        digest = hashlib.sha256(raw).hexdigest()
        manifest = _parse_manifest(mpath, raw, digest, store)
        pkg = cls(root, source, manifest, digest)
        pkg._scan_store = store
        pkg._check_paths()
        if verify:
            pkg.verify()
        return pkg

    # -- checks --------------------------------------------------------------

    def _files(self) -> list[tuple[str, FileRef | Variant]]:
        out: list[tuple[str, FileRef | Variant]] = []
        for v in self.manifest.variants:
            out.append((f"variant {v.id}", v))
            for e in v.external_data:
                out.append((f"variant {v.id} external data", e))
        out += self._generation_refs()
        return out

    def _generation_refs(self) -> list[tuple[str, FileRef]]:
        g = self.manifest.generation
        if g is None:
            return []
        return [("tokenizer", g.tokenizer)] + ([("chat template", g.chat_template)] if g.chat_template is not None else [])

    def _golden_refs(self) -> list[tuple[str, FileRef]]:
        g = self.manifest.golden
        if g is None:
            return []
        out = []
        for what, rel, digest in (("golden inputs", g.inputs, g.inputs_sha256), ("golden outputs", g.outputs, g.outputs_sha256)):
            path = contained(self.root, rel, what)
            out.append((what, FileRef(rel, digest, path.stat().st_size if path.is_file() else -1)))
        return out

    def _check_paths(self) -> None:
        for what, ref in self._files():
            contained(self.root, ref.file, what)
        refuse_unsafe_files(self.root)  # any pickle anywhere in the package, referenced or not

    def verify(self) -> None:
        """Check size and sha256 of every file of every variant, then sniff each
        model's format (ONNX structure, external data, TFLite header)."""
        for v in self.manifest.variants:
            self._verify_mapped(v)  # hashes and scans the same bytes (mapped, not copied); checks external data too
        for what, ref in self._golden_refs():
            verify_file(self.root, ref, what)
        rs = self.manifest.reference_stats
        if rs is not None:
            verify_file(self.root, FileRef(rs.file, rs.sha256, rs.size), "reference stats")
        for what, ref in self._generation_refs():
            verify_file(self.root, ref, what)

    def read_checked(self, ref: FileRef, what: str) -> bytes:
        """The bytes of package file ``ref`` read once and checked against its size and sha256 as read
        (IntegrityError naming ``what`` if it is missing or they differ): what the caller uses is
        what was verified."""
        path = contained(self.root, ref.file, what)
        if not os.path.lexists(path):
            raise IntegrityError(f"{what}: file {ref.file!r} is missing from the package")
        fd = open_regular(path, what)
        try:
            with os.fdopen(fd, "rb") as f:
                data, got = read_digest(f, ref.size)  # at most size + 1 bytes: a larger file is refused, not read whole
        except OSError as e:
            raise IntegrityError(f"{what}: cannot read {ref.file}: {e}") from e
        if len(data) != ref.size or got != ref.sha256:
            raise IntegrityError(f"{what}: {ref.file} is {len(data)} bytes with sha256 {got}, manifest says {ref.size} bytes, {ref.sha256}")
        return data

    def read_text_verified(self, ref: FileRef, what: str) -> str:
        """A package text file (tokenizer, chat template) by :meth:`read_checked`, decoded as UTF-8
        (IntegrityError if it is not)."""
        data = self.read_checked(ref, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise IntegrityError(f"{what}: {ref.file} is not UTF-8 text: {e}") from e

    def read_reference_stats(self) -> bytes | None:
        """The bytes of the ``[reference_stats]`` file by :meth:`read_checked`, or None when the
        manifest has none."""
        rs = self.manifest.reference_stats
        return None if rs is None else self.read_checked(FileRef(rs.file, rs.sha256, rs.size), "reference stats")

    def _check_model_bytes(self, v: Variant, data: Buffer) -> None:
        if (v.id, v.sha256) in self._format_checked:
            return
        self._check_model_format(v, data)
        self._format_checked.add((v.id, v.sha256))

    def _check_model_format(self, v: Variant, data: Buffer) -> None:
        store = self._scan_store
        kind = _scanned("sniff", v.sha256, data, sniff_format, store)
        if kind == "pickle":
            raise UnsafePackageError(f"variant {v.id}: {v.file} is a pickle; pickles are not allowed")
        if kind != v.format:
            raise ModelFormatError(f"variant {v.id}: backend {v.backend} expects a {v.format} file, {v.file} looks like {kind}")
        if v.format == "onnx":
            info = _scanned("onnx", v.sha256, data, scan_onnx, store)
            wrong = precision_mismatch(v.precision, info.weights, "onnx", info.op_types)
            if wrong:
                raise SignatureMismatchError(f"variant {v.id}: {v.file} is {wrong}; relabel the variant (selection ranks by this label)")
            declared = {e.file for e in v.external_data}
            model_dir = PurePosixPath(v.file).parent
            for ref in info.external_data:
                loc = ref.location
                p = check_relpath(loc, f"variant {v.id}: external data of tensor {ref.tensor_name!r}")
                rel = (model_dir / p).as_posix()
                contained(self.root, rel, f"variant {v.id}: external data {loc!r}")
                norm = os.path.normpath(rel)
                if norm not in {os.path.normpath(x) for x in declared}:
                    raise UnsafePackageError(
                        f"variant {v.id}: tensor {ref.tensor_name!r} reads external data {loc!r} which no digest in the manifest covers "
                        f"(declared: {sorted(declared) or 'none'})"
                    )
        else:
            tfl = _scanned("tflite", v.sha256, data, inspect_tflite, store)
            wrong = precision_mismatch(v.precision, tfl.weights, "tflite")
            if wrong:
                raise SignatureMismatchError(f"variant {v.id}: {v.file} is {wrong}; relabel the variant (selection ranks by this label)")

    def read_verified(self, v: Variant) -> VerifiedModel:
        """Read the variant's bytes once, check size, digest and format again, and
        return them: what a runtime gets is exactly what was verified."""
        path = contained(self.root, v.file, f"variant {v.id}")
        if not os.path.lexists(path):
            raise IntegrityError(f"variant {v.id}: file {v.file!r} is missing from the package")
        fd = open_regular(path, f"variant {v.id}")
        try:
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != v.size:  # checked before reading: never more than the declared size is read
                    raise IntegrityError(f"variant {v.id}: {v.file} is {size} bytes, manifest says {v.size}")
                data, got = read_digest(f, v.size)
        except OSError as e:
            raise IntegrityError(f"variant {v.id}: cannot read {v.file}: {e}") from e
        if len(data) != v.size:
            raise IntegrityError(f"variant {v.id}: {v.file} is {len(data)} bytes, manifest says {v.size}")
        if got != v.sha256:
            raise IntegrityError(f"variant {v.id}: {v.file} sha256 is {got}, manifest says {v.sha256}")
        for ext in v.external_data:
            verify_file(self.root, ext, f"variant {v.id} external data")
        self._check_model_bytes(v, data)
        return VerifiedModel(variant=v, data=data, path=path, sha256=got)

    def _verify_mapped(self, v: Variant) -> None:
        """:meth:`read_verified`'s checks through a read-only memory map: the file is never copied into memory."""
        if v.external_data:  # the graph file is small (the weights are the external files, hashed by streaming)
            self.read_verified(v)
            return
        fd, _ = self.open_verified(v)
        os.close(fd)

    def open_verified(self, v: Variant) -> tuple[int, str]:
        """The variant's file opened read-only, checked like :meth:`read_verified` (size, digest and format,
        through a read-only memory map of the open file, so no copy of the bytes stays in memory), as
        ``(fd, path)``: ``path`` names that open file (``/proc/self/fd/N`` on Linux), so a runtime that
        loads by path reads the inode that was hashed even if the name is replaced afterwards. The caller
        closes ``fd`` once the runtime has read it. For large models (a decoder's weights): a runtime
        given bytes may keep its own copy of them for the session's life (ONNX Runtime does: +105 MiB
        RSS for SmolLM2-135M int4). A variant with external data is refused (use :meth:`read_verified`)."""
        import mmap

        if v.external_data:
            raise ModelFormatError(f"variant {v.id}: open_verified takes single-file models; this one has external data")
        path = contained(self.root, v.file, f"variant {v.id}")
        fd = open_regular(path, f"variant {v.id}")  # type-checked, non-blocking: a FIFO is refused, never waited on
        try:
            before = os.fstat(fd)
            size = before.st_size
            if size != v.size:
                raise IntegrityError(f"variant {v.id}: {v.file} is {size} bytes, manifest says {v.size}")
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                got, _ = DIGESTS.digest(fd, before, size, lambda: (hashlib.sha256(mm).hexdigest(), size))  # hashed once while unchanged
                if got != v.sha256:
                    raise IntegrityError(f"variant {v.id}: {v.file} sha256 is {got}, manifest says {v.sha256}")
                failure: BaseException | None = None
                with memoryview(mm) as mv:
                    try:
                        self._check_model_bytes(v, mv)
                    except Exception as e:  # noqa: BLE001 - re-raised below, once the map can be closed
                        failure = _without_frames(e)
                if failure is not None:
                    raise failure
        except BaseException:
            os.close(fd)
            raise
        proc = f"/proc/self/fd/{fd}"
        return fd, proc if os.path.exists(proc) else str(path)

    def path_of(self, rel: str) -> Path:
        """The real path of ``rel`` inside the package; :class:`~edge_sdk.errors.UnsafePackageError` if it resolves outside (``..``,
        absolute, a symlink out)."""
        return contained(self.root, rel, "file")
