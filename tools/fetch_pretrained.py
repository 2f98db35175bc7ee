"""Fetch real pretrained TFLite and ONNX models out of PyPI wheels, pinned by sha256.

No model hub is needed: some packages on PyPI ship trained model files inside
their wheels (MediaPipe ships ``.tflite`` files, RapidOCR ships PP-OCR ``.onnx``
files, silero-vad ships its voice activity detector as ``.onnx``).  ``fetch(name)``
downloads the pinned wheel with ``pip download`` (so pip's own index, proxy and
certificate settings apply), takes the one member out of the zip, checks its
sha256 against the pin in :data:`MODELS`, and stores it atomically in a cache
named by that digest, keeping the member's suffix::

    $EDGE_SDK_CACHE/pretrained/<sha256>.tflite      (default ~/.cache/edge_sdk/pretrained/)
    $EDGE_SDK_CACHE/pretrained/<sha256>.onnx

A cached file is re-hashed on every call; a file whose digest does not match is
thrown away and fetched again.  Every failure raises :class:`FetchError` saying
what failed and what to do about it: nothing returns ``None`` and nothing is
skipped.

For a platform wheel (mediapipe) the wheel is the CPython 3.11
``manylinux_2_28_x86_64`` one whatever machine runs this (``pip download
--platform`` only downloads, it never installs); the ``.tflite`` members are
byte-identical in the Linux, Windows and macOS wheels of mediapipe 0.10.21
(checked when pinning).  A pure-Python wheel (``py3-none-any``: rapidocr, silero-vad)
is the same file everywhere, so no ``--platform``/``--abi``/``--implementation`` is
passed; only ``--python-version`` is, so that the package's Requires-Python
(rapidocr 1.4.4 says ``<3.13``) is judged for 3.11 rather than for the running
interpreter.  Either way the wheel's own sha256 is pinned too.

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
    # As the model file reports it: ints for fixed dims; for ONNX a dynamic dim is
    # its dim_param string (e.g. "p2o.DynamicDimension.0", "?") or the dim_value
    # the exporter wrote (PaddlePaddle writes -1).
    shape: tuple[Union[int, str], ...]
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
    wheel_size: Optional[int] = None  # of that wheel, bytes (for messages only)
    python_version: str = "3.11"  # always passed: Requires-Python is judged for this version
    # The wheel tag pip must pick.  platform=None means a pure-Python (py3-none-any)
    # wheel: implementation/abi/platform are then not passed to pip at all.
    implementation: Optional[str] = "cp"
    abi: Optional[str] = "cp311"
    platform: Optional[str] = "manylinux_2_28_x86_64"  # mediapipe 0.10.21 has no manylinux_2_17 wheel
    description: str = ""
    license: str = ""
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def format(self) -> str:
        """``"tflite"`` or ``"onnx"``, from the member's suffix."""
        suffix = pathlib.PurePosixPath(self.member).suffix.lower()
        if suffix not in _SUFFIXES:
            raise FetchError(
                f"MODELS entry for {self.member!r} has suffix {suffix!r}; "
                f"supported: {', '.join(sorted(_SUFFIXES))}"
            )
        return _SUFFIXES[suffix]

    @property
    def suffix(self) -> str:
        return "." + self.format

    @property
    def filename(self) -> str:
        """Cache file name: the member's sha256 plus its suffix."""
        return f"{self.sha256}{self.suffix}"

    @property
    def pure(self) -> bool:
        """True for a pure-Python (py3-none-any) wheel: no platform tag to ask pip for."""
        return self.platform is None

    @property
    def wheel_tag(self) -> str:
        if self.pure:
            return f"py3-none-any, Python {self.python_version}"
        return f"{self.implementation}{self.python_version} {self.platform}"


_SUFFIXES = {".tflite": "tflite", ".onnx": "onnx"}

_MEDIAPIPE = dict(
    package="mediapipe",
    version="0.10.21",
    # mediapipe-0.10.21-cp311-cp311-manylinux_2_28_x86_64.whl, 35,622,638 bytes
    wheel_sha256="05dc4a9e593655a79558d05d6227d31018c2537a4bd3362b51e230cf22aecfe3",
    wheel_size=35_622_638,
    license="Apache-2.0",
)

_RAPIDOCR = dict(
    package="rapidocr-onnxruntime",
    version="1.4.4",
    # rapidocr_onnxruntime-1.4.4-py3-none-any.whl, 14,915,192 bytes (pure Python:
    # one wheel for every platform).  The models are PaddleOCR's PP-OCR models
    # converted to ONNX by RapidAI (paddle2onnx); Apache-2.0 like PaddleOCR.
    wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    wheel_size=14_915_192,
    implementation=None,
    abi=None,
    platform=None,
    license="Apache-2.0",
)

