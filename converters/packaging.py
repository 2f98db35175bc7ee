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
from typing import Any, Mapping, Sequence

from edge_sdk.package import MANIFEST_NAME, ImagePreprocess, Manifest, ModelPackage, TensorSpec, file_ref

from .errors import ConverterError


class SignatureError(ConverterError, ValueError):
    """A model's own signature cannot be described in a manifest as given."""


OPEN_BOUNDS = (1, 1 << 24)  # a dim without --dim while its bounds are read off the data (manifest MAX_DIM)


def _dim_name(tensor: str, axis: int, d: Any) -> str | None:
    """The dim's name, ``<tensor>_dim<axis>`` for a nameless one (no name, ``?``, or a value <= 0); None if fixed."""
    if isinstance(d, int) and d > 0:
        return None
    if isinstance(d, str) and d.strip() and d.strip() != "?":
        return d
    return f"{tensor}_dim{axis}"


def dynamic_input_dims(data: bytes) -> list[tuple[str, str, int]]:
    """(dim name, input name, axis) of every dynamic input dim of an ONNX model, in declaration order."""
    from edge_sdk.package.modelfile import scan_onnx

    out = []
    for t in scan_onnx(data).inputs:
        for i, d in enumerate(t.dims or ()):
            name = _dim_name(t.name, i, d)
            if name is not None:
                out.append((name, t.name, i))
    return out


def onnx_tensor_specs(
    data: bytes, dims: Mapping[str, tuple[int, int]], preprocess: ImagePreprocess | None = None, *, open_dims: bool = False
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX model (read with the dependency-free scanner,
    no runtime) as manifest TensorSpecs. Every dynamic input dim needs bounds in
    ``dims`` (unnamed ones, ``?`` or a value <= 0, are called ``<tensor>_dim<axis>``,
    as :mod:`converters.normalize` names them); with ``open_dims`` a dim without
    bounds gets :data:`OPEN_BOUNDS` instead of an error (the converter then reads
    its bounds off the data, :func:`observed_bounds`). 4-D inputs with 1 or
    3 channels get an NCHW/NHWC layout and ``preprocess``, if given."""
    from edge_sdk.package.modelfile import scan_onnx

    info = scan_onnx(data)

    def spec(t: Any, is_input: bool) -> TensorSpec:
        if t.dims is None or t.dtype is None:
            raise SignatureError(f"model tensor {t.name!r} has no static type/rank; cannot describe it in a manifest")
        shape: list[int | str] = [d if (name := _dim_name(t.name, i, d)) is None else name for i, d in enumerate(t.dims)]
        layout = pre = None
        if is_input and len(shape) == 4:
            layout = "NCHW" if shape[1] in (1, 3) else ("NHWC" if shape[3] in (1, 3) else None)
            if preprocess is not None and layout is not None:
                pre = preprocess
                shape = _fix_image_dims(t.name, shape, layout, preprocess, dims)
        bounds: list[tuple[str, int, int]] = []
        for i, name in enumerate(shape):
            if not is_input or not isinstance(name, str) or name in [b[0] for b in bounds]:
                continue
            if name not in dims and not open_dims:
                raise SignatureError(
                    f"input {t.name!r} dim {i} ({name}) is dynamic; to give its bounds, give --dim {name}=MIN:MAX "
                    "(or calibration data whose samples show its sizes)"
                )
            lo, hi = dims.get(name, OPEN_BOUNDS)
            bounds.append((name, lo, hi))
        return TensorSpec(t.name, t.dtype, tuple(shape), layout, tuple(bounds), pre)

    ins = [spec(t, True) for t in info.inputs]
    outs = [spec(t, False) for t in info.outputs]
    if preprocess is not None and not any(s.preprocess for s in ins):
        raise SignatureError("--preprocess was given but no input is an NCHW/NHWC image with 1 or 3 channels")
    return ins, outs


def _fix_image_dims(tensor: str, shape: list[int | str], layout: str, pre: ImagePreprocess, dims: Mapping[str, tuple[int, int]]) -> list[int | str]:
    """An image input's named H and W dims resolved to the sizes ``pre`` gives them (the manifest wants the
    preprocessed image's shape there): ``--preprocess size=320x320`` fixes ``height`` and ``width`` at 320. A ``--dim``
    for one of them must allow that size (``SignatureError`` otherwise); a dim used elsewhere in the shape keeps its
    name."""
    h_ax, w_ax = (2, 3) if layout == "NCHW" else (1, 2)
    want = {h_ax: pre.size_hw[0], w_ax: pre.size_hw[1]}
    out = list(shape)
    for ax, size in want.items():
        d = shape[ax]
        if not isinstance(d, str) or any(x == d for i, x in enumerate(shape) if i not in want):
            continue
        if shape[h_ax] == shape[w_ax] and pre.size_hw[0] != pre.size_hw[1]:
            raise SignatureError(f"input {tensor!r}: H and W are one dim {d!r}, --preprocess size {pre.size_hw[0]}x{pre.size_hw[1]} is not square")
        if d in dims and not dims[d][0] <= size <= dims[d][1]:
            raise SignatureError(f"input {tensor!r} dim {ax} ({d}): --preprocess size gives {size}, outside its --dim {d}={dims[d][0]}:{dims[d][1]}")
        out[ax] = size
    return out


def observed_bounds(specs: Sequence[TensorSpec], names: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """(min, max) of each dynamic dim in ``names`` over the shapes of ``samples`` (feeds dicts); a dim that several
    inputs share takes the range over all of them."""
    seen: dict[str, list[int]] = {}
    for s in specs:
        for axis, d in enumerate(s.shape):
            if isinstance(d, str) and d in names:
                seen.setdefault(d, []).extend(int(x[s.name].shape[axis]) for x in samples if s.name in x)
    return {k: (min(v), max(v)) for k, v in seen.items() if v}


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
