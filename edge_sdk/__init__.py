"""edge_sdk: run machine-learning models on edge devices.

    import edge_sdk
    with edge_sdk.load("shapes-classifier/") as model:
        print(model.selection.explain())
        result = model.predict_image("circle.png")
        print(result.top1, result.timings)

Nothing happens at import time: no runtime is imported and no device probed
until you call a function that needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import errors
from ._lazy import lazy_getattr
from ._version import __version__
from .errors import EdgeSDKError

# Lazy attributes keep `import edge_sdk` cheap (numpy-only modules load on use).
_LAZY = {
    "load": "model",
    "load_model": "model",
    "load_decoder": "model",
    "DecoderModel": "generation.decoder",
    "GenerationResult": "generation.results",
    "LoadOptions": "model",
    "Model": "model",
    "Result": "model",
    "PreparedImage": "model",
    "InferredImage": "model",
    "Timings": "model",
    "Stream": "model",
    "ModelPackage": "package",
    "Manifest": "package",
    "Classification": "processing.decoders",
    "detect": "profiles",
    "load_profile": "profiles",
    "list_profiles": "profiles",
    "resolve_profile": "profiles",
    "DeviceProfile": "profiles",
    "Selection": "selection",
    "demo_package_path": "assets",
}

if TYPE_CHECKING:  # pragma: no cover
    from .assets import demo_package_path
    from .generation.decoder import DecoderModel
    from .generation.results import GenerationResult
    from .model import InferredImage, LoadOptions, Model, PreparedImage, Result, Stream, Timings, load, load_decoder, load_model
    from .package import Manifest, ModelPackage
    from .processing.decoders import Classification
    from .profiles import DeviceProfile, detect, list_profiles, load_profile, resolve_profile
    from .selection import Selection


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["EdgeSDKError", "errors", "__version__", *_LAZY]