_SILERO = dict(
    package="silero-vad",
    version="6.2.3",
    # silero_vad-6.2.3-py3-none-any.whl, 11,317,527 bytes (pure Python: one wheel for
    # every platform; Requires-Python >=3.8).  MIT licence (Silero Team).
    wheel_sha256="7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
    wheel_size=11_317_527,
    implementation=None,
    abi=None,
    platform=None,
    license="MIT",
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
    "ppocr-mobile-v2-text-direction-cls": Pretrained(
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        size=585_532,
        description=(
            "PP-OCR mobile v2.0 text-direction classifier (is a text-line crop upright or "
            "rotated 180 degrees). ONNX opset 11, ir_version 7, exported by PaddlePaddle. "
            "Input: a text-line crop resized to height 48, width <= 192 (right-padded with "
            "zeros), BGR, float32 NCHW (x / 255 - 0.5) / 0.5. Output: softmax over the labels "
            "('0', '180')."
        ),
        inputs=(TensorSpec("x", (-1, 3, "?", "?"), "float32"),),
        outputs=(TensorSpec("save_infer_model/scale_0.tmp_1", (-1, 2), "float32"),),
        **_RAPIDOCR,
    ),
    "ppocr-v4-text-detection": Pretrained(
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        size=4_745_517,
        description=(
            "PP-OCRv4 mobile text detector (DB, differentiable binarization), Chinese and "
            "English. ONNX opset 12, ir_version 8 (paddle2onnx). Input: BGR image, height "
            "and width multiples of 32, float32 NCHW (x / 255 - 0.5) / 0.5 (RapidOCR's "
            "config). Output: per-pixel text probability map (sigmoid) at the input's HxW; "
            "RapidOCR binarizes it at 0.3 and keeps boxes scoring >= 0.5."
        ),
        inputs=(
            TensorSpec(
                "x",
                ("p2o.DynamicDimension.0", 3, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"),
                "float32",
            ),
        ),
        outputs=(
            TensorSpec(
                "sigmoid_0.tmp_0",
                ("p2o.DynamicDimension.3", 1, "p2o.DynamicDimension.4", "p2o.DynamicDimension.5"),
                "float32",
            ),
        ),
        **_RAPIDOCR,
    ),
    "silero-vad-16k": Pretrained(
        member="silero_vad/data/silero_vad_16k_op15.onnx",
        sha256="7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
        size=1_289_603,
        description=(
            "Silero VAD v6 voice activity detector, 16 kHz only (the wheel's opset-15 export, "
            "what silero_vad.load_silero_vad(onnx=True, opset_version=15) loads; when pinning, "
            "its outputs equalled those of the wheel's default silero_vad.onnx bit for bit on "
            "9 s of 16 kHz speech). ONNX opset 15, ir_version 8 (PyTorch 2.3.1). Per call: 'input' [batch, 576] float32 = "
            "the previous call's last 64 samples followed by 512 new ones (32 ms hop; zeros "
            "before the first call), 'state' [2, batch, 128] float32 (zeros at the start, then "
            "the previous 'stateN'), 'sr' int64 scalar 16000. Outputs: 'output' [batch, 1] "
            "speech probability; 'stateN' [2, batch, 128] the next state. Speech: >= 0.5."
        ),
        inputs=(
            TensorSpec("input", ("batch", "sequence"), "float32"),
            TensorSpec("state", (2, "batch", 128), "float32"),
            TensorSpec("sr", (), "int64"),
        ),
        outputs=(
            TensorSpec("output", ("batch", 1), "float32"),
            TensorSpec("stateN", ("AddstateN_dim_0", "batch", "AddstateN_dim_2"), "float32"),
        ),
        **_SILERO,
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


def _pip_command(spec: Pretrained, dest: pathlib.Path) -> list[str]:
    """The ``pip download`` command line for ``spec``'s wheel (nothing is installed)."""
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps",
        "--only-binary=:all:",
        # Always: Requires-Python is then checked against this version, not the
        # running interpreter's (rapidocr 1.4.4 says <3.13).
        "--python-version", spec.python_version,
    ]
    if not spec.pure:
        for flag, value in (("--implementation", spec.implementation), ("--abi", spec.abi),
                            ("--platform", spec.platform)):
            if value:
                cmd += [flag, value]
    cmd += ["--disable-pip-version-check", "--no-input", "-d", str(dest), spec.requirement]
    return cmd


def _pip_download(spec: Pretrained, dest: pathlib.Path, timeout: float) -> pathlib.Path:
    cmd = _pip_command(spec, dest)
    where = f"{spec.requirement} ({spec.wheel_tag})"
    size = f"~{spec.wheel_size / 1e6:.0f} MB" if spec.wheel_size else "large"
    log.info("downloading %s: %s", where, " ".join(cmd))
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise FetchError(
            f"FETCH FAILED: `pip download {spec.requirement}` did not finish within {timeout:g} s.\n"
            f"  The wheel is {size}. Check the network / PyPI mirror (pip config list), then retry "
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
            f"and still serves {spec.requirement} for {spec.wheel_tag}; behind a proxy set "
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
                others = sorted(n for n in zf.namelist() if n.lower().endswith(spec.suffix))
                raise FetchError(
                    f"FETCH FAILED: {wheel.name} has no member {spec.member!r}. "
                    f"{spec.suffix} members it does have: {others[:20]}. Fix the `member` in MODELS."
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
            f"  Expected the {spec.wheel_tag} wheel of "
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
    """Return the path of the verified model file for ``name``, fetching it if needed.

    The file is ``<cache_dir>/<sha256>.tflite`` or ``<sha256>.onnx``, after the
    member's suffix.

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
        description="Fetch a pinned pretrained .tflite or .onnx out of a PyPI wheel and print its path."
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
            print(f"{key}\t{spec.format}\t{spec.requirement}\t{spec.member}\t{spec.sha256}")
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
