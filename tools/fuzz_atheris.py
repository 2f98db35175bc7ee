"""Coverage-guided fuzzing of edge_sdk's parsers with atheris (libFuzzer).

Not part of the test suite (tests/test_fuzz.py runs bounded hypothesis
properties there); this is for long local runs.  ``pip install atheris``, then::

    python -m tools.fuzz_atheris TARGET [libFuzzer flags, e.g. -max_total_time=300 -rss_limit_mb=4096 corpus_dir]

TARGET is one of: toml, manifest, package_zip, package_tar, request, response,
onnx, tflite, sniff, npy, csv, cpuinfo, image_header, image_decode, json.  Any exception that is not the
SDK's typed error (EdgeSDKError, or the target's documented error type) is
reported by libFuzzer as a crash, with the input saved as ``crash-<sha1>``.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

import atheris

with atheris.instrument_imports():
    from converters.calibration import CalibrationError, load_data
    from edge_sdk import _toml, profiles
    from edge_sdk.errors import EdgeSDKError
    from edge_sdk.package import Manifest, ModelPackage, TensorSpec
    from edge_sdk.package import modelfile as _modelfile
    from edge_sdk.processing.image import decode_image_bgr
    from edge_sdk.processing.image_header import probe_image
    from edge_sdk.remote import protocol

_TMP = Path(tempfile.mkdtemp(prefix="edge-sdk-fuzz-"))
atexit.register(shutil.rmtree, _TMP, True)
_VEC = TensorSpec("x", "float32", ("batch", 4), "NC", (("batch", 1, 8),))
_IMU = TensorSpec("imu", "float32", ("batch", 8, 3), "NLC", (("batch", 1, 4),))
#: Escapes ModelPackage.open through a reported package.py bug; drop once fixed.
_KNOWN_PACKAGE_BUGS: tuple[type[BaseException], ...] = ()


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _toml_target(data: bytes) -> None:
    try:
        _toml.loads(_text(data))
    except _toml.TOMLDecodeError:
        pass


def _manifest_target(data: bytes) -> None:
    try:
        Manifest.from_dict(_toml.loads(_text(data)))
    except (_toml.TOMLDecodeError, EdgeSDKError):
        pass


def _package(suffix: str) -> Callable[[bytes], None]:
    def target(data: bytes) -> None:
        path = _TMP / f"p{suffix}"
        path.write_bytes(data)
        try:
            ModelPackage.open(path, cache_dir=_TMP / "cache")
        except (EdgeSDKError, *_KNOWN_PACKAGE_BUGS):
            pass

    return target


def _request(data: bytes) -> None:
    try:
        protocol.decode_request(data, {}, max_bytes=1 << 20)
    except EdgeSDKError:
        pass


def _response(data: bytes) -> None:
    n = data[0] if data else 0
    try:
        protocol.decode_response(data[1:], {protocol.HEADER_LENGTH: str(n)} if n else {})
    except EdgeSDKError:
        pass


def _parse(fn: Callable[[bytes], object]) -> Callable[[bytes], None]:
    def target(data: bytes) -> None:
        try:
            fn(data)
        except EdgeSDKError:
            pass

    return target


def _calibration(suffix: str, spec: TensorSpec) -> Callable[[bytes], None]:
    def target(data: bytes) -> None:
        path = _TMP / f"data{suffix}"
        path.write_bytes(data)
        try:
            load_data(path, [spec], progress=False)
        except (CalibrationError, EdgeSDKError):
            pass

    return target


def _cpuinfo(data: bytes) -> None:
    root = _TMP / "root"
    (root / "proc/device-tree").mkdir(parents=True, exist_ok=True)
    third = max(len(data) // 3, 1)
    (root / "proc/cpuinfo").write_bytes(data[:third])
    (root / "proc/meminfo").write_bytes(data[third : 2 * third])
    (root / "proc/device-tree/model").write_bytes(data[2 * third :])
    try:
        profiles.detect(root, machine="aarch64")
    except EdgeSDKError:
        pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "toml": _toml_target,
    "manifest": _manifest_target,
    "package_zip": _package(".zip"),
    "package_tar": _package(".tar.gz"),
    "request": _request,
    "response": _response,
    "onnx": _parse(_modelfile.scan_onnx),
    "tflite": _parse(_modelfile.inspect_tflite),
    "sniff": _parse(_modelfile.sniff_format),
    "npy": _calibration(".npy", _VEC),
    "csv": _calibration(".csv", _IMU),
    "cpuinfo": _cpuinfo,
    "image_header": _parse(probe_image),
    "image_decode": _parse(lambda d: decode_image_bgr(d, max_pixels=1 << 20)),
    "json": _parse(protocol.loads_json),
}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
