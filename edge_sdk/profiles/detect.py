"""Which profile fits this board: :func:`detect` (facts against every bundled profile's match
rules), :func:`resolve_profile` (argument > ``$EDGE_SDK_PROFILE`` > detection) and the
:class:`BoardMatch` that says why."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence, Union

from edge_sdk._record import frozen
from edge_sdk.errors import ProfileError

from .facts import HardwareFacts, read_facts
from .profile import ARCHES, ENV_VAR, DeviceProfile, RuntimeSpec, bundled_profiles, load_profile, looks_like_path

#: Values of :attr:`BoardMatch.source`.
DETECTION_SOURCES: tuple[str, ...] = ("override-arg", "override-env", "detected", "fallback")


# --------------------------------------------------------------------------- detection


def effective_memory_budget_mb(runtime: RuntimeSpec, mem_total_mb: int | None) -> int:
    """Effective model memory budget in MiB: ``min(cap, floor(fraction * MemTotal))``.

    With MemTotal unknown the cap alone applies.  Never below 1 MiB.
    """
    if mem_total_mb is None:
        return runtime.memory_budget_mb
    return max(1, min(runtime.memory_budget_mb, int(runtime.memory_budget_fraction * mem_total_mb)))


@frozen
class BoardMatch:
    """Which board matched: the profile in use and why (what :func:`resolve_profile` and :func:`detect` return).

    * ``source``: ``"override-arg"`` (given by the caller), ``"override-env"``
      (``EDGE_SDK_PROFILE``), ``"detected"`` (matched this hardware) or
      ``"fallback"`` (nothing matched; ``generic-<arch>``).
    * ``fallback``: True only for ``source == "fallback"``.
    * ``reasons``: human sentences saying what matched or why nothing did.
    * ``memory_budget_mb``: effective budget in MiB (see :func:`effective_memory_budget_mb`).
    """

    profile: DeviceProfile
    facts: HardwareFacts
    reasons: tuple[str, ...]
    source: str
    fallback: bool
    memory_budget_mb: int

    def __post_init__(self) -> None:
        if self.source not in DETECTION_SOURCES:
            raise ProfileError(f"source: expected one of {list(DETECTION_SOURCES)}, got {self.source!r}")
        if self.fallback != (self.source == "fallback"):
            raise ProfileError(f"fallback: expected {self.source == 'fallback'} for source {self.source!r}")
        object.__setattr__(self, "reasons", tuple(self.reasons))

    def explain(self) -> str:
        """A few lines for humans: profile, how it was chosen, and the budgets."""
        p, f = self.profile, self.facts
        runtime = p.runtime
        lines = [f"profile: {p.name} ({p.display_name}) [{self.source}]"]
        lines += [f"  - {reason}" for reason in self.reasons]
        lines.append(
            f"machine: {f.machine or 'unknown'}; cpu: {f.cpu_model or 'unknown'} x {f.cpu_count or '?'}; "
            f"memory: {f.mem_total_mb if f.mem_total_mb is not None else '?'} MiB"
        )
        lines.append(f"cpus: {f.cpu_budget_text()}")
        if f.machine in ("x86_64", "aarch64"):
            dot = [x for x in ("amx_int8", "avx512_vnni", "avx_vnni", "asimddp", "i8mm") if x in f.cpu_features]
            lines.append(
                f"int8 dot products: {', '.join(dot)}"
                if dot
                else "int8 dot products: none (" + ("u8s8 kernels can saturate; ONNX Runtime advises reduce_range or U8U8 here" if f.int8_saturates else "no DotProd") + ")"
            )
        if f.mem_total_mb is None:
            budget = f"{self.memory_budget_mb} MiB (cap; MemTotal unknown)"
        else:
            budget = (
                f"{self.memory_budget_mb} MiB = min(cap {runtime.memory_budget_mb} MiB, "
                f"{runtime.memory_budget_fraction:g} x MemTotal {f.mem_total_mb} MiB)"
            )
        lines.append(f"memory budget: {budget}")
        lines.append(
            f"runtime: precisions {', '.join(runtime.precisions)}; backends {', '.join(runtime.backends)}; "
            f"threads {self.threads} ({self.threads_text()})"
        )
        t = p.thermal
        lines.append(
            f"thermal: warn {t.warn_c:g} C, critical {t.critical_c:g} C, vendor throttle {t.vendor_throttle_c:g} C"
        )
        budget_w = f"{p.power.budget_w:g} W" if p.power.budget_w > 0 else "unknown"
        lines.append(f"power: sensor {p.power.sensor}, budget {budget_w}")
        return "\n".join(lines)

    @property
    def threads(self) -> int:
        """The inference threads a model gets here by default: the profile's count capped by the
        CPUs this process may use (:attr:`HardwareFacts.usable_cpus`)."""
        usable = self.facts.usable_cpus
        return min(self.profile.runtime.threads, usable) if usable else self.profile.runtime.threads

    def threads_text(self) -> str:
        """Where :attr:`threads` comes from, e.g. "the profile's 4 capped by the affinity mask: 1 usable CPU"."""
        usable = self.facts.usable_cpus
        src = "affinity mask" if self.facts.cpus_allowed is not None else "machine"
        if self.facts.cpu_quota is not None and usable is not None and usable < (self.facts.cpus_allowed or self.facts.cpu_count or usable + 1):
            src = "cgroup CPU quota"
        if usable is None or self.profile.runtime.threads <= usable:
            return f"the profile's {self.profile.runtime.threads}"
        return f"the profile's {self.profile.runtime.threads} capped by the {src}: {usable} usable CPU{'s' if usable != 1 else ''}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "threads": self.threads,
            "profile": self.profile.to_dict(),
            "facts": self.facts.to_dict(),
            "reasons": list(self.reasons),
            "source": self.source,
            "fallback": self.fallback,
            "memory_budget_mb": self.memory_budget_mb,
        }


@frozen
class _Match:
    """A profile that matched, its specificity score and why (a docstring spares dataclass an inspect.signature)."""

    profile: DeviceProfile
    score: tuple[int, int, int]
    reasons: tuple[str, ...]


def _match_profile(profile: DeviceProfile, facts: HardwareFacts) -> _Match | None:
    spec = profile.match
    reasons: list[str] = []

    model_len = 0
    if facts.device_tree_model:
        folded = facts.device_tree_model.casefold()
        hits = [s for s in spec.device_tree_model if s.casefold() in folded]
        if hits:
            best = max(hits, key=len)
            model_len = len(best)
            reasons.append(f"device-tree model {facts.device_tree_model!r} contains {best!r}")

    compat_hits = [c for c in spec.device_tree_compatible if c in facts.device_tree_compatible]
    if compat_hits:
        reasons.append(f"device-tree compatible lists {', '.join(repr(c) for c in compat_hits)}")

    release_len = 0
    if facts.nv_tegra_release:
        forms = [facts.nv_tegra_release.lstrip("#").strip()]
        if facts.l4t_release:
            forms.append(facts.l4t_release)
        hits = [prefix for prefix in spec.nv_tegra_release if any(form.startswith(prefix) for form in forms)]
        has_device_tree = bool(facts.device_tree_model or facts.device_tree_compatible)
        has_dt_patterns = bool(spec.device_tree_model or spec.device_tree_compatible)
        if hits and (not has_device_tree or not has_dt_patterns):
            best = max(hits, key=len)
            release_len = len(best)
            reasons.append(f"/etc/nv_tegra_release {facts.nv_tegra_release!r} starts with {best!r}")

    score = (model_len, len(compat_hits), release_len)
    if score == (0, 0, 0):
        return None
    return _Match(profile, score, tuple(reasons))


def _observed(facts: HardwareFacts) -> str:
    parts = [
        f"device-tree model {facts.device_tree_model!r}" if facts.device_tree_model else "no device-tree model",
        f"compatible {list(facts.device_tree_compatible)!r}" if facts.device_tree_compatible else "no compatible",
        f"nv_tegra_release {facts.nv_tegra_release!r}" if facts.nv_tegra_release else "no /etc/nv_tegra_release",
    ]
    return ", ".join(parts)


def _detect_from_facts(facts: HardwareFacts, profiles: Sequence[DeviceProfile]) -> BoardMatch:
    arch = facts.machine
    if arch is None:
        raise ProfileError("cannot tell this machine's architecture; pass machine='x86_64' or 'aarch64'")
    if arch not in ARCHES:
        raise ProfileError(
            f"unsupported machine architecture {arch!r}: edge_sdk has profiles for {', '.join(ARCHES)} only"
        )

    notes: list[str] = []
    candidates: list[_Match] = []
    for profile in profiles:
        if profile.generic:
            continue
        found = _match_profile(profile, facts)
        if found is None:
            continue
        if profile.arch != arch:
            notes.append(f"{profile.name} matched ({'; '.join(found.reasons)}) but needs {profile.arch}, not {arch}")
            continue
        candidates.append(found)

    if candidates:
        top = max(c.score for c in candidates)
        best = [c for c in candidates if c.score == top]
        # A tie is genuinely ambiguous: take the smaller power budget, the safer guess.
        best.sort(key=lambda c: (c.profile.power.budget_w or math.inf, c.profile.name))
        chosen = best[0]
        reasons = list(chosen.reasons)
        others = [c.profile.name for c in candidates if c is not chosen]
        if len(best) > 1:
            reasons.append(
                f"ambiguous: {', '.join(c.profile.name for c in best)} match equally well; chose "
                f"{chosen.profile.name} (smaller power budget); set {ENV_VAR} to override"
            )
        elif others:
            reasons.append(f"more specific than {', '.join(sorted(others))}")
        reasons.append(f"architecture {arch} matches the profile")
        reasons += notes
        return BoardMatch(
            profile=chosen.profile,
            facts=facts,
            reasons=tuple(reasons),
            source="detected",
            fallback=False,
            memory_budget_mb=effective_memory_budget_mb(chosen.profile.runtime, facts.mem_total_mb),
        )

    generic_name = f"generic-{arch}"
    generic = next((p for p in profiles if p.generic and p.name == generic_name), None)
    if generic is None:
        raise ProfileError(f"no profile matched and no {generic_name!r} fallback profile is available")
    reasons = [f"no {arch} profile matched ({_observed(facts)}); using {generic_name}", *notes]
    return BoardMatch(
        profile=generic,
        facts=facts,
        reasons=tuple(reasons),
        source="fallback",
        fallback=True,
        memory_budget_mb=effective_memory_budget_mb(generic.runtime, facts.mem_total_mb),
    )


def detect(
    root: Union[str, os.PathLike[str]] = "/",
    *,
    machine: str | None = None,
    profiles: Sequence[DeviceProfile] | None = None,
) -> BoardMatch:
    """Detect the board below ``root`` and choose its profile.

    Every non-generic profile is tried (device-tree model substring,
    compatible entry, L4T release prefix); its ``arch`` must equal the
    machine's.  The most specific match wins: the longest model substring,
    then the most compatible hits, then the longest release prefix.  Unknown
    hardware falls back to ``generic-<arch>`` with ``fallback=True``.
    ``profiles`` replaces the bundled set (for custom profile sets and tests).
    Raises ProfileError for an unknown or undeterminable architecture.
    """
    facts = read_facts(root, machine=machine)
    return _detect_from_facts(facts, bundled_profiles() if profiles is None else profiles)


def resolve_profile(
    profile: Union[DeviceProfile, str, os.PathLike[str], None] = None,
    *,
    root: Union[str, os.PathLike[str]] = "/",
    machine: str | None = None,
    env: Mapping[str, str] | None = None,
) -> BoardMatch:
    """Choose the profile to use: the argument, else ``$EDGE_SDK_PROFILE``, else :func:`detect`.

    ``profile`` may be a DeviceProfile, a bundled name or a path to a .toml
    file (source ``"override-arg"``).  ``EDGE_SDK_PROFILE`` takes a name or a
    path (source ``"override-env"``); ``env`` defaults to ``os.environ``.
    Facts are read from ``root`` in every case so the memory budget reflects
    this machine.  Raises ProfileError for an unknown name or a bad file.
    """
    facts = read_facts(root, machine=machine)
    environ = os.environ if env is None else env

    chosen: DeviceProfile
    if profile is not None:
        chosen = profile if isinstance(profile, DeviceProfile) else load_profile(profile)
        source = "override-arg"
        how = f"profile {chosen.name!r} given by the caller"
        if isinstance(profile, os.PathLike) or (isinstance(profile, str) and looks_like_path(profile)):
            how += f" (file {chosen.path})"
    elif environ.get(ENV_VAR, "").strip():
        value = environ[ENV_VAR].strip()
        try:
            chosen = load_profile(value)
        except ProfileError as exc:
            raise ProfileError(f"{ENV_VAR}={value!r}: {exc}") from exc
        source = "override-env"
        how = f"{ENV_VAR}={value!r} selects {chosen.name!r}"
    else:
        return _detect_from_facts(facts, bundled_profiles())

    reasons = [how]
    if facts.machine is not None and facts.machine != chosen.arch:
        reasons.append(f"note: profile is for {chosen.arch} but this machine is {facts.machine}")
    return BoardMatch(
        profile=chosen,
        facts=facts,
        reasons=tuple(reasons),
        source=source,
        fallback=False,
        memory_budget_mb=effective_memory_budget_mb(chosen.runtime, facts.mem_total_mb),
    )
