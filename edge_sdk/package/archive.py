"""Package folders and archives: opening, containment, safe extraction, digests.

A package is a folder holding ``edge-model.toml`` and the files it names, or a
``.zip`` / ``.tar`` / ``.tar.gz`` of such a folder (read-only: it is extracted,
member by member and after checks, into the package cache, once per archive
digest). Every path must resolve inside the package (no ``..``, absolute paths
or symlinks out), no pickle may be anywhere in it, and a file is only used
after its size and sha256 match the manifest.

Extraction is budgeted: every member's declared size is checked against
:data:`MAX_ARCHIVE_BYTES`, the compression ratio (:data:`MAX_COMPRESSION_RATIO`,
per zip member and for the whole archive) and the free space before anything is
written, and the bytes actually written are counted against the same budget, so
a bomb stops at its header or at the first chunk past it; whatever was written
is removed on any refusal or error. Nothing is opened without a type check
(:func:`open_regular`: ``stat`` before, non-blocking open, ``fstat`` after), so a
FIFO, device or socket is refused, never waited on.

Digests are remembered for the life of the process (:data:`DIGESTS`, a
:class:`DigestCache`): a file whose identity and change stamps — ``st_dev``,
``st_ino``, ``st_size``, ``st_mtime_ns`` and ``st_ctime_ns`` of an ``fstat`` of the
open descriptor (https://man7.org/linux/man-pages/man3/stat.3type.html) — match a
file hashed earlier is not hashed again, so a load hashes each file at most once
and a second load of an unchanged package hashes nothing. Any write, truncation,
rename-over or ``utime`` changes ``st_ctime_ns`` (POSIX ``write()`` "shall mark for update
the last data modification and last file status change timestamps",
https://pubs.opengroup.org/onlinepubs/9699919799/functions/write.html; ``utimensat()``
marks the status change timestamp too), so the entry no longer matches and the file is hashed, and checked, again.
A digest is only remembered when the file's stamps are older than
:data:`RACY_WINDOW_NS` at the time hashing began ("racily clean" files, as git
calls them, https://git-scm.com/docs/racy-git: a write in the same timestamp tick
as the hash would not change the stamps); stamps are coarse (one kernel tick on
Linux; two seconds for FAT mtimes). Limits: it trusts the file system's
timestamps, so a writer that bypasses them (a raw block device, a clock set
backwards, a network file system whose server clock runs far behind) is not
seen; :func:`clear_digest_cache` forgets every entry.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import threading
import time
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, Callable, Iterator

from .._filestamp import RACY_WINDOW_NS, Stamp, settled, stamp
from .._toml import cache_root
from ..errors import IntegrityError, ManifestError, ModelFormatError, ModelPackageError, UnsafePackageError
from .manifest import MANIFEST_NAME, FileRef, Variant, check_relpath
from .modelfile import PICKLE_SCAN_BYTES, looks_pickled

# Extensions that only ever hold pickled Python objects (arbitrary code on load).
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".joblib", ".ckpt")
# What an archive may expand to (bytes, members); more is refused as a zip bomb. Setting them on
# edge_sdk.package sets them here too (see edge_sdk/package/__init__.py).
MAX_ARCHIVE_BYTES = 8 * 1024**3
MAX_ARCHIVE_MEMBERS = 10_000
#: Expanded bytes per archive byte beyond which an archive is a bomb: checked per zip member (declared
#: size over compressed size) and for the whole archive (declared and written bytes over the archive's
#: file size), each only above :data:`RATIO_FLOOR_BYTES` (small files compress well and cost nothing).
MAX_COMPRESSION_RATIO = 200
RATIO_FLOOR_BYTES = 64 * 1024**2
#: Longest member name (bytes, UTF-8) and path component an archive may hold; longer ones cannot be
#: created on common file systems (NAME_MAX is 255) and are refused by name, before any extraction.
MAX_MEMBER_NAME_BYTES = 1024
MAX_NAME_COMPONENT_BYTES = 255
MAX_MEMBER_DEPTH = 32
#: Files (and folders) a package folder may hold; :func:`refuse_unsafe_files` stops past it.
MAX_PACKAGE_FILES = 100_000
# zip compression methods zipfile can read (others: 9 deflate64, 6 implode, 93 zstd, 95 xz, 98 ppmd, 99 AES).
_ZIP_METHODS = {0: "stored", 8: "deflate", 12: "bzip2", 14: "lzma"}
_ZIP_METHOD_NAMES = {1: "shrink", 6: "implode", 9: "deflate64", 10: "PKWARE DCL implode", 18: "IBM TERSE", 19: "IBM LZ77", 93: "zstandard",
                     95: "xz", 96: "JPEG", 97: "WavPack", 98: "PPMd", 99: "AES encryption"}  # fmt: skip


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words ("regular file", "FIFO (named pipe)", "character device", ...)."""
    for test, name in (
        (stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"),
    ):  # fmt: skip
        if test(mode):
            return name
    return f"special file (mode {mode:o})"


def open_regular(path: Path, what: str) -> int:
    """A read-only file descriptor of ``path``, which must be a regular file (symlinks followed).

    The type is checked before the open (``stat``) and again on the open descriptor (``fstat``),
    and the open is non-blocking, so a FIFO, device or socket swapped in between can neither hang
    the caller nor be read: :class:`~edge_sdk.errors.UnsafePackageError` naming ``what`` and the
    kind of file. A missing or unreadable file is an :class:`~edge_sdk.errors.IntegrityError`."""
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        raise IntegrityError(f"{what}: {path.name!r} is missing") from e
    except OSError as e:
        raise IntegrityError(f"{what}: cannot stat {path.name!r}: {e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePackageError(
            f"{what}: {path.name!r} is a {file_kind(st.st_mode)}, not a regular file; only regular files are read from a package"
        )
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    )
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise IntegrityError(f"{what}: cannot open {path.name!r}: {e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePackageError(f"{what}: {path.name!r} is a {file_kind(st.st_mode)}, not a regular file (replaced while opening?)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of regular file ``path`` (see :func:`open_regular`): a caller that gets
    more than ``limit`` knows the file is too large without having read it whole."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        return _read_at_most(f, limit + 1)


def _chunks(f: IO[bytes], n: int) -> Iterator[bytes]:
    """The next at most ``n`` bytes of ``f``, 1 MiB at a time (fewer at end of file)."""
    while n > 0:
        b = f.read(min(n, 1 << 20))
        if not b:
            return
        n -= len(b)
        yield b


#: Most digests :data:`DIGESTS` keeps (least recently used dropped first).
DIGEST_CACHE_ENTRIES = 256


class DigestCache:
    """sha256 digests of files by ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``, bounded to
    ``max_entries`` (LRU) and safe to share between threads (one lock; hashing happens outside it).
    Counts the hashes its callers report (:meth:`note_hash`) and the hits, for :meth:`stats`."""

    def __init__(self, max_entries: int = DIGEST_CACHE_ENTRIES, racy_window_ns: int = RACY_WINDOW_NS) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.racy_window_ns = racy_window_ns
        self._lock = threading.Lock()
        self._d: OrderedDict[Stamp, str] = OrderedDict()
        self._hashes = self._hits = self._bytes = self._racy = 0

    def lookup(self, st: os.stat_result) -> str | None:
        """The digest remembered for the file ``st`` describes, or None."""
        k = stamp(st)
        with self._lock:
            got = self._d.get(k)
            if got is not None:
                self._d.move_to_end(k)
                self._hits += 1
            return got

    def note_hash(self, nbytes: int) -> None:
        """Count one hash of ``nbytes`` bytes of a file (for :meth:`stats`)."""
        with self._lock:
            self._hashes += 1
            self._bytes += nbytes

    def remember(self, before: os.stat_result, after: os.stat_result, digest: str, started_ns: int) -> bool:
        """Keep ``digest`` for the file, if ``before`` and ``after`` (``fstat`` around the hash) agree and
        its stamps are older than the racy window at ``started_ns`` (``time.time_ns()`` before hashing).
        Returns whether it was kept."""
        k = stamp(before)
        if k != stamp(after):
            return False
        if not settled(before, started_ns, self.racy_window_ns):
            with self._lock:
                self._racy += 1
            return False
        with self._lock:
            self._d[k] = digest
            self._d.move_to_end(k)
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)
        return True

    def digest(self, fd: int, before: os.stat_result, size: int, compute: Callable[[], tuple[str, int]]) -> tuple[str, int | None]:
        """The digest of the file open on ``fd`` (``before``: its ``fstat``), from this cache when the file is
        unchanged, else ``compute()`` -> (sha256 hex, bytes hashed), remembered when all ``size`` bytes were
        hashed. Returns (digest, bytes hashed), the count None on a hit."""
        got = self.lookup(before)
        if got is not None:
            return got, None
        started = time.time_ns()
        got, n = compute()
        self.note_hash(n)
        if n == size:
            self.remember(before, os.fstat(fd), got, started)
        return got, n

    def hash_fd(self, fd: int, f: IO[bytes], size: int) -> tuple[str, int]:
        """sha256 of the first ``size`` bytes read from ``f`` (open on ``fd``, at offset 0) and the count
        of bytes left unread (non-zero: the file was shorter), from this cache when the file is unchanged."""

        def compute() -> tuple[str, int]:
            h = hashlib.sha256()
            n = 0
            for b in _chunks(f, size):
                h.update(b)
                n += len(b)
            return h.hexdigest(), n

        before = os.fstat(fd)
        got, n = self.digest(fd, before, size, compute)
        return got, max(0, size - (before.st_size if n is None else n))

    def stats(self) -> dict[str, int]:
        """``hashes`` (file hashes computed), ``bytes_hashed``, ``hits`` (hashes saved), ``not_kept_racy``
        (digests of files too recently changed to remember), ``entries`` and ``max_entries``."""
        with self._lock:
            return {
                "hashes": self._hashes, "bytes_hashed": self._bytes, "hits": self._hits, "not_kept_racy": self._racy,
                "entries": len(self._d), "max_entries": self.max_entries,
            }  # fmt: skip

    def clear(self) -> None:
        """Forget every digest and reset the counters."""
        with self._lock:
            self._d.clear()
            self._hashes = self._hits = self._bytes = self._racy = 0

    def _after_fork(self) -> None:
        # A child forked while another thread held the lock would wait on it forever
        # (https://docs.python.org/3/library/os.html#os.register_at_fork).
        self._lock = threading.Lock()


