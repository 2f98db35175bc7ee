"""A remote server as an edge_sdk backend: :class:`RemoteSession` and :func:`remote_model`.

::

    client = RemoteClient("https://infer.example:8443", token=..., region="eu-west")
    with remote_model("shapes-classifier/", client, privacy=PrivacyPolicy("allowed")) as model:
        model.predict_image("circle.png").top1      # validated and decoded exactly like a local model

The manifest stays the contract: the session's inputs and outputs are the manifest's
TensorSpecs (of the chosen variant), ``Model`` validates the inputs locally (dtype, shape,
bounds, finite) and decodes the outputs with the manifest's decoder, and every answer is
checked against the declared outputs (datatype, and shape with dynamic dims bound to the
inputs' sizes) before it is returned.

Before the first offload the session checks the server's model metadata against the manifest
(:func:`check_compatible`) -- after the privacy policy allowed the endpoint, so a model whose
policy is "never" sends nothing at all, not even its name.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Mapping

import numpy as np

from ..backends.base import Session, SessionInfo, TensorInfo
from ..errors import OptionsTypeError, SelectionError
from ..model import LoadOptions, Model
from ..package import Manifest, ModelPackage, TensorSpec, Variant, default_cache_dir
from ..profiles import DeviceProfile, resolve_profile
from ..selection import Candidate, Selection
from . import protocol
from .client import ModelMetadata, RemoteClient, TensorMetadata
from .errors import CircuitOpenError, RemoteError, RemoteIncompatibleError, RemoteRejectedError, RemoteUnavailableError
from .privacy import PrivacyPolicy

__all__ = ["RemoteSession", "check_compatible", "remote_model"]

BACKEND = "remote"
RUNTIME = "kserve-v2"


def _v2(spec: TensorSpec) -> str:
    return protocol.datatype_of(np.dtype(spec.dtype))


def _shape_problems(kind: str, spec: TensorSpec, server: TensorMetadata) -> list[str]:
    where = f"{kind} {spec.name!r}"
    if len(spec.shape) != len(server.shape):
        return [f"{where} rank: manifest {len(spec.shape)} {list(spec.shape)}, server {len(server.shape)} {list(server.shape)}"]
    out = []
    for ax, (md, sd) in enumerate(zip(spec.shape, server.shape)):
        if sd == -1:
            continue  # the server takes any size here
        if isinstance(md, int):
            if md != sd:
                out.append(f"{where} dim {ax}: manifest {md}, server {sd}")
        elif kind == "input":
            b = spec.bounds(md)
            if b is not None and b != (sd, sd):
                out.append(f"{where} dim {ax}: manifest says dynamic {md} in {list(b)}, server fixes it at {sd}")
    return out


def _no_versioned_routes(e: RemoteError) -> bool:
    """The answer of a server without ``/versions/{v}`` routes to one: a 4xx refusal (404, 405,
    400, ...) or 501 Not Implemented."""
    if isinstance(e, RemoteRejectedError):
        return True
    return type(e) is RemoteUnavailableError and not isinstance(e, CircuitOpenError) and e.status == 501


def check_compatible(
    client: RemoteClient,
    manifest: Manifest,
    variant: Variant | None = None,
    *,
    deadline_s: float | None = None,
) -> ModelMetadata:
    """Check that the server serves ``manifest``'s model as declared (for ``variant``'s specs,
    default the reference variant): its name; the manifest version among the server's
    ``versions``; the same
    input names, every manifest output, and for each the v2 datatype and a compatible shape
    (same rank; a fixed dim equal; a server ``-1`` matches anything; a server-fixed dim
    against a dynamic manifest input dim only when its bounds are exactly that size).

    A server that lists no versions is asked the versioned metadata path; when it refuses that
    route (a 4xx, or 501 Not Implemented: third-party servers without versioned routes), the
    client is told to use unversioned routes for this model from now on
    (:meth:`RemoteClient.use_unversioned`) -- such a server cannot say which version it serves.

    Returns the server's metadata; raises :class:`RemoteIncompatibleError` naming every
    difference, or the client's errors when the server cannot be asked."""
    v = variant or manifest.reference_variant
    name, version = manifest.name, manifest.version
    t_end = time.monotonic() + (client.deadline_s if deadline_s is None else deadline_s)
    meta = client.model_metadata(name, deadline_s=deadline_s)
    problems: list[str] = []
    if meta.name != name:
        problems.append(f"name: manifest {name!r}, server {meta.name!r}")
    if meta.versions:
        if version not in meta.versions:
            problems.append(f"version: manifest {version!r} is not among the server's {list(meta.versions)}")
    elif client.serves_versions(name):
        try:
            client.model_metadata(name, version, deadline_s=max(1e-3, t_end - time.monotonic()))
        except (RemoteRejectedError, RemoteUnavailableError) as e:
            if not _no_versioned_routes(e):
                raise
            # lists no versions and has no versioned routes (404/405/400, or 501): unversioned from now on
            client.use_unversioned(name)
    for kind, specs, served, exact in (
        ("input", manifest.inputs_for(v), meta.inputs, True),
        ("output", manifest.outputs_for(v), meta.outputs, False),
    ):
        by_name = {t.name: t for t in served}
        if not served:
            problems.append(f"{kind}s: the server declares none, so they cannot be checked")
            continue
        missing = [s.name for s in specs if s.name not in by_name]
        extra = sorted(set(by_name) - {s.name for s in specs}) if exact else []
        if missing:
            problems.append(f"{kind}s {missing} of the manifest are not served (server has {sorted(by_name)})")
        if extra:
            problems.append(f"server {kind}s {extra} are not in the manifest")
        for s in specs:
            t = by_name.get(s.name)
            if t is None:
                continue
            if t.datatype != _v2(s):
                problems.append(f"{kind} {s.name!r} datatype: manifest {s.dtype} ({_v2(s)}), server {t.datatype}")
            problems += _shape_problems(kind, s, t)
    if problems:
        raise RemoteIncompatibleError(f"{client.endpoint.url}: model {name!r} {version}: " + "; ".join(problems))
    return meta


