"""Model packages: manifest, variants, digests and containment.

A package is a folder holding ``edge-model.toml`` and the files it names, or a
``.zip`` / ``.tar`` / ``.tar.gz`` of such a folder. :meth:`ModelPackage.open`
verifies all of it before any runtime is involved.

    from edge_sdk.package import ModelPackage
    pkg = ModelPackage.open("shapes-classifier/")
    for v in pkg.manifest.variants:
        print(v.id, v.backend, v.precision, v.size)

The modules, each importing only the ones before it:

- :mod:`edge_sdk.package.manifest`: the schema (:class:`Manifest`, :class:`TensorSpec`,
  :class:`Variant`, ...) parsed and checked from the TOML's tables, and written back.
- :mod:`edge_sdk.package.archive`: folders and archives: safe extraction into the cache (budgeted
  by declared size, bytes written and compression ratio), containment, regular-file checks before
  every open, pickle refusal, digests.
- :mod:`edge_sdk.package.model_package`: :class:`ModelPackage`, the opened and verified package.
"""

from __future__ import annotations

from .archive import (
    MAX_ARCHIVE_BYTES,
    MAX_ARCHIVE_MEMBERS,
    MAX_COMPRESSION_RATIO,
    PICKLE_SUFFIXES,
    archive_kind,
    contained,
    default_cache_dir,
    extract_archive,
    file_ref,
    open_regular,
    package_folder,
    package_root_in,
    read_regular,
    refuse_unsafe_files,
    sha256_file,
    verify_file,
)
from .manifest import (
    BACKEND_FORMATS,
    COLOR_ORDERS,
    DECODER_PARAMS,
    DECODERS,
    DETECTION_FORMATS,
    DTYPES,
    INTERPOLATIONS,
    LAYOUTS,
    MANIFEST_NAME,
    RESIZE_MODES,
    SCHEMA_VERSION,
    TASKS,
    Benchmark,
    DecoderSpec,
    Dim,
    FileRef,
    Gate,
    GenerationSpec,
    Golden,
    ImagePreprocess,
    Manifest,
    Quality,
    ReferenceStatsRef,
    StatePair,
    TensorSpec,
    Variant,
    VariantGeneration,
    check_relpath,
)
from .model_package import ModelPackage, VerifiedModel

__all__ = [
    # manifest
    "BACKEND_FORMATS", "COLOR_ORDERS", "DECODERS", "DECODER_PARAMS", "DETECTION_FORMATS", "DTYPES", "INTERPOLATIONS", "LAYOUTS",
    "MANIFEST_NAME", "RESIZE_MODES", "SCHEMA_VERSION", "TASKS", "Benchmark", "DecoderSpec", "Dim", "FileRef", "Gate", "GenerationSpec",
    "Golden", "ImagePreprocess", "Manifest", "Quality", "ReferenceStatsRef", "StatePair", "TensorSpec", "Variant",
    "VariantGeneration", "check_relpath",
    # archive
    "MAX_ARCHIVE_BYTES", "MAX_ARCHIVE_MEMBERS", "MAX_COMPRESSION_RATIO", "PICKLE_SUFFIXES", "archive_kind", "contained",
    "default_cache_dir", "extract_archive", "file_ref", "open_regular", "package_folder", "package_root_in", "read_regular",
    "refuse_unsafe_files", "sha256_file", "verify_file",
    # model_package
    "ModelPackage", "VerifiedModel",
]  # fmt: skip