#: The process's digest cache, used by :func:`verify_file` and :class:`~edge_sdk.package.ModelPackage`.
DIGESTS = DigestCache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=DIGESTS._after_fork)


def read_digest(f: IO[bytes], size: int) -> tuple[bytes, str]:
    """At most ``size + 1`` bytes read from ``f`` (at offset 0) and their sha256: from
    :data:`DIGESTS` when ``fstat`` before and after the read name the same
    unchanged file it hashed before, else computed from the bytes read (and remembered)."""
    before = os.fstat(f.fileno())
    started = time.time_ns()
    data = f.read(size + 1)
    after = os.fstat(f.fileno())
    if len(data) == before.st_size:
        got = DIGESTS.lookup(after) if stamp(before) == stamp(after) else None
        if got is not None:
            return data, got
    got = hashlib.sha256(data).hexdigest()
    DIGESTS.note_hash(len(data))
    if len(data) == before.st_size:
        DIGESTS.remember(before, after, got, started)
    return data, got


def digest_cache_stats() -> dict[str, int]:
    """:meth:`DigestCache.stats` of :data:`DIGESTS`."""
    return DIGESTS.stats()


def clear_digest_cache() -> None:
    """Forget every remembered digest (the next verification hashes every file again)."""
    DIGESTS.clear()


