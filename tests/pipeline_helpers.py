"""Shared by the pipeline tests: a sink that keeps what it is given."""

from __future__ import annotations

from edge_sdk.pipelines import FrameResult


class Collect:
    """A sink callable that keeps the results."""

    def __init__(self) -> None:
        self.results: list[FrameResult] = []

    def __call__(self, fr: FrameResult) -> None:
        self.results.append(fr)

    @property
    def indices(self) -> list[int]:
        return [r.index for r in self.results]
