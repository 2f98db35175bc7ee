"""A file's identity and change stamps, for caches that remember what was computed from a file.

:func:`stamp` is ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` of an ``fstat``
(https://man7.org/linux/man-pages/man3/stat.3type.html): any write, truncation, rename-over or
``utime`` changes ``st_ctime_ns``, so an entry keyed by it stops matching. A result is only
remembered when the file's stamps are older than :data:`RACY_WINDOW_NS` at the moment the work
began (:func:`settled`): a write in the same timestamp tick would not change them ("racily clean"
files, as git calls them, https://git-scm.com/docs/racy-git). Used by the package digest cache
(:mod:`edge_sdk.package.archive`) and the parsed-profile cache (:mod:`edge_sdk.profiles.profile`).
"""

from __future__ import annotations

import os

#: How much older than the start of the work a file's mtime and ctime must be for a result to be
#: remembered (ns): covers the coarse kernel clock that stamps files (a tick, <= 10 ms) and FAT's 2 s mtime.
RACY_WINDOW_NS = 2_500_000_000

Stamp = tuple[int, int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    """``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(st: os.stat_result, started_ns: int, window_ns: int = RACY_WINDOW_NS) -> bool:
    """Whether the file ``st`` describes last changed at least ``window_ns`` before ``started_ns``
    (``time.time_ns()`` taken before the work began)."""
    return max(st.st_mtime_ns, st.st_ctime_ns) <= started_ns - window_ns
