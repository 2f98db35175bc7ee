"""Bringing an untrusted package (folder or archive) into the store's staging folder.

Everything is checked *before* a byte is copied, from the listing of the source
(``lstat`` of every folder entry, or the member headers of an archive):

* only regular files and folders: a symlink (in or out of the package), hard
  link, FIFO, device or socket is refused, and so is an archive link member;
* names: relative, no ``..``, no NUL/backslash, each part at most 255 bytes;
* the manifest is read once (at most :data:`MAX_MANIFEST_BYTES`) and parsed;
  what is installed is exactly the files it names plus ``edge-model.toml`` and
  ``edge-model.sig`` (a signature covers the manifest, and the manifest covers the
  files it names by digest - nothing else): any other regular file is not copied
  and is reported (``refuse_unreferenced=True``: refused);
* every file's size must be the one the manifest declares, and the package must
  fit ``max_bytes``.

Then each file is copied through one descriptor opened without following links
(``O_NOFOLLOW`` on every path part, relative to the folder's own descriptor) and
checked with ``fstat`` (a regular file, the same ``st_dev``/``st_ino`` as listed),
reading no more than its declared size and hashing as it goes; the manifest
written to staging is the very bytes that were parsed. The staged copy is then
verified again by :meth:`edge_sdk.package.ModelPackage.open`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import zipfile
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Callable

from .. import _toml
from ..errors import EdgeSDKError, IntegrityError, ManifestError, ModelFormatError, UnsafePackageError
from ..package import MANIFEST_NAME, Manifest, archive_kind
from ._fs import crash_point
from .signing import SIGNATURE_NAME

MAX_MANIFEST_BYTES = 4 << 20
MAX_SIGNATURE_BYTES = 1024
MAX_ENTRIES = 10_000
MAX_DEPTH = 32
MAX_PART_BYTES = 255
MAX_PATH_BYTES = 1024
CHUNK = 1 << 20
INSTALL_INFO = ".store-install.json"
_CORRUPT = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, OSError, RuntimeError, ValueError)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass
class _Entry:
    rel: str
    kind: str  # "file" | "dir"
    size: int
    open: Callable[[], IO[bytes]]


def _kind_name(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISREG, "a regular file")):  # fmt: skip
        if test(mode):
            return name
    return f"an unknown file type (mode {oct(mode)})"


def check_member_name(name: str, where: str) -> str:
    """``name`` as a normalised relative POSIX path ("" for the root itself); UnsafePackageError naming the rule it breaks."""
    if "\x00" in name or "\\" in name:
        raise UnsafePackageError(f"{where}: entry {name!r} has a NUL or backslash in its name; expected a relative POSIX path")
    p = PurePosixPath(name)
    if p.is_absolute() or name.startswith("/") or ".." in p.parts:
        raise UnsafePackageError(
            f"{where}: entry {name!r} would land outside the package (absolute or '..'); expected a relative path inside it"
        )
    rel = p.as_posix()
    rel = "" if rel == "." else rel
    for part in p.parts:
        n = len(part.encode("utf-8", "surrogateescape"))
        if n > MAX_PART_BYTES:
            raise UnsafePackageError(
                f"{where}: entry {name[:60]!r}...: a name part is {n} bytes; expected at most {MAX_PART_BYTES} bytes per part"
            )
    n = len(rel.encode("utf-8", "surrogateescape"))
    if n > MAX_PATH_BYTES:
        raise UnsafePackageError(f"{where}: entry {name[:60]!r}... is a {n}-byte path; expected at most {MAX_PATH_BYTES} bytes")
    return rel


# -- listing a source ----------------------------------------------------------------------------


def _folder_entries(root: Path, stack: ExitStack) -> list[_Entry]:
    root_fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)  # the operator's own path: followed
    stack.callback(os.close, root_fd)
    out: list[_Entry] = []

    def opener(dir_fd: int, fn: str, rel: str, st: os.stat_result) -> Callable[[], IO[bytes]]:
        def open_() -> IO[bytes]:
            try:
                fd = os.open(fn, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
            except OSError as e:
                raise UnsafePackageError(f"{rel}: cannot be opened without following links ({e.strerror}); expected a regular file") from e
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or fst.st_nlink != 1:
                os.close(fd)
                raise UnsafePackageError(
                    f"{rel}: replaced while being installed (now {_kind_name(fst.st_mode)}); expected the regular file listed"
                )
            return os.fdopen(fd, "rb")

        return open_

    def walk(dir_fd: int, prefix: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise UnsafePackageError(f"{prefix}: folders nested deeper than {MAX_DEPTH}; expected a shallower package")
        for fn in sorted(os.listdir(dir_fd)):
            rel = f"{prefix}{fn}"
            check_member_name(rel, root.name)
            if len(out) >= MAX_ENTRIES:
                raise UnsafePackageError(f"{root.name}: more than {MAX_ENTRIES} files and folders; expected at most {MAX_ENTRIES}")
            st = os.stat(fn, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(fn, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
                stack.callback(os.close, sub)
                if (os.fstat(sub).st_dev, os.fstat(sub).st_ino) != (st.st_dev, st.st_ino):
                    raise UnsafePackageError(f"{rel}: replaced while being listed; expected the folder listed")
                out.append(_Entry(rel, "dir", 0, lambda: None))  # type: ignore[arg-type,return-value]
                walk(sub, rel + "/", depth + 1)
            elif stat.S_ISREG(st.st_mode):
                if prefix == "" and fn == INSTALL_INFO:
                    continue  # the store's own record (a folder copied out of a store): rewritten on install
                if st.st_nlink != 1:
                    raise UnsafePackageError(
                        f"{rel}: has {st.st_nlink} hard links; expected a regular file that belongs to the package alone (copy it instead of linking)"
                    )
                out.append(_Entry(rel, "file", st.st_size, opener(dir_fd, fn, rel, st)))
            else:
                what = _kind_name(st.st_mode)
                if stat.S_ISLNK(st.st_mode):
                    try:
                        what += f" to {os.readlink(fn, dir_fd=dir_fd)!r}"
                    except OSError:
                        pass
                raise UnsafePackageError(
                    f"{rel}: is {what}; a package folder may hold only regular files and folders (nothing is followed)"
                )

    walk(root_fd, "", 0)
    return out


def _archive_entries(source: Path, stack: ExitStack) -> list[_Entry]:
    fd = os.open(source, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC)
    f = stack.enter_context(os.fdopen(fd, "rb"))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePackageError(f"{source.name}: is {_kind_name(st.st_mode)}; expected a regular .zip/.tar file or a package folder")
    kind = archive_kind(source)
    out: list[_Entry] = []
    try:
        if kind == "zip":
            zf = stack.enter_context(zipfile.ZipFile(f))
            infos = zf.infolist()
            if len(infos) > MAX_ENTRIES:
                raise UnsafePackageError(f"{source.name}: {len(infos)} members; expected at most {MAX_ENTRIES}")
            for info in infos:
                rel = check_member_name(info.filename, source.name)
                fmt = stat.S_IFMT((info.external_attr >> 16) & 0xFFFF) if info.create_system == 3 else 0
                if fmt not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise UnsafePackageError(
                        f"{source.name}: member {info.filename!r} is {_kind_name(fmt)}; expected only regular files and folders"
                    )
                if info.flag_bits & 0x1:
                    raise UnsafePackageError(f"{source.name}: member {info.filename!r} is encrypted; expected an unencrypted archive")
                is_dir = info.is_dir() or fmt == stat.S_IFDIR
                out.append(_Entry(rel, "dir" if is_dir else "file", info.file_size, lambda i=info: zf.open(i)))  # type: ignore[misc]
        else:
            tf = stack.enter_context(tarfile.open(fileobj=f, mode="r:*"))
            for m in tf:
                if len(out) >= MAX_ENTRIES:
                    raise UnsafePackageError(f"{source.name}: more than {MAX_ENTRIES} members; expected at most {MAX_ENTRIES}")
                rel = check_member_name(m.name, source.name)
                if not (m.isfile() or m.isdir()):
                    what = "a symlink" if m.issym() else "a hard link" if m.islnk() else "a device, FIFO or other special member"
                    raise UnsafePackageError(f"{source.name}: member {m.name!r} is {what}; expected only regular files and folders")
                out.append(_Entry(rel, "dir" if m.isdir() else "file", m.size, lambda m=m: tf.extractfile(m)))  # type: ignore[misc,arg-type]
    except EdgeSDKError:
        raise
    except _CORRUPT as e:
        raise ModelFormatError(
            f"{source.name}: not a readable {kind} archive ({type(e).__name__}: {e}); expected a valid .zip/.tar of a package"
        ) from e
    return out


# -- the plan and the copy -----------------------------------------------------------------------


def referenced_files(m: Manifest) -> dict[str, tuple[str, str, int | None]]:
    """Every file the manifest names: normalised relative path -> (what, sha256, size or None when undeclared)."""
    out: dict[str, tuple[str, str, int | None]] = {}

    def add(rel: str, what: str, sha: str, size: int | None) -> None:
        out[check_member_name(rel, what)] = (what, sha, size)

    for v in m.variants:
        add(v.file, f"variant {v.id}", v.sha256, v.size)
        for e in v.external_data:
            add(e.file, f"variant {v.id} external data", e.sha256, e.size)
    if m.golden is not None:
        add(m.golden.inputs, "golden inputs", m.golden.inputs_sha256, None)
        add(m.golden.outputs, "golden outputs", m.golden.outputs_sha256, None)
    if m.reference_stats is not None:
        add(m.reference_stats.file, "reference stats", m.reference_stats.sha256, m.reference_stats.size)
    if m.generation is not None:
        add(m.generation.tokenizer.file, "tokenizer", m.generation.tokenizer.sha256, m.generation.tokenizer.size)
        if m.generation.chat_template is not None:
            t = m.generation.chat_template
            add(t.file, "chat template", t.sha256, t.size)
    return out


def _read_capped(e: _Entry, cap: int, label: str) -> bytes:
    with e.open() as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise UnsafePackageError(f"{label}: {e.rel} is larger than {cap} bytes; expected at most {cap}")
    return data


def _copy(e: _Entry, dst: Path, budget: int, sha256: str | None, what: str) -> int:
    """Copy at most ``budget`` bytes of ``e`` to ``dst`` (refused past it), checking the digest as it goes."""
    crash_point("copy file")
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    n = 0
    with e.open() as src, open(dst, "xb") as out:
        while True:
            chunk = src.read(min(CHUNK, budget - n + 1))
            if not chunk:
                break
            n += len(chunk)
            if n > budget:
                raise IntegrityError(
                    f"{what}: {e.rel} holds more than {budget} bytes (the size listed / declared); copy stopped at the limit"
                )
            h.update(chunk)
            out.write(chunk)
    if n != e.size:
        raise IntegrityError(f"{what}: {e.rel} gave {n} bytes, {e.size} were listed (changed while being copied?)")
    if sha256 is not None and h.hexdigest() != sha256:
        raise IntegrityError(f"{what}: {e.rel} sha256 is {h.hexdigest()}, manifest says {sha256}")
    return n


def stage_package(source: Path, dst: Path, max_bytes: int, *, refuse_unreferenced: bool = False) -> tuple[Path, list[str]]:
    """Check ``source`` (a package folder or archive) and copy what the manifest names into ``dst``; returns ``dst``
    and the files left out because the manifest does not name them (refused instead with ``refuse_unreferenced``).

    Raises ManifestError, UnsafePackageError, IntegrityError or ModelFormatError, naming what was expected.
    """
    try:
        st = os.stat(source)
    except FileNotFoundError as exc:
        raise ManifestError(f"model package {str(source)!r} does not exist; expected a package folder or a .zip/.tar archive") from exc
    with ExitStack() as stack:
        if stat.S_ISDIR(st.st_mode):
            entries = _folder_entries(source, stack)
        elif archive_kind(source) is not None:
            entries = _archive_entries(source, stack)
        else:
            raise ModelFormatError(
                f"{source.name}: is {_kind_name(st.st_mode)} without a .zip/.tar name; expected a package folder or a .zip/.tar archive"
            )
        by_rel: dict[str, _Entry] = {}
        for ent in entries:
            if not ent.rel:
                continue
            if ent.rel in by_rel and not (ent.kind == by_rel[ent.rel].kind == "dir"):
                raise UnsafePackageError(f"{source.name}: {ent.rel!r} appears twice; expected each path once")
            by_rel[ent.rel] = ent
        files = {r: ent for r, ent in by_rel.items() if ent.kind == "file"}
        prefix = ""
        if MANIFEST_NAME not in files:
            tops = {r.split("/", 1)[0] for r in by_rel}
            top = next(iter(tops)) if len(tops) == 1 else ""
            if not top or f"{top}/{MANIFEST_NAME}" not in files:
                raise ManifestError(
                    f"{source.name}: no {MANIFEST_NAME}; expected it at the top of the package or in its single top folder (found {sorted(tops)[:5]})"
                )
            prefix = top + "/"
        mentry = files[prefix + MANIFEST_NAME]
        raw = _read_capped(mentry, MAX_MANIFEST_BYTES, MANIFEST_NAME)
        try:
            manifest = Manifest.from_dict(_toml.loads(raw.decode("utf-8")), source=MANIFEST_NAME)
        except (UnicodeDecodeError, _toml.TOMLDecodeError) as exc:
            raise ManifestError(f"{MANIFEST_NAME}: not valid UTF-8 TOML: {exc}") from exc
        refs = referenced_files(manifest)
        rel_files = {r[len(prefix) :]: ent for r, ent in files.items() if r.startswith(prefix)}
        extra = sorted(r for r in rel_files if r not in refs and r not in (MANIFEST_NAME, SIGNATURE_NAME))
        if extra and refuse_unreferenced:
            raise UnsafePackageError(
                f"{len(extra)} file(s) the manifest does not reference: {extra[:5]}{' ...' if len(extra) > 5 else ''}; "
                f"a package may hold only {MANIFEST_NAME}, {SIGNATURE_NAME} and the files its manifest names by digest "
                "(nothing else is covered by the signature): remove them or add them to the manifest"
            )
        total = len(raw)
        rel_files = {r: ent for r, ent in rel_files.items() if r not in extra}
        for rel, ent in rel_files.items():
            if rel in refs:
                what, _sha, size = refs[rel]
                if size is not None and ent.size != size:
                    raise IntegrityError(f"{what}: {rel} is {ent.size} bytes, manifest says {size} (nothing copied)")
            elif rel == SIGNATURE_NAME and ent.size > MAX_SIGNATURE_BYTES:
                raise UnsafePackageError(f"{SIGNATURE_NAME}: {ent.size} bytes; expected at most {MAX_SIGNATURE_BYTES} (one hex line)")
            total += ent.size
            if total > max_bytes:
                raise UnsafePackageError(
                    f"{source.name}: the package exceeds {max_bytes} bytes (StoreConfig.max_package_bytes); nothing copied"
                )
        dst.mkdir(parents=True)
        (dst / MANIFEST_NAME).write_bytes(raw)
        try:
            for rel, ent in sorted(rel_files.items()):
                if rel == MANIFEST_NAME:
                    continue
                what, sha, _size = refs.get(rel, (SIGNATURE_NAME, None, None))
                _copy(ent, dst.joinpath(*PurePosixPath(rel).parts), ent.size, sha, what)
        except EdgeSDKError:
            raise
        except _CORRUPT as exc:
            raise ModelFormatError(
                f"{source.name}: reading a file failed ({type(exc).__name__}: {exc}); expected a readable package"
            ) from exc
    return dst, extra