def _read_at_most(f: IO[bytes], n: int) -> bytes:
    return b"".join(_chunks(f, n))


def default_cache_dir() -> Path:
    """``$EDGE_SDK_CACHE`` or ``$XDG_CACHE_HOME/edge_sdk`` or ``~/.cache/edge_sdk``."""
    return cache_root()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of the regular file at ``path`` (:func:`open_regular`), read in ``chunk``-byte pieces."""
    fd = open_regular(path, path.name)
    with os.fdopen(fd, "rb") as f:
        return _sha256_of(f, chunk)


def _sha256_of(f: IO[bytes], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
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


def archive_kind(path: Path) -> str | None:
    """``"zip"`` or ``"tar"`` (plain, .gz, .xz, .bz2) by ``path``'s file name, or None for anything else."""
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")):
        return "tar"
    return None


def _safe_member_name(name: str, label: str) -> PurePosixPath:
    if "\\" in name or "\x00" in name:
        raise UnsafePackageError(f"{label}: member {name!r} has a backslash or NUL in its name")
    p = PurePosixPath(name)
    if p.is_absolute() or name.startswith("/") or any(part == ".." for part in p.parts):
        raise UnsafePackageError(f"{label}: member {name!r} would extract outside the package (zip-slip)")
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_MEMBER_NAME_BYTES:
        raise UnsafePackageError(f"{label}: member name {name[:60]!r}... is {size} bytes long, limit {MAX_MEMBER_NAME_BYTES}")
    for part in p.parts:
        n = len(part.encode("utf-8", "surrogateescape"))
        if n > MAX_NAME_COMPONENT_BYTES:
            raise UnsafePackageError(
                f"{label}: member {name[:60]!r}...: path component {part[:40]!r}... is {n} bytes long, "
                f"limit {MAX_NAME_COMPONENT_BYTES} (file systems refuse longer names)"
            )
    if len(p.parts) > MAX_MEMBER_DEPTH:
        raise UnsafePackageError(f"{label}: member {name[:60]!r}... is nested {len(p.parts)} folders deep, limit {MAX_MEMBER_DEPTH}")
    return p


