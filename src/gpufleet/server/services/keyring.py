"""The server's keyring: credentials sealed at rest with AES-256-GCM.

The operator supplies the key (``GPUFLEET_SECRET_KEY``, or ``GPUFLEET_SECRET_KEY_FILE``
whose first line is the current key and whose further lines are previous keys; or
``GPUFLEET_PREVIOUS_SECRET_KEYS``): 32 random bytes, base64 (url-safe or standard). Each
ciphertext is a fresh 96-bit random nonce followed by the sealed secret and its tag, and
is stored with the id of the key that sealed it (a hash of the key, never the key). The
associated data binds a ciphertext to its row, so one moved to another row fails to open.

Nothing here logs, and no error names a secret or a key: only key ids.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpufleet.core.errors import Conflict

KEY_BYTES = 32
NONCE_BYTES = 12
GENERATE_HINT = (
    "python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'"
)
NO_KEY_MESSAGE = (
    "no secret key is configured, so the server cannot store credentials: set "
    "GPUFLEET_SECRET_KEY (32 random bytes, base64; make one with "
    f"{GENERATE_HINT}) or GPUFLEET_SECRET_KEY_FILE (a file holding it), and restart the server"
)


class KeyringError(Exception):
    """The configured key material is unusable (the message names the setting, not the key)."""


class SecretUnavailable(Conflict):
    """A ciphertext this server cannot open: its key is not configured, or the key or the
    ciphertext is wrong. The message names the key id and the row, never the secret."""

    code = "secret_unavailable"


def decode_key(text: str, *, setting: str) -> bytes:
    """32 key bytes from base64 (url-safe or standard, padding optional)."""
    value = text.strip()
    padded = value + "=" * (-len(value) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(
            f"{setting} is not base64; expected 32 random bytes, base64 (make one with "
            f"{GENERATE_HINT})"
        ) from None
    if len(raw) != KEY_BYTES:
        raise KeyringError(
            f"{setting} decodes to {len(raw)} bytes; AES-256 needs exactly {KEY_BYTES} "
            f"(make one with {GENERATE_HINT})"
        )
    return raw


def key_id_of(key: bytes) -> str:
    """A short public name for a key: safe to store, log and show."""
    return "k-" + hashlib.sha256(b"gpufleet key id\x00" + key).hexdigest()[:16]


@dataclass(frozen=True)
class Keyring:
    """The current key (seals) and previous ones (open only), by key id."""

    current_id: str | None = None
    _keys: dict[str, AESGCM] = field(default_factory=dict, repr=False)

    @classmethod
    def from_keys(cls, current: bytes | None, previous: Sequence[bytes] = ()) -> Keyring:
        keys: dict[str, AESGCM] = {}
        for key in [*previous, *([current] if current is not None else [])]:
            keys[key_id_of(key)] = AESGCM(key)
        return cls(current_id=key_id_of(current) if current is not None else None, _keys=keys)

    @classmethod
    def load(
        cls,
        *,
        secret_key: str | None,
        secret_key_file: Path | None,
        previous_keys: Sequence[str] = (),
    ) -> Keyring:
        """The keyring from the settings; empty (nothing can be stored) when none is set.

        Raises ``KeyringError`` naming the setting when a key is malformed or the file
        cannot be read: a server must not start with a key it cannot use.
        """
        current: bytes | None = None
        previous = [
            decode_key(text, setting=f"GPUFLEET_PREVIOUS_SECRET_KEYS[{i}]")
            for i, text in enumerate(previous_keys)
        ]
        if secret_key:
            current = decode_key(secret_key, setting="GPUFLEET_SECRET_KEY")
        elif secret_key_file is not None:
            try:
                lines = [
                    line.strip()
                    for line in secret_key_file.read_text().splitlines()
                    if line.strip() and not line.lstrip().startswith("#")
                ]
            except OSError as exc:
                raise KeyringError(
                    f"GPUFLEET_SECRET_KEY_FILE {secret_key_file}: cannot read it ({exc.strerror})"
                ) from None
            if not lines:
                raise KeyringError(f"GPUFLEET_SECRET_KEY_FILE {secret_key_file} holds no key")
            setting = f"GPUFLEET_SECRET_KEY_FILE {secret_key_file}"
            current = decode_key(lines[0], setting=f"{setting} line 1")
            previous += [
                decode_key(line, setting=f"{setting} key {i}")
                for i, line in enumerate(lines[1:], start=2)
            ]
        return cls.from_keys(current, previous)

    @property
    def configured(self) -> bool:
        return self.current_id is not None

    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def seal(self, secret: str, *, aad: bytes) -> tuple[str, bytes]:
        """``(key id, nonce + ciphertext)`` of ``secret`` under the current key."""
        if self.current_id is None:
            raise Conflict(NO_KEY_MESSAGE, field="secret")
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._keys[self.current_id].encrypt(nonce, secret.encode(), aad)
        return self.current_id, nonce + sealed

    def open(self, *, key_id: str, blob: bytes, aad: bytes, what: str) -> str:
        """The secret, or ``SecretUnavailable`` naming ``what`` and the key id."""
        aead = self._keys.get(key_id)
        if aead is None:
            have = ", ".join(self.key_ids()) or "none"
            raise SecretUnavailable(
                f"{what} is encrypted under key {key_id}, which this server does not have "
                f"(keys configured: {have}); add that key as GPUFLEET_SECRET_KEY or a previous "
                "key (GPUFLEET_PREVIOUS_SECRET_KEYS, or a further line of the key file)"
            )
        try:
            plain = aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
        except InvalidTag:
            raise SecretUnavailable(
                f"{what} does not decrypt with key {key_id}: the ciphertext was altered or "
                "belongs to another row; store the credential again"
            ) from None
        return plain.decode()


def credential_aad(credential_id: str) -> bytes:
    """Associated data binding a credential's ciphertext to its row."""
    return b"gpufleet credential v1\x00" + credential_id.encode()
