"""Remote inference over the Open Inference Protocol (KServe v2 REST).

- :mod:`edge_sdk.remote.protocol`: messages, tensors (JSON and the binary extension), routes and
  errors -- shared by the client and ``edge-sdk serve`` (:mod:`edge_sdk.serve`).
- :mod:`edge_sdk.remote.client`: :class:`RemoteClient` (health, metadata, infer; timeouts and a
  per-request deadline, retries inside a retry budget, ``Retry-After``, TLS with optional pinning,
  binary/JSON negotiation), with :mod:`~edge_sdk.remote.retry`, :mod:`~edge_sdk.remote.breaker`
  (circuit breaker) and :mod:`~edge_sdk.remote.privacy` (what may leave the device).
- :mod:`edge_sdk.remote.session`: :class:`RemoteSession`, a backend session over the client, and
  :func:`remote_model`, an edge_sdk Model that validates and decodes like a local one.
- :mod:`edge_sdk.remote.router`: :class:`Router`, local first, offload when local capacity is
  exceeded; every result says where it was served and why.
- :mod:`edge_sdk.remote.errors`: the ``RemoteError`` tree.
"""
