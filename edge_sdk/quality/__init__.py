"""Quality on the device: reference statistics recorded by ``edge-convert`` and a sampled
monitor that flags drift, low confidence and schema violations, and shadow checks against a
reference (see docs/quality.md)."""

from ..package.reference_stats import Extractor, ReferenceBuilder, ReferenceStats, ReferenceStatsError, Summary, reference_from_model
from .monitor import MonitorThresholds, QualityEvent, QualityMonitor, ks_pvalue, ks_statistic, psi, quality_samples
from .shadow import ShadowChecker, ShadowError, ShadowMemoryError

__all__ = [
    "Extractor", "MonitorThresholds", "QualityEvent", "QualityMonitor", "ReferenceBuilder", "ReferenceStats", "ReferenceStatsError",
    "ShadowChecker", "ShadowError", "ShadowMemoryError", "Summary", "ks_pvalue", "ks_statistic", "psi", "quality_samples", "reference_from_model",
]  # fmt: skip
