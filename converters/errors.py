"""The base of every error the converters raise on purpose.

Each converter module keeps its own error class next to the code that raises it
(:class:`~converters.pipeline.ConvertError`, :class:`~converters.calibration.CalibrationError`,
:class:`~converters.quantize.QuantizeError`, :class:`~converters.validate.ValidationError`,
:class:`~converters.calibration_quality.CalibrationQualityError`,
:class:`~converters.inspect_model.InspectError`, :class:`~converters.packaging.SignatureError`,
:class:`~converters.tflite_writer.TFLiteBuildError`); all derive from :class:`ConverterError`
(and from ``ValueError``, as before), and it from the SDK's :class:`~edge_sdk.errors.EdgeSDKError`, so ``edge-convert`` catches one class and a new error
cannot be left out of its list.
"""

from __future__ import annotations

from edge_sdk.errors import EdgeSDKError

__all__ = ["ConverterError"]


class ConverterError(EdgeSDKError):
    """Base of every error ``converters`` raises on purpose (an :class:`~edge_sdk.errors.EdgeSDKError`, so one
    ``except EdgeSDKError`` covers the SDK and its converter); ``edge-convert`` prints it as one
    ``edge-convert: <class>: <message>`` line and exits 1."""
