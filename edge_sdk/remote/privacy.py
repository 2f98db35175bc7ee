"""What a model may send to a remote endpoint, checked before any byte leaves.

``PrivacyPolicy(mode, allow_inputs, regions)``:

- ``"never"`` (the default): nothing is sent -- not the inputs, and (through
  :class:`~edge_sdk.remote.session.RemoteSession`) not even a metadata request naming the model.
- ``"allowed"``: every input may be sent.
- ``"allowlist"``: only the inputs named in ``allow_inputs`` (say an embedding or a face crop,
  never the full frame); a request that would send any other input is refused whole (inputs
  are not silently dropped: the model would get a different request than the caller made).
- ``regions``: when given, the endpoint must declare a region (``RemoteClient(region=...)``)
  and it must be one of them; an endpoint that declares none is refused.

A refusal raises :class:`~edge_sdk.remote.errors.PrivacyError` naming the model and what was
refused (input names and regions, never data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..errors import OptionsError
from .errors import PrivacyError

__all__ = ["MODES", "PrivacyPolicy"]

MODES = ("never", "allowed", "allowlist")


@dataclass(frozen=True)
class PrivacyPolicy:
    """A model's offload policy (module docs). Immutable; ``PrivacyPolicy()`` sends nothing."""

    mode: str = "never"
    allow_inputs: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionsError(f"privacy mode: expected one of {list(MODES)}, got {self.mode!r}")
        for name in ("allow_inputs", "regions"):
            v = getattr(self, name)
            if isinstance(v, str) or not all(isinstance(x, str) and x for x in v):
                raise OptionsError(f"privacy {name}: expected a sequence of non-empty strings, got {v!r}")
            object.__setattr__(self, name, tuple(v))
        if self.mode == "allowlist" and not self.allow_inputs:
            raise OptionsError("privacy mode 'allowlist' needs allow_inputs (the inputs that may be sent)")
        if self.mode != "allowlist" and self.allow_inputs:
            raise OptionsError(f"privacy allow_inputs is only used with mode 'allowlist', not {self.mode!r}")

    @property
    def sends_nothing(self) -> bool:
        """True when the mode is ``never`` (the default): no request leaves the device."""
        return self.mode == "never"

    def check_endpoint(self, model: str, region: str | None) -> None:
        """Refuse an endpoint this policy does not allow (mode never, or its region)."""
        if self.mode == "never":
            raise PrivacyError(f"model {model!r}: privacy policy 'never' forbids sending anything to a remote endpoint")
        if self.regions:
            if region is None:
                raise PrivacyError(f"model {model!r}: the policy requires a region in {list(self.regions)}; the endpoint declares none")
            if region not in self.regions:
                raise PrivacyError(f"model {model!r}: endpoint region {region!r} is not one of {list(self.regions)}")

    def check(self, model: str, input_names: Iterable[str], region: str | None) -> None:
        """Refuse a request that would send anything outside this policy."""
        self.check_endpoint(model, region)
        if self.mode == "allowlist":
            names = list(input_names)
            extra = sorted(n for n in names if n not in self.allow_inputs)
            if extra:
                raise PrivacyError(f"model {model!r}: input(s) {extra} may not leave the device (allowlist {list(self.allow_inputs)})")
