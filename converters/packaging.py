"""Write a model package: copy model files, digest them, write the manifest.

    write_package("out/pkg", {
        "name": "m", "version": "1", "task": "raw",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}],
        "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"}],
    }, files={"m.onnx": onnx_bytes_or_path})

Every variant (and each of its ``external_data`` entries, given as file names)
gets ``sha256`` and ``size`` filled in from the files; the manifest is
validated by :class:`edge_sdk.package.Manifest` before it is written, and the
result is opened with :meth:`ModelPackage.open` to prove it verifies.
Refuses to write into a non-empty folder unless ``overwrite=True``.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from edge_sdk.package import MANIFEST_NAME, ImagePreprocess, Manifest, ModelPackage, TensorSpec, file_ref

from .errors import ConverterError


class SignatureError(ConverterError, ValueError):
    """A model's own signature cannot be described in a manifest as given."""


def onnx_tensor_specs(
    data: bytes, dims: Mapping[str, tuple[int, int]], preprocess: ImagePreprocess | None = None
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX model (read with the dependency-free scanner,
    no runtime) as manifest TensorSpecs. Every dynamic input dim needs bounds in
    ``dims`` (unnamed ones are called ``<tensor>_d<axis>``); 4-D inputs with 1 or
    3 channels get an NCHW/NHWC layout and ``preprocess``, if given."""
    from edge_sdk.package.modelfile import scan_onnx

    info = scan_onnx(data)

    def spec(t: Any, is_input: bool) -> TensorSpec:
        if t.dims is None or t.dtype is None:
            raise SignatureError(f"model tensor {t.name!r} has no static type/rank; cannot describe it in a manifest")
        shape: list[int | str] = []
        bounds = []
        for i, d in enumerate(t.dims):
            if isinstance(d, int) and d > 0:
                shape.append(d)
                continue
            name = d if isinstance(d, str) and d else f"{t.name}_d{i}"
            shape.append(name)
            if is_input:
                if name not in dims:
                    raise SignatureError(f"input {t.name!r} dim {i} ({name}) is dynamic; to give its bounds, give --dim {name}=MIN:MAX")
                lo, hi = dims[name]
                bounds.append((name, lo, hi))
        layout = pre = None
        if is_input and len(shape) == 4:
            layout = "NCHW" if shape[1] in (1, 3) else ("NHWC" if shape[3] in (1, 3) else None)
            if preprocess is not None and layout is not None:
                pre = preprocess
        return TensorSpec(t.name, t.dtype, tuple(shape), layout, tuple(bounds), pre)

    ins = [spec(t, True) for t in info.inputs]
    outs = [spec(t, False) for t in info.outputs]
    if preprocess is not None and not any(s.preprocess for s in ins):
        raise SignatureError("--preprocess was given but no input is an NCHW/NHWC image with 1 or 3 channels")
    return ins, outs


def write_package(
    folder: str | os.PathLike[str],
    manifest: Mapping[str, Any],
    files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    *,
    overwrite: bool = False,
    verify: bool = True,
) -> ModelPackage | Path:
    """Write a package folder: copy ``files`` (relative path -> bytes or source path) into ``folder``, fill in each
    variant's (and external data's, golden files') sha256 and size, check the manifest by parsing it, and write
    ``edge-model.toml``. Raises ``FileExistsError`` if ``folder`` is not empty and not ``overwrite``,
    :class:`~edge_sdk.errors.ManifestError` for a bad manifest. Returns the opened (verified) :class:`ModelPackage`,
    or the folder's path if ``verify`` is false."""
    root = Path(folder)
    if root.exists() and any(root.iterdir()) and not overwrite:
        raise FileExistsError(f"{root} is not empty; pass overwrite=True to replace its files")
    root.mkdir(parents=True, exist_ok=True)
    for rel, src in (files or {}).items():
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, (bytes, bytearray)):
            dst.write_bytes(src)
        else:
            shutil.copyfile(src, dst)
    m = copy.deepcopy(dict(manifest))
    m.setdefault("schema", 1)
    for v in m.get("variants", []):
        if "sha256" not in v or "size" not in v:
            ref = file_ref(root, v["file"])
            v.setdefault("sha256", ref.sha256)
            v.setdefault("size", ref.size)
        ext = []
        for e in v.get("external_data", []):
            if isinstance(e, str):
                r = file_ref(root, e)
                ext.append({"file": r.file, "sha256": r.sha256, "size": r.size})
            else:
                ext.append(e)
        if ext:
            v["external_data"] = ext
    golden = m.get("golden")
    if isinstance(golden, dict):
        for key in ("inputs", "outputs"):
            if isinstance(golden.get(key), str) and f"{key}_sha256" not in golden:
                golden[f"{key}_sha256"] = file_ref(root, golden[key]).sha256
    rs = m.get("reference_stats")
    if isinstance(rs, str):  # a file name: digest and size filled in here
        rs = m["reference_stats"] = {"file": rs}
    if isinstance(rs, dict) and isinstance(rs.get("file"), str) and ("sha256" not in rs or "size" not in rs):
        r = file_ref(root, rs["file"])
        rs.setdefault("sha256", r.sha256)
        rs.setdefault("size", r.size)
    parsed = Manifest.from_dict(m)
    (root / MANIFEST_NAME).write_text(parsed.to_toml())
    if verify:
        return ModelPackage.open(root)
    return root