class RemoteSession(Session):
    """An edge_sdk :class:`~edge_sdk.backends.base.Session` whose ``run`` is ``client.infer``
    for one model of a package (module docs). Thread-safe. ``close()`` does not close the
    client (it may serve other sessions).

    ``privacy``: the model's :class:`PrivacyPolicy` (checked on every run, before anything
    is sent). ``check``: run :func:`check_compatible` before the first offload.
    ``deadline_s``: per run (default the client's); the first run's metadata check shares it.
    ``versioned``: address ``/versions/{manifest version}`` (default) or the unversioned path.
    """

    def __init__(
        self,
        client: RemoteClient,
        manifest: Manifest,
        variant: Variant | None = None,
        *,
        privacy: PrivacyPolicy,
        deadline_s: float | None = None,
        check: bool = True,
        versioned: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(privacy, PrivacyPolicy):
            raise OptionsTypeError(f"privacy: expected a PrivacyPolicy, got {type(privacy).__name__}")
        self.client = client
        self.manifest = manifest
        self.variant = variant or manifest.reference_variant
        self.privacy = privacy
        self.deadline_s = deadline_s
        self.model_name = manifest.name
        self.model_version = manifest.version if versioned else None
        self._in_specs = manifest.inputs_for(self.variant)
        self._out_specs = manifest.outputs_for(self.variant)
        self._out_names = [s.name for s in self._out_specs]
        self.inputs = tuple(TensorInfo(s.name, s.dtype, tuple(s.shape)) for s in self._in_specs)
        self.outputs = tuple(TensorInfo(s.name, s.dtype, tuple(s.shape)) for s in self._out_specs)
        self.info = SessionInfo(
            backend=BACKEND,
            runtime=RUNTIME,
            runtime_version="2",
            threads=1,
            notes=(f"endpoint {client.endpoint.url}", f"privacy {privacy.mode}"),
        )
        self._checked = not check
        self._check_lock = threading.Lock()
        self.metadata: ModelMetadata | None = None

    def _ensure_checked(self, deadline_s: float | None) -> None:
        if self._checked:
            return
        with self._check_lock:
            if self._checked:
                return
            meta = check_compatible(self.client, self.manifest, self.variant, deadline_s=deadline_s)
            self.metadata = meta
            self.info = replace(self.info, notes=self.info.notes + (f"server model {meta.name!r} platform {meta.platform or '?'}",))
            self._checked = True

    def _expected(self, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[str, list[int | None]]]:
        dims: dict[str, int] = {}
        for s in self._in_specs:
            arr = feeds.get(s.name)
            if arr is not None and arr.ndim == len(s.shape):
                for d, n in zip(s.shape, arr.shape):
                    if isinstance(d, str):
                        dims.setdefault(d, int(n))
        return {s.name: (_v2(s), [d if isinstance(d, int) else dims.get(d) for d in s.shape]) for s in self._out_specs}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check_open()
        self.privacy.check(self.model_name, feeds.keys(), self.client.region)
        t0 = time.monotonic()
        budget = self.client.deadline_s if self.deadline_s is None else self.deadline_s
        self._ensure_checked(budget)
        left = max(1e-3, budget - (time.monotonic() - t0))
        resp = self.client.infer(
            self.model_name,
            feeds,
            version=self.model_version,
            outputs=self._out_names,
            expected=self._expected(feeds),
            privacy=self.privacy,
            deadline_s=left,
        )
        return {n: resp.outputs[n] for n in self._out_names}

    def _release(self) -> None:
        pass  # the client is shared; its owner closes it


def remote_model(
    package_or_path: str | os.PathLike[str] | ModelPackage,
    client: RemoteClient,
    *,
    privacy: PrivacyPolicy,
    profile: str | os.PathLike[str] | DeviceProfile | None = None,
    variant: str | None = None,
    deadline_s: float | None = None,
    check: bool = True,
    root: str = "/",
) -> Model:
    """An edge_sdk :class:`~edge_sdk.model.Model` over a :class:`RemoteSession`.

    The package is opened and verified like ``edge_sdk.load`` does; ``profile`` is resolved
    the same way (it only feeds ``model.detection``/``describe()``). ``variant``: whose
    input/output specs the server is expected to serve (default: the reference variant, the
    one a server normally runs). ``model.selection`` has one candidate, backend ``remote``.
    Nothing is sent until the first predict (then the metadata check, then the request)."""
    pkg = (
        package_or_path if isinstance(package_or_path, ModelPackage) else ModelPackage.open(package_or_path, cache_dir=default_cache_dir())
    )
    m = pkg.manifest
    if variant is not None:
        try:
            v = m.variant(variant)
        except KeyError:
            raise SelectionError(f"variant {variant!r} is not in package {m.name}; it has {[x.id for x in m.variants]}") from None
    else:
        v = m.reference_variant
    detection = resolve_profile(profile, root=root)
    how = "forced" if variant is not None else "reference variant"
    cand = Candidate(v.id, BACKEND, v.precision, True, (f"served by {client.endpoint.url} (Open Inference Protocol, {how})",), (0, 0))
    selection = Selection(cand, (cand,), detection.profile.name, forced=variant is not None)
    session = RemoteSession(client, m, v, privacy=privacy, deadline_s=deadline_s, check=check)
    return Model(pkg, v, session, selection, detection, LoadOptions(variant=v.id, measure_backends=False, root=root))
