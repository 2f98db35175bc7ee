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

from edge_sdk.package import MANIFEST_NAME, Manifest, ModelPackage, file_ref


def write_package(
    folder: str | os.PathLike[str],
    manifest: Mapping[str, Any],
    files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    *,
    overwrite: bool = False,
    verify: bool = True,
) -> ModelPackage | Path:
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
    parsed = Manifest.from_dict(m)
    (root / MANIFEST_NAME).write_text(parsed.to_toml())
    if verify:
        return ModelPackage.open(root)
    return root
