"""Remote inference over the Open Inference Protocol (KServe v2 REST).

- :mod:`edge_sdk.remote.protocol`: messages, tensors (JSON and the binary extension), routes and
  errors -- shared by the client and ``edge-sdk serve``.
"""