class _Budget:
    """What one extraction may still write: the byte limit, the compression-ratio cap relative to the
    archive's own size, and the free space where it writes. ``declare`` is called with each member's
    header size before anything of it is written; ``spend`` with every chunk actually written."""

    def __init__(self, label: str, archive_size: int, dest: Path) -> None:
        import shutil

        self.label = label
        self.archive_size = archive_size
        self.ratio_cap = max(RATIO_FLOOR_BYTES, MAX_COMPRESSION_RATIO * archive_size)
        try:
            self.free: int | None = shutil.disk_usage(dest).free
        except OSError:
            self.free = None
        self.declared = 0
        self.written = 0
        self.members = 0

    def member(self, name: str) -> None:
        self.members += 1
        if self.members > MAX_ARCHIVE_MEMBERS:
            raise UnsafePackageError(f"{self.label}: more than {MAX_ARCHIVE_MEMBERS} members, limit {MAX_ARCHIVE_MEMBERS}")

    def declare(self, name: str, size: int, compressed: int | None = None) -> None:
        if size < 0:
            raise ModelFormatError(f"{self.label}: corrupt archive: member {name!r} declares {size} bytes")
        self.declared += size
        if self.declared > MAX_ARCHIVE_BYTES:
            raise UnsafePackageError(
                f"{self.label}: expands past {MAX_ARCHIVE_BYTES} bytes (member {name!r} declares {size}); refused before extraction"
            )
        if compressed is not None and size > RATIO_FLOOR_BYTES and size > MAX_COMPRESSION_RATIO * max(compressed, 1):
            raise UnsafePackageError(
                f"{self.label}: member {name!r} declares {size} bytes from {compressed} compressed, a ratio over "
                f"{MAX_COMPRESSION_RATIO}:1 (a zip bomb); refused before extraction"
            )
        if self.declared > self.ratio_cap:
            raise UnsafePackageError(
                f"{self.label}: members declare {self.declared} bytes from a {self.archive_size}-byte archive, a ratio over "
                f"{MAX_COMPRESSION_RATIO}:1 (a zip bomb); refused before extraction"
            )
        if self.free is not None and self.declared > self.free:
            raise ModelPackageError(f"{self.label}: needs {self.declared} bytes to extract, only {self.free} free where it extracts")

    def spend(self, name: str, n: int) -> None:
        self.written += n
        cap = min(MAX_ARCHIVE_BYTES, self.ratio_cap, self.declared)
        if self.written > cap:
            raise UnsafePackageError(
                f"{self.label}: member {name!r} writes past the budget of {cap} bytes (declared sizes, limit, ratio); extraction stopped"
            )


def _mkdirs_recorded(path: Path, stop: Path, created: list[Path]) -> None:
    missing = []
    p = path
    while p != stop and not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        os.mkdir(d)
        created.append(d)


def _zip_entry_count(f: BinaryIO, size: int) -> int | None:
    """Total entries the zip's end-of-central-directory record (or its zip64 form) declares, read
    without building the member list; None if no record is found (zipfile then says what is wrong)."""
    tail_len = min(size, 22 + 0xFFFF)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return None
    (count,) = struct.unpack_from("<H", tail, at + 10)
    if count == 0xFFFF and at >= 20 and tail[at - 20 : at - 16] == b"PK\x06\x07":
        (z64,) = struct.unpack_from("<Q", tail, at - 20 + 8)
        if z64 + 56 <= size:
            f.seek(z64)
            rec = f.read(56)
            if rec[:4] == b"PK\x06\x06":
                (count,) = struct.unpack_from("<Q", rec, 32)
    return int(count)


