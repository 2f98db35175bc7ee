"""Data that ships inside the wheel: the demo model package and its sample images.

The demo package ``shapes-classifier`` is trained by ``tools/fixtures/train_demo.py``
on shapes that script draws; its outputs are committed here.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def demo_package_path() -> Path:
    """Folder of the bundled ``shapes-classifier`` model package."""
    return _HERE / "shapes-classifier"


def demo_samples() -> list[Path]:
    """The bundled sample images (PNG), named ``<label>_<n>.png``."""
    return sorted((_HERE / "samples").glob("*.png"))
