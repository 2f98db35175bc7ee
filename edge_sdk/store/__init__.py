"""A local model store with atomic updates, health-gated commits and rollback.

    from edge_sdk.store import ModelStore, StoreConfig
    store = ModelStore("/var/lib/models", StoreConfig(require_signatures=True, trusted_keys=(PUBKEY_HEX,)))
    result = store.install("shapes-classifier-1.2.zip")   # succeeded | rolled_back | failed_no_change
    model = store.load_active("shapes-classifier")

See :mod:`edge_sdk.store.store` for the on-disk layout, the phases and the crash semantics.
"""

from .health import HealthResult, run_health_check
from .journal import TERMINAL_STATES, Journal, UpdateRecord
from .signing import SIGNATURE_NAME, SignatureVerificationError, generate_keypair, sign_package, verify_signature
from .store import InstalledVersion, ModelStore, StoreConfig, StoreError, StoreNameError, UpdateResult, is_older, version_key

__all__ = [
    "HealthResult", "InstalledVersion", "Journal", "ModelStore", "SIGNATURE_NAME", "SignatureVerificationError", "StoreConfig",
    "StoreError", "StoreNameError", "TERMINAL_STATES", "UpdateRecord", "UpdateResult", "generate_keypair", "is_older", "run_health_check",
    "sign_package", "verify_signature", "version_key",
]  # fmt: skip