def _zip_members(f: BinaryIO, size: int, label: str, budget: _Budget) -> Iterator[tuple[str, str, int, "_Opener"]]:
    import zipfile

    count = _zip_entry_count(f, size)
    if count is not None and count > MAX_ARCHIVE_MEMBERS:
        raise UnsafePackageError(f"{label}: {count} members, limit {MAX_ARCHIVE_MEMBERS}")
    f.seek(0)
    zf = zipfile.ZipFile(f)
    infos = zf.infolist()
    if len(infos) > MAX_ARCHIVE_MEMBERS:
        raise UnsafePackageError(f"{label}: {len(infos)} members, limit {MAX_ARCHIVE_MEMBERS}")
    out = []
    for info in infos:  # every header checked (and every size declared) before the first byte is written
        name = info.filename
        mode = (info.external_attr >> 16) & 0xFFFF
        if stat.S_ISLNK(mode):
            kind = "link"
        elif info.is_dir():
            kind = "dir"
        elif stat.S_IFMT(mode) and not stat.S_ISREG(mode):
            raise UnsafePackageError(f"{label}: member {name!r} is a {file_kind(mode)}; only regular files and folders are allowed")
        else:
            kind = "file"
        if info.flag_bits & 0x1:
            raise ModelFormatError(
                f"{label}: member {name!r} is encrypted; a package must not be encrypted (no password is ever asked for)"
            )
        if info.compress_type not in _ZIP_METHODS:
            how = _ZIP_METHOD_NAMES.get(info.compress_type, "unknown")
            raise ModelFormatError(
                f"{label}: member {name!r} uses compression method {info.compress_type} ({how}), which is not supported; "
                f"use one of {sorted(_ZIP_METHODS.values())} (deflate is what zip tools write by default)"
            )
        budget.member(name)
        if kind == "file":
            budget.declare(name, info.file_size, info.compress_size)
        out.append((name, kind, info.file_size, _Opener(zf, info)))
    return iter(out)


class _Opener:
    def __init__(self, src: object, member: object) -> None:
        self.src = src
        self.member = member

    def __call__(self) -> IO[bytes]:
        import tarfile
        import zipfile

        if isinstance(self.src, zipfile.ZipFile):
            assert isinstance(self.member, zipfile.ZipInfo)
            return self.src.open(self.member)
        assert isinstance(self.src, tarfile.TarFile) and isinstance(self.member, tarfile.TarInfo)
        fobj = self.src.extractfile(self.member)
        assert fobj is not None  # only regular members are opened
        return fobj


def _tar_members(f: BinaryIO, label: str, budget: _Budget) -> Iterator[tuple[str, str, int, _Opener]]:
    """Members one by one, each checked and declared as its header is read, so a bomb's first huge
    header stops the listing before its data are decompressed."""
    import tarfile

    tf = tarfile.open(fileobj=f, mode="r:*")
    while True:
        m = tf.next()
        if m is None:
            return
        if m.issym() or m.islnk():
            kind = "link"
        elif m.isdir():
            kind = "dir"
        elif m.isfile():
            kind = "file"
        else:
            what = (
                "FIFO (named pipe)" if m.isfifo() else "character device" if m.ischr() else "block device" if m.isblk() else "special file"
            )
            raise UnsafePackageError(f"{label}: member {m.name!r} is a {what}, not a regular file or folder")
        budget.member(m.name)
        if kind == "file":
            budget.declare(m.name, m.size)
        yield m.name, kind, m.size, _Opener(tf, m)


def extract_archive(archive: Path, dest: Path) -> None:
    """Extract ``archive`` into ``dest`` member by member, after checking every name, type and size.

    Raises UnsafePackageError for absolute or '..' names, links, device files or FIFOs, duplicate
    members, over-long names, too many members, or more bytes than the budget (declared sizes,
    :data:`MAX_ARCHIVE_BYTES`, :data:`MAX_COMPRESSION_RATIO`, free space); ModelFormatError for a
    corrupt archive, an encrypted member or an unsupported compression method (naming the member).
    Whatever it wrote is removed again when it raises, for any reason.
    """
    kind = archive_kind(archive)
    if kind is None:
        raise ModelFormatError(f"{archive.name}: not a package folder, .zip or .tar archive")
    fd = open_regular(archive, archive.name)
    with os.fdopen(fd, "rb") as f:
        _extract_open(f, kind, archive.name, dest)


