"""Load untrusted model bytes in a throw-away child process first.

A runtime's own model parser (ONNX Runtime's ``InferenceSession`` creation,
LiteRT's ``Interpreter`` + ``allocate_tensors``) is native code: a hostile or
broken file can make it segfault, abort, spin forever or allocate without
bound, taking the whole application down.  :func:`check_load` runs exactly that
load on the verified bytes in a child (``python -m edge_sdk.backends.sandbox``) under
``RLIMIT_AS`` and a wall-time limit, so such a model kills only the child and
the caller gets a typed :class:`SandboxError` naming what went wrong:

- :class:`SandboxCrashError`: the child died from a signal (segfault, abort).
- :class:`SandboxMemoryError`: the load needed more than the memory limit.
- :class:`SandboxTimeoutError`: the load ran past the time limit (killed).
- :class:`SandboxLoadError`: the runtime refused the model with an exception.

The check costs one interpreter start plus one runtime import and model load
(a few hundred ms); it is meant for packages from outside a trusted model
store.  POSIX only: on a platform without ``resource`` the memory limit is not
applied (the time limit and crash isolation still are).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import OptionsError, SessionError

#: Memory (MiB) the model load may add on top of the child's footprint after the runtime import.
DEFAULT_MEMORY_LIMIT_MB = 2048
#: Seconds the whole child (interpreter start, runtime import, model load) may take.
DEFAULT_TIME_LIMIT_S = 60.0
#: Backends the sandbox knows how to load.
BACKENDS = ("onnxruntime", "litert")
#: Test hooks the child honours (simulate a runtime that crashes/hangs/allocates).
_FAULTS = ("abort", "segv", "hang", "alloc")
_EXIT_REFUSED = 3
_EXIT_MEMORY = 4


class SandboxError(SessionError):
    """Loading the model in the sandbox child failed; the message names the limit or cause."""


class SandboxCrashError(SandboxError):
    """The runtime crashed (killed by a signal) while loading the model."""


class SandboxMemoryError(SandboxError):
    """Loading the model needed more memory than the sandbox limit."""


class SandboxTimeoutError(SandboxError):
    """Loading the model ran past the sandbox's wall-time limit."""


class SandboxLoadError(SandboxError):
    """The runtime raised an error for the model (it is malformed or unsupported)."""


def from_model_store(root: str | os.PathLike[str]) -> bool:
    """Whether package folder ``root`` is an installed version inside a model store.

    A store lays installed packages out as ``<store>/versions/<name>/<version>/``
    with ``.store-install.json`` inside and ``store.toml`` at ``<store>``
    (see :mod:`edge_sdk.store`).  Archives opened directly are extracted into the
    package cache, never into such a layout, so their contents cannot claim it.
    """
    p = Path(os.path.realpath(root))
    return (p / ".store-install.json").is_file() and p.parent.parent.name == "versions" and (p.parents[2] / "store.toml").is_file()


def enabled(option: bool | None, root: str | os.PathLike[str]) -> bool:
    """``LoadOptions.sandbox`` resolved: ``None`` means on, except for packages from a model store."""
    return (not from_model_store(root)) if option is None else bool(option)


def memory_limit_for(model_bytes: int) -> int:
    """The default memory limit (MiB) for a model of ``model_bytes``: room for ~3 copies, at least the default."""
    return max(DEFAULT_MEMORY_LIMIT_MB, 3 * (model_bytes >> 20) + 512)


def check_verified_once(
    backend: str,
    digest: str,
    data: bytes | Callable[[], bytes],
    path: str | os.PathLike[str],
    *,
    external_bytes: int | None = None,
    marks: Path | None = None,
) -> bool:
    """:func:`check_verified`, remembered: a model (by its verified sha256) that passed once with
    this runtime version is not parsed again in a child. The marks live under ``marks`` (default:
    ``<edge_sdk cache>/sandbox-ok``), one empty file per (backend, runtime version, digest).
    ``data`` may be a function giving the bytes: it is called only when the child runs.
    Returns True when the child ran, False when an earlier pass was remembered."""
    if backend not in BACKENDS:
        return False
    from ..package import default_cache_dir
    from .base import backend_status

    version = backend_status(backend).version or "unknown"
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{backend}-{version}")
    mark = (marks or default_cache_dir() / "sandbox-ok") / f"{safe}-{digest}"
    if mark.exists():
        return False
    check_verified(backend, data() if callable(data) else data, path, external_bytes=external_bytes)
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        tmp = mark.with_name(mark.name + f".{os.getpid()}.tmp")
        tmp.write_bytes(b"")
        os.replace(tmp, mark)
    except OSError:
        pass  # a read-only cache: the check simply runs again next time
    return True


def check_verified(backend: str, data: bytes, path: str | os.PathLike[str], *, external_bytes: int | None = None) -> None:
    """:func:`check_load` for a package's verified variant, with limits sized to the model.

    ``data`` are the verified bytes; ``external_bytes`` is the total size of
    the ONNX external-data files (``None`` when the model has none), in which
    case the child loads from ``path`` so the runtime finds them next to it.
    Backends the sandbox does not know (test doubles, future runtimes) are not checked.
    """
    if backend not in BACKENDS:
        return
    if external_bytes is None:
        check_load(backend, data, memory_limit_mb=memory_limit_for(len(data)))
    else:
        check_load(backend, path=path, memory_limit_mb=memory_limit_for(len(data) + external_bytes))


