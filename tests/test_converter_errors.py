"""One error tree for ``converters``: every exception class any converter module defines derives
from :class:`converters.errors.ConverterError`, and ``edge-convert`` turns each of them into one
``edge-convert: <class>: <message>`` line and exit status 1, never a traceback."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, mlp_onnx

import converters
from converters import cli
from converters.errors import ConverterError


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined (not imported) in a module of the converters package, nested classes included."""
    found: dict[str, type[BaseException]] = {}

    def visit(obj: type, module: str) -> None:
        for member in vars(obj).values():
            if inspect.isclass(member) and member.__module__ == module:
                if issubclass(member, BaseException) and not issubclass(member, Warning):
                    found[f"{module}.{member.__qualname__}"] = member
                visit(member, module)

    names = ["converters", *(info.name for info in pkgutil.walk_packages(converters.__path__, prefix="converters."))]
    for name in names:
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if inspect.isclass(obj) and obj.__module__ == name:
                if issubclass(obj, BaseException) and not issubclass(obj, Warning):
                    found[f"{name}.{obj.__qualname__}"] = obj
                visit(obj, name)
    return [found[k] for k in sorted(found)]


ERRORS = _exception_classes()


def test_every_converter_exception_derives_from_converter_error() -> None:
    names = {f"{c.__module__}.{c.__qualname__}" for c in ERRORS}
    # the walk really finds the modules' classes (these eight existed before ConverterError)
    assert {
        "converters.calibration.CalibrationError", "converters.calibration_quality.CalibrationQualityError",
        "converters.inspect_model.InspectError", "converters.packaging.SignatureError", "converters.pipeline.ConvertError",
        "converters.quantize.QuantizeError", "converters.tflite_writer.TFLiteBuildError", "converters.validate.ValidationError",
    } <= names, names  # fmt: skip
    outside = [f"{c.__module__}.{c.__qualname__}" for c in ERRORS if not issubclass(c, ConverterError)]
    assert not outside, f"exception classes outside the ConverterError tree: {outside}"
    # ValueError stays a base, so no `except ValueError` around converter calls stops matching
    assert [c.__name__ for c in ERRORS if c is not ConverterError and not issubclass(c, ValueError)] == []


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_edge_convert_reports_every_converter_error_in_one_line(
    cls: type[Exception], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI catches the base class, so none can be left out of a list (before, SignatureError,
    TFLiteBuildError and CalibrationQualityError were, and escaped as tracebacks)."""

    # an error that carries fields is built with them (the translator's names the op and its index)
    err = cls("FANCY_OP", 3) if cls.__name__ == "UnsupportedOpError" else cls("what was expected, what was found")

    def boom(*_a: object, **_k: object) -> None:
        raise err

    monkeypatch.setattr("converters.inspect_model.inspect_model", boom)  # cmd_inspect imports it from there when run
    assert cli.main(["inspect", "model.onnx"]) == 1
    assert capsys.readouterr().err == f"edge-convert: {cls.__name__}: {err}\n"


def test_a_signature_error_from_bad_input_is_one_line_in_a_subprocess(tmp_path: Path) -> None:
    """--preprocess on a model with no image input: packaging raises SignatureError for real, the
    pipeline names it as a ConvertError, and the process prints one line and exits 1."""
    (tmp_path / "mlp.onnx").write_bytes(mlp_onnx())
    p = subprocess.run(
        [sys.executable, "-m", "converters.cli", "quantize", "mlp.onnx", "--calibration", "none.npy", "--out", "pkg",
         "--preprocess", "size=8x8", "--dim", "batch=1:4", "--quiet"],
        capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert p.stderr == "edge-convert: ConvertError: --preprocess was given but no input is an NCHW/NHWC image with 1 or 3 channels\n"
    assert not (tmp_path / "pkg").exists()
