"""One exception tree for edge_sdk, grouped by cause.

Every error the SDK raises on purpose derives from :class:`EdgeSDKError`.
Foreign exceptions (from ONNX Runtime, LiteRT, zipfile, ...) are translated at
the seam that calls them and chained with ``raise ... from``.  Messages say
what was expected and what was found.
"""

from __future__ import annotations


class EdgeSDKError(Exception):
    """Base of every error edge_sdk raises on purpose."""


# --- device profiles -------------------------------------------------------


class ProfileError(EdgeSDKError):
    """A device profile is unknown, unreadable or malformed."""


# --- model packages --------------------------------------------------------


class ModelPackageError(EdgeSDKError):
    """A model package cannot be used."""


class ManifestError(ModelPackageError):
    """The manifest is missing, unparsable, or a field has the wrong type/value."""


class IntegrityError(ModelPackageError):
    """A file's sha256 or size does not match what the manifest declares."""


class UnsafePackageError(ModelPackageError):
    """The package tries to reach outside itself or carries executable content.

    Raised for absolute paths, ``..`` components, symlinks that leave the
    package, archive members that would extract outside the target, ONNX
    external data outside the package or not covered by a digest, and pickles.
    """


class ModelFormatError(ModelPackageError):
    """A model file is not what its variant says it is (truncated, random bytes,
    TFLite bytes named ``.onnx`` ...)."""


class SignatureMismatchError(ModelPackageError):
    """The manifest's inputs/outputs disagree with the model's own signature."""


# --- selection and backends --------------------------------------------------


class SelectionError(EdgeSDKError):
    """No variant of the package can run on this device/profile, or a forced
    variant does not exist."""


class BackendError(EdgeSDKError):
    """A runtime backend failed."""


class BackendUnavailableError(BackendError):
    """The runtime a variant needs is not installed; the message names the extra."""


class SessionError(BackendError):
    """The runtime failed while creating a session or running a call."""


class SessionClosedError(BackendError, RuntimeError):
    """A call was made on a session or model after ``close()``."""


class ResultCacheError(EdgeSDKError, ValueError):
    """A result cache was asked for a model whose output is not a function of its input alone
    (stateful manifest, streaming session); the message says why."""


# --- options -------------------------------------------------------------------


class OptionsError(EdgeSDKError, ValueError):
    """A setting given to the SDK is out of range or not one of the accepted values.

    Raised for an ``*Options``/``*Policy``/``Budget``/``Thresholds`` field, or an
    argument that configures behaviour (a rate, size, threshold, mode, a name from
    a fixed set), when it is checked (usually on construction). The message names
    the option, what was expected and what was got.
    """


class OptionsTypeError(OptionsError, TypeError):
    """An option has the wrong type (a str where a number goes, a non-callable callback)."""


# --- inputs --------------------------------------------------------------------


class InputError(EdgeSDKError, ValueError):
    """An input given to ``predict`` does not match the model's declared input."""


class MissingInputError(InputError):
    """A declared input was not given."""


class UnexpectedInputError(InputError):
    """An input was given that the model does not declare."""


class InputTypeError(InputError, TypeError):
    """The input is not a numpy array (or a mapping of them)."""


class InputDTypeError(InputError):
    """The array's dtype differs from the declared dtype; nothing is cast."""


class InputShapeError(InputError):
    """Rank, a fixed dimension, or a bounded dynamic dimension is wrong."""


class NonFiniteInputError(InputError):
    """A floating-point input holds NaN or Inf."""


class NonContiguousInputError(InputError):
    """The array is not C-contiguous; pass ``np.ascontiguousarray(x)``."""


class ImageError(InputError):
    """An image could not be read or has an unsupported shape/dtype."""


# --- environment -----------------------------------------------------------------


class MissingDependencyError(EdgeSDKError, ImportError):
    """An optional dependency is needed; the message names the extra to install."""


# --- generation (decoder packages) ----------------------------------------------


class GenerationError(EdgeSDKError):
    """Text generation cannot go on (a decoder package's model, tokenizer or template is unusable)."""


class TokenizerError(GenerationError):
    """A tokenizer is unreadable, or its vocabulary does not match the model's (the message gives both sizes)."""


class TemplateError(GenerationError):
    """A chat template failed to compile or render, or tried to leave its sandbox (templates in a package are untrusted)."""


class PromptError(GenerationError, InputError):
    """A prompt or message list is malformed: not str, invalid UTF-8, control bytes, a message without a role."""


class ContextBudgetError(GenerationError, InputError):
    """A prompt (plus the tokens asked for) does not fit the KV budget; the message names tokens vs budget.
    Nothing is truncated unless truncation was asked for."""


class SamplingError(OptionsError):
    """A sampling parameter is out of range (temperature < 0, top_p outside (0, 1], ...)."""


class GenerationBusyError(GenerationError):
    """The generation engine's queue is full (or its KV budget is held by running streams and the
    queue is full); ``retry_after_s`` estimates when it will have room. Servers answer 503/429 with it."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