def check_load(
    backend: str,
    data: bytes | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    _fault: str | None = None,
) -> None:
    """Load the model with ``backend``'s own loader in a limited child process.

    Give ``data`` (the verified bytes, sent over stdin) or ``path`` (for ONNX
    models with external data, which must be resolved next to the file).
    Returns ``None`` when the child loaded the model and exited cleanly;
    raises a :class:`SandboxError` subclass otherwise, and ``ValueError`` for
    bad arguments.  ``_fault`` is a test hook only.
    """
    if backend not in BACKENDS:
        raise OptionsError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if (data is None) == (path is None):
        raise ValueError("give exactly one of data= or path=")
    if memory_limit_mb < 64 or time_limit_s <= 0:
        raise OptionsError(f"limits: expected memory_limit_mb >= 64 and time_limit_s > 0, got {memory_limit_mb}, {time_limit_s}")
    if _fault is not None and _fault not in _FAULTS:
        raise OptionsError(f"_fault: expected one of {_FAULTS}, got {_fault!r}")
    cmd = [sys.executable, "-m", "edge_sdk.backends.sandbox", backend, "--memory-mb", str(int(memory_limit_mb))]
    if path is not None:
        cmd += ["--path", str(Path(path).resolve())]
    if _fault:
        cmd += ["--fault", _fault]
    env = dict(os.environ)
    # The child must import this very edge_sdk, wherever it is installed or checked out.
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    what = f"sandboxed {backend} load"
    import subprocess  # here, not at the top: a load whose digest passed before never starts a child (6 ms of imports)

    try:
        proc = subprocess.run(
            cmd, input=data if data is not None else b"", capture_output=True, timeout=time_limit_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        # subprocess.run kills the child on timeout before re-raising.
        raise SandboxTimeoutError(f"{what}: did not finish within the time limit of {time_limit_s:g} s (child killed)") from None
    except OSError as e:
        raise SandboxError(f"{what}: cannot start the child process: {e}") from e
    stderr = proc.stderr.decode("utf-8", errors="replace")
    tail = stderr.strip().splitlines()[-1][:300] if stderr.strip() else "(no output)"
    rc = proc.returncode
    if rc == 0:
        return
    report: dict[str, Any] = {}
    try:
        report = json.loads(proc.stdout.decode("utf-8", errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        pass
    limit = f"the memory limit of {memory_limit_mb} MiB (RLIMIT_AS above the runtime's own footprint)"
    if rc == _EXIT_MEMORY or _mentions_memory(stderr) or _mentions_memory(str(report.get("message", ""))):
        raise SandboxMemoryError(f"{what}: the model needs more than {limit}: {report.get('message') or tail}")
    if rc < 0:
        import signal

        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        raise SandboxCrashError(f"{what}: the runtime crashed ({name}) while loading the model; last output: {tail}")
    if rc == _EXIT_REFUSED:
        raise SandboxLoadError(f"{what}: the runtime refused the model: {report.get('error', '?')}: {report.get('message', tail)}")
    raise SandboxCrashError(f"{what}: the child exited with status {rc}; last output: {tail}")


def _mentions_memory(text: str) -> bool:
    t = text.lower()
    return any(k in t for k in ("bad_alloc", "memoryerror", "out of memory", "failed to allocate", "cannot allocate"))


# --- child side -------------------------------------------------------------------------


def _vm_size_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _limit_memory(extra_mb: int) -> None:
    """Cap the address space at the current size plus ``extra_mb`` MiB."""
    try:
        import resource
    except ImportError:  # pragma: no cover - non-POSIX
        return
    base = _vm_size_bytes() or 0
    cap = base + extra_mb * (1 << 20)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _load_onnx(data: bytes | None, path: str | None) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    ort.InferenceSession(path if path is not None else data, sess_options=so, providers=["CPUExecutionProvider"])


def _load_litert(data: bytes | None, path: str | None, memory_mb: int) -> None:
    from .litert import _litert

    mod, _runtime, _version = _litert()
    if path is not None:
        data = Path(path).read_bytes()
    it = mod.Interpreter(model_content=data, num_threads=1)
    # LiteRT reports a failed arena allocation as a bare RuntimeError(""); check the
    # declared tensor sizes first so a huge declared dim is named as a memory problem.
    import numpy as np

    declared = 0
    for t in it.get_tensor_details():
        declared += int(np.prod([max(int(d), 1) for d in t["shape"]], dtype=object)) * np.dtype(t["dtype"]).itemsize
    if declared > memory_mb << 20:
        raise MemoryError(f"tensors declare {declared >> 20} MiB in total, over the {memory_mb} MiB limit")
    it.allocate_tensors()


def _fault(kind: str) -> None:  # test hooks: what a broken native runtime does
    import signal

    if kind == "abort":
        os.abort()
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        import time

        while True:
            time.sleep(1)
    if kind == "alloc":
        bytearray(1 << 40)


def _child(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m edge_sdk.backends.sandbox", description="Load a model in a limited process (internal).")
    ap.add_argument("backend", choices=BACKENDS)
    ap.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_LIMIT_MB)
    ap.add_argument("--path")
    ap.add_argument("--fault", choices=_FAULTS)
    args = ap.parse_args(argv)
    data = None if args.path else sys.stdin.buffer.read()
    try:
        if args.backend == "onnxruntime":
            import onnxruntime  # noqa: F401  (import before the limit: its footprint is not the model's)
        else:
            from .litert import _litert

            _litert()
        _limit_memory(args.memory_mb)
        if args.fault:
            _fault(args.fault)
        if args.backend == "onnxruntime":
            _load_onnx(data, args.path)
        else:
            _load_litert(data, args.path, args.memory_mb)
    except MemoryError as e:
        print(json.dumps({"error": "MemoryError", "message": str(e) or "out of memory"}), flush=True)
        return _EXIT_MEMORY
    except Exception as e:  # noqa: BLE001 - the child reports any runtime failure to the parent
        print(json.dumps({"error": type(e).__name__, "message": str(e)[:2000]}), flush=True)
        return _EXIT_MEMORY if _mentions_memory(str(e)) else _EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
