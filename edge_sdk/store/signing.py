"""Package signatures: Ed25519 over the sha256 of ``edge-model.toml``.

A signed package carries ``edge-model.sig`` next to its manifest: one line,
the 64-byte Ed25519 signature in hex, computed over the 32 raw bytes of the
manifest's sha256. The manifest covers every other file by digest, so the
signature covers the whole package. Public keys are 32 raw bytes, written as
64 hex digits in the store config (``trusted_keys``). Needs the ``cryptography``
package (``pip install edge-sdk[signing]``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import MissingDependencyError, ModelPackageError
from ..package import MANIFEST_NAME

if TYPE_CHECKING:
    from types import ModuleType

SIGNATURE_NAME = "edge-model.sig"


class SignatureVerificationError(ModelPackageError):
    """A package's signature is missing where required, malformed, or not made by a trusted key."""


def _ed25519() -> ModuleType:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:  # pragma: no cover - the signing extra is installed in tests
        raise MissingDependencyError("package signatures need the 'cryptography' package: pip install edge-sdk[signing]") from e
    return ed25519


def generate_keypair() -> tuple[str, str]:
    """A new (private key hex, public key hex) pair, 32 raw bytes each."""
    from cryptography.hazmat.primitives import serialization

    key = _ed25519().Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return priv.hex(), pub.hex()


def manifest_digest(package_root: Path) -> bytes:
    """sha256 (raw bytes) of the package's ``edge-model.toml``: what a signature signs."""
    return hashlib.sha256((Path(package_root) / MANIFEST_NAME).read_bytes()).digest()


def sign_package(package_root: str | Path, private_key_hex: str) -> Path:
    """Write ``edge-model.sig`` into a package folder; returns its path."""
    key = _ed25519().Ed25519PrivateKey.from_private_bytes(bytes.fromhex(private_key_hex))
    sig = key.sign(manifest_digest(Path(package_root)))
    out = Path(package_root) / SIGNATURE_NAME
    out.write_text(sig.hex() + "\n")
    return out


def verify_signature(package_root: Path, trusted_keys: tuple[str, ...], *, required: bool) -> str | None:
    """The hex public key that signed the package, or None when it is unsigned
    and signatures are not ``required``. Raises SignatureVerificationError."""
    sig_path = Path(package_root) / SIGNATURE_NAME
    if not sig_path.is_file():
        if required:
            raise SignatureVerificationError("package is unsigned and this store requires signatures")
        return None
    try:
        sig = bytes.fromhex(sig_path.read_text().strip())
    except ValueError as e:
        raise SignatureVerificationError(f"{SIGNATURE_NAME}: not hex: {e}") from e
    if len(sig) != 64:
        raise SignatureVerificationError(f"{SIGNATURE_NAME}: an Ed25519 signature is 64 bytes, got {len(sig)}")
    if not trusted_keys:
        raise SignatureVerificationError("package is signed but the store trusts no keys (set trusted_keys in store.toml)")
    from cryptography.exceptions import InvalidSignature

    digest = manifest_digest(Path(package_root))
    ed = _ed25519()
    for k in trusted_keys:
        try:
            ed.Ed25519PublicKey.from_public_bytes(bytes.fromhex(k)).verify(sig, digest)
            return k
        except (InvalidSignature, ValueError):
            continue
    raise SignatureVerificationError("signature does not verify with any trusted key (wrong key or tampered manifest)")
