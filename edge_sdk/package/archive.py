"""Package folders and archives: opening, containment, safe extraction, digests.

A package is a folder holding ``edge-model.toml`` and the files it names, or a
``.zip`` / ``.tar`` / ``.tar.gz`` of such a folder (read-only: it is extracted,
member by member and after checks, into the package cache, once per archive
digest). Every path must resolve inside the package (no ``..``, absolute paths
or symlinks out), no pickle may be anywhere in it, and a file is only used
after its size and sha256 match the manifest.
"""

from __future__ import annotations

import hashlib
import os
import stat
from contextlib import ExitStack
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, Callable

from ..errors import IntegrityError, ManifestError, ModelFormatError, UnsafePackageError
from .manifest import MANIFEST_NAME, FileRef, Variant, check_relpath

# Extensions that only ever hold pickled Python objects (arbitrary code on load).
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".joblib", ".ckpt")
# What an archive may expand to (bytes, members); more is refused as a zip bomb. Setting them on
# edge_sdk.package sets them here too (see edge_sdk/package/__init__.py).
MAX_ARCHIVE_BYTES = 8 * 1024**3
MAX_ARCHIVE_MEMBERS = 10_000


def default_cache_dir() -> Path:
    """``$EDGE_SDK_CACHE`` or ``$XDG_CACHE_HOME/edge_sdk`` or ``~/.cache/edge_sdk``."""
    env = os.environ.get("EDGE_SDK_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edge_sdk"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of the file at ``path``, read in ``chunk``-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def contained(root: Path, rel: str, what: str) -> Path:
    """The real path of ``rel`` under ``root`` (symlinks followed); :class:`~edge_sdk.errors.UnsafePackageError` (naming ``what``)
    if it is not a safe relative path or resolves outside ``root``."""
    p = check_relpath(rel, what)
    target = root.joinpath(*p.parts)
    real = Path(os.path.realpath(target))
    root_real = Path(os.path.realpath(root))
    if real != root_real and root_real not in real.parents:
        raise UnsafePackageError(f"{what}: {rel!r} resolves to {real}, outside the package {root_real} (symlink out?)")
    return real


def _looks_pickled(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def archive_kind(path: Path) -> str | None:
    """``"zip"`` or ``"tar"`` (plain, .gz, .xz, .bz2) by ``path``'s file name, or None for anything else."""
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")):
        return "tar"
    return None


def _safe_member_name(name: str, archive: Path) -> PurePosixPath:
    if "\\" in name or "\x00" in name:
        raise UnsafePackageError(f"{archive.name}: member {name!r} has a backslash or NUL in its name")
    p = PurePosixPath(name)
    if p.is_absolute() or name.startswith("/") or any(part == ".." for part in p.parts):
        raise UnsafePackageError(f"{archive.name}: member {name!r} would extract outside the package (zip-slip)")
    return p


def _archive_members(archive: Path, stack: ExitStack) -> list[tuple[str, str, int, Callable[[], IO[bytes]]]]:
    """(name, kind 'file'|'dir'|'link'|'other', size, opener) for every member."""
    import tarfile
    import zipfile

    out: list[tuple[str, str, int, Callable[[], IO[bytes]]]] = []
    if archive_kind(archive) == "zip":
        zf = stack.enter_context(zipfile.ZipFile(archive))
        for info in zf.infolist():
            mode = (info.external_attr >> 16) & 0xFFFF
            kind = "link" if stat.S_ISLNK(mode) else ("dir" if info.is_dir() else "file")
            out.append((info.filename, kind, info.file_size, partial(zf.open, info)))
    else:
        tf = stack.enter_context(tarfile.open(archive))

        def tar_member(m: tarfile.TarInfo) -> IO[bytes]:
            f = tf.extractfile(m)
            assert f is not None  # only "file" members are opened, and extractfile returns None only for the others
            return f

        for m in tf.getmembers():
            kind = "link" if (m.issym() or m.islnk()) else "dir" if m.isdir() else "file" if m.isfile() else "other"
            out.append((m.name, kind, m.size, partial(tar_member, m)))
    return out


def extract_archive(archive: Path, dest: Path) -> None:
    """Extract ``archive`` into ``dest`` member by member, after checking every name, type and size.

    Raises UnsafePackageError for absolute or '..' names, links, device files,
    too many members or too many bytes; ModelFormatError for a corrupt archive.
    """
    import shutil
    import tarfile
    import zipfile
    import zlib

    kind = archive_kind(archive)
    if kind is None:
        raise ModelFormatError(f"{archive.name}: not a package folder, .zip or .tar archive")
    total = 0
    try:
        with ExitStack() as stack:
            members = _archive_members(archive, stack)
            if len(members) > MAX_ARCHIVE_MEMBERS:
                raise UnsafePackageError(f"{archive.name}: {len(members)} members, limit {MAX_ARCHIVE_MEMBERS}")
            for name, mkind, size, opener in members:
                rel = _safe_member_name(name, archive)
                if mkind == "link":
                    raise UnsafePackageError(f"{archive.name}: member {name!r} is a symlink or hard link; links are not allowed in archives")
                if mkind == "other":
                    raise UnsafePackageError(f"{archive.name}: member {name!r} is not a regular file or folder")
                total += size
                if total > MAX_ARCHIVE_BYTES:
                    raise UnsafePackageError(f"{archive.name}: expands past {MAX_ARCHIVE_BYTES} bytes")
                target = dest.joinpath(*rel.parts)
                if mkind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with opener() as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise ModelFormatError(f"{archive.name}: corrupt {kind} archive: {e}") from e


def package_root_in(folder: Path) -> Path:
    """The folder holding the manifest: ``folder`` itself or its single subfolder (ManifestError if neither)."""
    if (folder / MANIFEST_NAME).is_file():
        return folder
    subs = [p for p in folder.iterdir() if p.is_dir()]
    if len(subs) == 1 and (subs[0] / MANIFEST_NAME).is_file():
        return subs[0]
    raise ManifestError(f"no {MANIFEST_NAME} at the top of the archive or in its single top folder")


def package_folder(source: Path, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the package at ``source``: ``source`` itself, or the manifest folder of the
    archive extracted (by :func:`extract_archive`, once per archive sha256) under ``cache_dir/packages``
    (default :func:`default_cache_dir`). ManifestError if ``source`` does not exist, ModelFormatError
    if it is neither a folder nor an archive."""
    if not source.exists():
        raise ManifestError(f"model package {str(source)!r} does not exist")
    if source.is_dir():
        return source
    if archive_kind(source) is None:
        raise ModelFormatError(f"{source.name}: expected a package folder or a .zip/.tar archive of one")
    digest = sha256_file(source)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    dest = cache / "packages" / digest
    done = dest / ".complete"
    if not done.exists():
        import shutil
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=_mkdirs(cache / "packages")))
        try:
            extract_archive(source, tmp)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        done.write_text(source.name)
    return package_root_in(dest)


def refuse_unsafe_files(root: Path) -> None:
    """:class:`~edge_sdk.errors.UnsafePackageError` for any pickle (by suffix or by content) or any symlink
    leading outside ``root``, anywhere under ``root``, whether the manifest names it or not."""
    root_real = Path(os.path.realpath(root))
    for dirpath, dirs, filenames in os.walk(root):
        for dn in dirs:  # os.walk does not follow a symlinked directory: look where it leads
            dp = Path(dirpath) / dn
            if dp.is_symlink():
                real = Path(os.path.realpath(dp))
                if real != root_real and root_real not in real.parents:
                    raise UnsafePackageError(f"{dp.relative_to(root).as_posix()}: symlinked folder points outside the package, to {real}")
        for fn in filenames:
            p = Path(dirpath) / fn
            rel = p.relative_to(root).as_posix()
            if fn.lower().endswith(PICKLE_SUFFIXES):
                raise UnsafePackageError(f"{rel}: pickle files are not allowed in a model package (they run code when loaded)")
            if p.is_symlink():
                real = Path(os.path.realpath(p))
                if real != root_real and root_real not in real.parents:
                    raise UnsafePackageError(f"{rel}: symlink points outside the package, to {real}")
            try:
                with open(p, "rb") as f:
                    head = f.read(2)
            except OSError:
                continue
            if _looks_pickled(head):
                raise UnsafePackageError(f"{rel}: file content is a Python pickle; pickles are not allowed in a model package")


def verify_file(root: Path, ref: FileRef | Variant, what: str) -> Path:
    """The real path of ``ref.file`` under ``root`` (see :func:`contained`), once the file is there with
    ``ref.size`` bytes and sha256 ``ref.sha256``; :class:`~edge_sdk.errors.IntegrityError` (naming ``what``) if not."""
    path = contained(root, ref.file, what)
    if not path.is_file():
        raise IntegrityError(f"{what}: file {ref.file!r} is missing from the package")
    size = path.stat().st_size
    if size != ref.size:
        raise IntegrityError(f"{what}: {ref.file} is {size} bytes, manifest says {ref.size}")
    got = sha256_file(path)
    if got != ref.sha256:
        raise IntegrityError(f"{what}: {ref.file} sha256 is {got}, manifest says {ref.sha256}")
    return path


def file_ref(root: Path, rel: str) -> FileRef:
    """Digest and size of ``root/rel`` (for writing manifests)."""
    p = contained(root, rel, "file")
    return FileRef(rel, sha256_file(p), p.stat().st_size)


def _mkdirs(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