def _extract_open(f: BinaryIO, kind: str, label: str, dest: Path) -> None:
    import tarfile
    import zipfile
    import zlib

    created: list[Path] = []
    try:
        if not dest.exists():
            if dest.parent.exists():
                _mkdirs_recorded(dest, dest.parent, created)
            else:
                dest.mkdir(parents=True)
        budget = _Budget(label, os.fstat(f.fileno()).st_size, dest)
        seen: dict[str, str] = {}
        current = ""
        try:
            f.seek(0)
            members = _zip_members(f, budget.archive_size, label, budget) if kind == "zip" else _tar_members(f, label, budget)
            for name, mkind, size, opener in members:
                current = name
                rel = _safe_member_name(name, label)
                if mkind == "link":
                    raise UnsafePackageError(f"{label}: member {name!r} is a symlink or hard link; links are not allowed in archives")
                key = "/".join(rel.parts).casefold()
                prior = seen.get(key)
                if prior is not None and not (prior == "dir" and mkind == "dir"):
                    raise UnsafePackageError(
                        f"{label}: member {name!r} appears more than once (or differs only in case); refusing rather than letting the last copy win"
                    )
                for i in range(1, len(rel.parts)):
                    if seen.get("/".join(rel.parts[:i]).casefold()) == "file":
                        raise UnsafePackageError(f"{label}: member {name!r} sits under {'/'.join(rel.parts[:i])!r}, which is a file member")
                seen[key] = mkind
                target = dest.joinpath(*rel.parts)
                try:
                    if mkind == "dir":
                        _mkdirs_recorded(target, dest, created)
                        continue
                    _mkdirs_recorded(target.parent, dest, created)
                    out_fd = os.open(
                        target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644
                    )
                except OSError as e:
                    raise ModelPackageError(f"{label}: cannot create member {name!r} at {target}: {e}") from e
                created.append(target)
                with os.fdopen(out_fd, "wb") as out, opener() as src:
                    _copy_member(src, out, name, size, label, budget)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, NotImplementedError, RuntimeError, ValueError, OSError) as e:
            if isinstance(e, OSError) and not isinstance(e, (zipfile.BadZipFile, EOFError)) and e.errno is not None:
                raise ModelPackageError(f"{label}: extraction failed at member {current!r}: {e}") from e
            at = f" at member {current!r}" if current else ""
            raise ModelFormatError(f"{label}: corrupt {kind} archive{at}: {e}") from e
    except BaseException:
        for p in reversed(created):  # files first (created after their folders), then the folders
            try:
                p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
            except OSError:
                pass
        raise


