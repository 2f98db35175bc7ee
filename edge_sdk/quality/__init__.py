"""Quality on the device: reference statistics recorded by ``edge-convert`` and a sampled
monitor that flags drift, low confidence and schema violations (see docs/quality.md)."""

from .monitor import MonitorThresholds, QualityEvent, QualityMonitor, ks_pvalue, ks_statistic, psi, quality_samples
from .reference import Extractor, ReferenceBuilder, ReferenceStats, ReferenceStatsError, Summary, reference_from_model

__all__ = [
    "Extractor", "MonitorThresholds", "QualityEvent", "QualityMonitor", "ReferenceBuilder", "ReferenceStats", "ReferenceStatsError",
    "Summary", "ks_pvalue", "ks_statistic", "psi", "quality_samples", "reference_from_model",
]  # fmt: skip
