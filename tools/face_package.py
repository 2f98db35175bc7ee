"""The BlazeFace face-detection package with three variants, built once and cached.

MediaPipe's BlazeFace short-range detector (fp32 TFLite, fetched and sha256-checked by
``tools.fetch_pretrained``) packaged with the manifest of ``tools.bench_pipeline.face_manifest``
(letterbox to 128x128, [-1, 1], weighted NMS), in three variants:

- ``fp32-tflite``: the MediaPipe file as is (LiteRT);
- ``fp32-onnx``: the same graph translated by ``tools/tflite_to_onnx.py`` (ONNX Runtime);
- ``fp16-onnx``: that ONNX model converted by the converter's fp16 mode
  (``converters.quantize.convert_fp16``: fp16 weights and compute, fp32 inputs/outputs), which is
  what ``edge-convert quantize --to fp16`` does; what a Jetson's CUDA/TensorRT providers want.

Every variant has the same inputs and outputs (the translation keeps the TFLite names, shapes
and NHWC layout), so one manifest serves all three. The samples (``samples/pi_camera_detect.py``,
``samples/jetson_detect.py``) and their tests use :func:`face_package`.

The package is cached under the normal edge_sdk cache, next to the fetched model
(``tools.fetch_pretrained.default_cache_dir()``), in a folder named by a digest of everything
that goes into it: the .tflite's sha256, the sources of this file, of the translator and of the
fp16 converter, and the onnx / onnxruntime versions. A rerun opens and verifies the cached package
(every digest) instead of rebuilding; a change in any input makes a new folder.

Usage::

    python tools/face_package.py            # build (or find) it and print its path
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["VARIANTS", "face_package", "face_package_manifest", "package_key"]

VARIANTS = ("fp32-tflite", "fp32-onnx", "fp16-onnx")


def face_package_manifest() -> dict[str, Any]:
    """tools.bench_pipeline.face_manifest() with the two ONNX variants added."""
    from tools.bench_pipeline import face_manifest

    m = copy.deepcopy(face_manifest())
    m["variants"] = [
        {"id": "fp32-tflite", "file": "face.tflite", "backend": "litert", "precision": "fp32"},
        {"id": "fp32-onnx", "file": "face_fp32.onnx", "backend": "onnxruntime", "precision": "fp32"},
        {"id": "fp16-onnx", "file": "face_fp16.onnx", "backend": "onnxruntime", "precision": "fp16"},
    ]
    return m


def package_key(tflite: str | os.PathLike[str]) -> str:
    """Digest of every input of the build (see the module docstring)."""
    import onnx
    import onnxruntime

    import converters.quantize
    import tools.bench_pipeline
    import tools.tflite_to_onnx
    from tools.fetch_pretrained import sha256_file

    h = hashlib.sha256()
    h.update(sha256_file(tflite).encode())
    for mod in (tools.tflite_to_onnx, converters.quantize, tools.bench_pipeline):
        h.update(Path(mod.__file__).read_bytes())  # type: ignore[arg-type]
    h.update(Path(__file__).read_bytes())
    h.update(f"onnx {onnx.__version__} onnxruntime {onnxruntime.__version__}".encode())
    return h.hexdigest()


def face_package(cache_dir: str | os.PathLike[str] | None = None, *, tflite: str | os.PathLike[str] | None = None) -> Path:
    """The package folder (built on first use). ``cache_dir`` defaults to
    ``tools.fetch_pretrained.default_cache_dir()``; ``tflite`` to the fetched MediaPipe model.
    Raises tools.fetch_pretrained.FetchError when the model cannot be fetched and
    tools.tflite_to_onnx.TFLiteToOnnxError when it cannot be translated."""
    from converters.packaging import write_package
    from converters.quantize import convert_fp16
    from edge_sdk.errors import ModelPackageError
    from edge_sdk.package import ModelPackage
    from tools.bench_pipeline import MODEL_NAME
    from tools.fetch_pretrained import default_cache_dir, fetch
    from tools.tflite_to_onnx import convert_file

    if tflite is None:
        tflite = fetch(MODEL_NAME, cache_dir=cache_dir) if cache_dir is not None else fetch(MODEL_NAME)
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = base / "packages" / f"blazeface-short-range-{package_key(tflite)[:24]}"
    if dest.is_dir():
        try:
            ModelPackage.open(dest)  # verifies every variant's digest
            return dest
        except ModelPackageError:
            shutil.rmtree(dest, ignore_errors=True)  # damaged: build it again
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the destination, then rename: a concurrent or interrupted build never leaves
    # a half-written package where a reader would take it.
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))
    try:
        onnx32 = convert_file(tflite, work / "src" / "face_fp32.onnx")
        onnx16 = work / "src" / "face_fp16.onnx"
        convert_fp16(onnx32, onnx16)
        files = {"face.tflite": tflite, "face_fp32.onnx": onnx32, "face_fp16.onnx": onnx16}
        write_package(work / "pkg", face_package_manifest(), files)
        try:
            os.rename(work / "pkg", dest)
        except OSError:
            if not dest.is_dir():  # lost a race to another builder: theirs is as good as ours
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


if __name__ == "__main__":
    print(face_package())
