"""Durable file-system steps shared by the store: fsync'd writes, atomic replace,
directory fsync, and the crash hook the kill tests drive.

Crash hook: every durable step calls :func:`crash_point`. When the environment
variable ``EDGE_SDK_STORE_CRASH_AT`` is ``N``, the N-th call in this process
kills the process with SIGKILL (a power loss, as far as the store can tell).
:data:`COUNTER` counts the calls so a test can size the range of N.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

CRASH_ENV = "EDGE_SDK_STORE_CRASH_AT"
COUNTER = [0]


def crash_point(label: str = "") -> None:
    """A place where the updater may die; SIGKILLs itself at the chosen index."""
    COUNTER[0] += 1
    at = os.environ.get(CRASH_ENV)
    if at and COUNTER[0] == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: Path) -> None:
    """Make a rename / create / unlink inside ``path`` durable."""
    crash_point(f"fsync_dir {path}")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    crash_point(f"fsync {path}")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file, then every folder (deepest first) under ``root``."""
    dirs = []
    for dirpath, _dirs, files in os.walk(root):
        dirs.append(Path(dirpath))
        for fn in files:
            fsync_file(Path(dirpath) / fn)
    for d in reversed(dirs):
        fsync_dir(d)


def atomic_write(path: Path, data: bytes) -> None:
    """Write temp + fsync + os.replace + fsync the folder: readers see the old or
    the new content, never a mix, even across a power loss."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    crash_point(f"write {tmp}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        crash_point(f"fsync {tmp}")
        os.fsync(f.fileno())
    crash_point(f"replace {path}")
    os.replace(tmp, path)
    fsync_dir(path.parent)