def _copy_member(src: IO[bytes], out: IO[bytes], name: str, size: int, label: str, budget: _Budget) -> None:
    """Copy one member, never past its declared ``size`` or the budget (checked per chunk, before it is written)."""
    done = 0
    while True:
        chunk = src.read(min(1 << 20, size - done + 1))
        if not chunk:
            break
        done += len(chunk)
        if done > size:
            raise UnsafePackageError(f"{label}: member {name!r} expands past its declared {size} bytes; extraction stopped")
        budget.spend(name, len(chunk))
        out.write(chunk)
    if done != size:
        raise ModelFormatError(f"{label}: corrupt archive: member {name!r} holds {done} bytes, its header says {size}")


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
    if it is neither a folder nor an archive, UnsafePackageError if it is a FIFO, device or socket.
    An archive is hashed and extracted from one open descriptor (what is extracted is what was
    hashed); an extraction that fails, or holds no manifest, leaves nothing in the cache."""
    if not os.path.lexists(source):
        raise ManifestError(f"model package {str(source)!r} does not exist")
    if source.is_dir():
        return source
    if archive_kind(source) is None:
        try:
            mode = os.stat(source).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise UnsafePackageError(f"{source.name}: is a {file_kind(mode)}; a package is a folder or a .zip/.tar archive")
        raise ModelFormatError(f"{source.name}: expected a package folder or a .zip/.tar archive of one")
    kind = archive_kind(source) or "zip"
    fd = open_regular(source, source.name)
    with os.fdopen(fd, "rb") as f:
        digest = _sha256_of(f)
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        dest = cache / "packages" / digest
        done = dest / ".complete"
        if not done.exists():
            import shutil
            import tempfile

            tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=_mkdirs(cache / "packages")))
            try:
                _extract_open(f, kind, source.name, tmp)
                package_root_in(tmp)  # no manifest: refused before anything is kept in the cache
                if dest.exists():
                    shutil.rmtree(dest)
                os.replace(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            done.write_text(source.name)
    return package_root_in(dest)


def refuse_unsafe_files(root: Path) -> None:
    """:class:`~edge_sdk.errors.UnsafePackageError` for any pickle (by suffix, by content of any protocol
    0-5, or a zip holding one, such as a PyTorch checkpoint), any symlink leading outside ``root``, and
    anything that is not a regular file or folder (FIFO, device, socket: never opened), anywhere under
    ``root``, whether the manifest names it or not; also past :data:`MAX_PACKAGE_FILES` entries."""
    root_real = Path(os.path.realpath(root))
    count = 0
    for dirpath, dirs, filenames in os.walk(root):
        count += len(dirs) + len(filenames)
        if count > MAX_PACKAGE_FILES:
            raise UnsafePackageError(f"{root.name}: more than {MAX_PACKAGE_FILES} files and folders, limit {MAX_PACKAGE_FILES}")
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
            try:
                lst = os.lstat(p)
            except OSError:
                continue  # gone since the listing
            if stat.S_ISLNK(lst.st_mode):
                real = Path(os.path.realpath(p))
                if real != root_real and root_real not in real.parents:
                    raise UnsafePackageError(f"{rel}: symlink points outside the package, to {real}")
            try:
                st = os.stat(p)
            except OSError:
                continue  # a dangling link inside the package: nothing to read (a manifest reference to it fails its digest)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePackageError(f"{rel}: is a {file_kind(st.st_mode)}; a model package may hold only regular files and folders")
            try:
                fd = open_regular(p, rel)
            except IntegrityError:
                continue
            with os.fdopen(fd, "rb") as f:
                head = _read_at_most(f, PICKLE_SCAN_BYTES)
                if looks_pickled(head, whole=len(head) < PICKLE_SCAN_BYTES):
                    raise UnsafePackageError(f"{rel}: file content is a Python pickle; pickles are not allowed in a model package")
                if head[:4] == b"PK\x03\x04" and _zip_holds_pickle(f):
                    raise UnsafePackageError(
                        f"{rel}: is a zip holding a pickle (a PyTorch checkpoint?); pickles are not allowed in a model package"
                    )


def _zip_holds_pickle(f: BinaryIO) -> bool:
    import zipfile

    try:
        f.seek(0)
        with zipfile.ZipFile(f) as zf:
            return any(n.lower().endswith(PICKLE_SUFFIXES) for n in zf.namelist()[:MAX_ARCHIVE_MEMBERS])
    except Exception:  # noqa: BLE001 - not a readable zip: not this check's business
        return False


def verify_file(root: Path, ref: FileRef | Variant, what: str) -> Path:
    """The real path of ``ref.file`` under ``root`` (see :func:`contained`), once the file is there with
    ``ref.size`` bytes and sha256 ``ref.sha256``; :class:`~edge_sdk.errors.IntegrityError` (naming ``what``) if not,
    :class:`~edge_sdk.errors.UnsafePackageError` if it is not a regular file. Size and digest are read from
    one open descriptor, and never more than ``ref.size`` bytes are hashed; an unchanged file's digest comes
    from :data:`DIGESTS`."""
    path = contained(root, ref.file, what)
    if not os.path.lexists(path):
        raise IntegrityError(f"{what}: file {ref.file!r} is missing from the package")
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != ref.size:
            raise IntegrityError(f"{what}: {ref.file} is {size} bytes, manifest says {ref.size}")
        got, left = DIGESTS.hash_fd(f.fileno(), f, size)  # not hashed again while the file is unchanged
    if left or got != ref.sha256:
        raise IntegrityError(f"{what}: {ref.file} sha256 is {got}, manifest says {ref.sha256}")
    return path


def file_ref(root: Path, rel: str) -> FileRef:
    """Digest and size of ``root/rel`` (for writing manifests)."""
    p = contained(root, rel, "file")
    return FileRef(rel, sha256_file(p), p.stat().st_size)


def _mkdirs(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
