"""Ed25519 keys: generation, loading, public-key text and the trusted-keys file."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from mlckpt import strict
from mlckpt.bundle._common import (
    DEFAULT_PASSPHRASE_ENV,
    MAX_KEY_FILE_BYTES,
    MAX_TRUSTED_KEYS_BYTES,
    create_exclusive,
)
from mlckpt.bundle.models import KeyInfo
from mlckpt.dsse import b64decode, key_label, keyid_of, public_key_text, raw_public
from mlckpt.errors import UsageError
from mlckpt.schemas import first_error


def read_trust_file(path: Path, what: str) -> Any:
    """A committee's trust file (trusted keys, released runners) parsed strictly: at most 1 MiB,
    YAML (JSON for a ``.json`` name); a usage error naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRUSTED_KEYS_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > MAX_TRUSTED_KEYS_BYTES:
        raise UsageError(f"{path}: {what} file larger than 1 MiB")
    try:
        return strict.parse_json(data) if path.suffix.lower() == ".json" else strict.parse_yaml(data)
    except ValueError as exc:  # strict.ParseError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"{path}: cannot parse {what}: {first}") from None


def keyid_of_key(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The key id of a key (its public half's raw bytes, hashed as :func:`keyid_of` does)."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return keyid_of(raw_public(key))


def parse_public_key_text(text: object) -> bytes:
    """Raw key bytes of ``ed25519:<base64>``; ValueError saying what is wrong."""
    if not isinstance(text, str) or not text.startswith("ed25519:"):
        raise ValueError("expected 'ed25519:<base64 raw key>'")
    raw = b64decode(text[len("ed25519:") :].strip(), "public key")
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, this one {len(raw)}")
    Ed25519PublicKey.from_public_bytes(raw)
    return raw


def generate_key(path: Path, passphrase: bytes | None = None) -> KeyInfo:
    """New Ed25519 key: PKCS8 PEM at ``path`` (0600, never overwritten) and ``<path>.pub``."""
    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if os.path.lexists(p):
            raise UsageError(f"{p}: already exists; refusing to overwrite a key")
    if passphrase is not None and not passphrase:
        raise UsageError("empty passphrase; give a non-empty one or none")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # a file in the way, a read-only mount, no permission: the user's to fix
        raise UsageError(f"{path}: cannot create the key folder: {exc.strerror or exc}") from None
    key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    text = public_key_text(key)
    try:
        create_exclusive(path, pem, 0o600)
    except FileExistsError:
        raise UsageError(f"{path}: already exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the key: {exc.strerror or exc}") from None
    try:
        create_exclusive(pub_path, (text + "\n").encode("ascii"), 0o644)
    except BaseException as exc:
        os.unlink(path)
        if isinstance(exc, FileExistsError):
            raise UsageError(f"{pub_path}: already exists; refusing to overwrite a key") from None
        raise
    raw = raw_public(key)
    return KeyInfo(keyid=keyid_of(raw), public_key=text, path=path, public_path=pub_path)


def existing_key(path: Path, passphrase_env: str = DEFAULT_PASSPHRASE_ENV) -> KeyInfo | None:
    """The public facts of the key at ``path`` (None where there is none): from the private key
    where it opens, else from its ``.pub`` (an encrypted key without its passphrase).  A ``.pub``
    that is not the private key's is refused, naming both files."""
    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    if not os.path.lexists(path):
        return None
    text, raw = None, None
    if os.path.lexists(pub_path):
        try:
            text = pub_path.read_text(encoding="ascii").strip()
            raw = parse_public_key_text(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"{pub_path}: not a public key ({exc}); remove it to make it again") from None
    try:
        key = load_private_key(path, passphrase_env)
    except UsageError:
        if text is None:
            raise
        key = None  # encrypted, its passphrase not given: the .pub says which key it is
    if key is not None:
        mine = public_key_text(key)
        if text is not None and text != mine:
            raise UsageError(f"{pub_path}: not the public key of {path}; remove it to make it again")
        text, raw = mine, raw_public(key)
    assert text is not None and raw is not None
    return KeyInfo(keyid=keyid_of(raw), public_key=text, path=path,
                   public_path=pub_path if os.path.lexists(pub_path) else None)


def load_private_key(path: Path, passphrase_env: str = DEFAULT_PASSPHRASE_ENV) -> Ed25519PrivateKey:
    """Load a PEM Ed25519 private key; an encrypted one takes its passphrase from ``$passphrase_env``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such key file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read key: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise UsageError(f"{path}: too large for a key file")
    password: bytes | None = None
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data:
        value = os.environ.get(passphrase_env)
        if not value:
            raise UsageError(f"{path}: the key is encrypted; set {passphrase_env} to its passphrase")
        password = os.fsencode(value)
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except TypeError as exc:  # e.g. encrypted in a way the header test did not see
        raise UsageError(
            f"{path}: the key is encrypted; set {passphrase_env} to its passphrase ({exc})"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        if password is not None:
            raise UsageError(
                f"{path}: cannot decrypt the key with the passphrase in {passphrase_env}"
            ) from None
        raise UsageError(f"{path}: not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{path}: not an Ed25519 key ({type(key).__name__})")
    return key

@dataclass(frozen=True)
class TrustKind:
    """One strict trust-file format: its version marker, the mapping of names to keys under
    ``group``, and the schema that defines it (in the rules folder ``rules``)."""

    marker: str
    group: str
    schema: str
    rules: str
    what: str  # "organisation", "witness"
    hint: str
    plural: str


# Format 1.0 of each never changes (mlckpt/formats.py).
KEYS = TrustKind("mlckpt_trusted_keys", "organizations", "trusted-keys", "1.0", "organisation",
                 "`mlckpt keygen --org NAME` prints an entry", "organisations")
WITNESSES = TrustKind("mlckpt_trusted_witnesses", "witnesses", "trusted-witnesses", "1.4", "witness",
                      "`mlckpt witness serve` prints the entry", "witnesses")
TRUSTED_KEYS_SCHEMA_RULES = KEYS.rules


class TrustedKeys:
    """Name (an organisation, or a witness) -> Ed25519 public keys, as pinned by the committee."""

    def __init__(self, organisations: Mapping[str, Iterable[str]], *, source: str = "<mapping>",
                 kind: TrustKind = KEYS):
        self.source = source
        self._by_keyid: dict[str, tuple[str, bytes]] = {}
        self._by_org: dict[str, list[KeyInfo]] = {}
        for org, keys in organisations.items():
            if not isinstance(org, str) or not org.strip():
                raise UsageError(f"{source}: {kind.what} names must be non-empty strings: {org!r}")
            if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
                raise UsageError(f"{source}: {kind.group}.{org} must be a list of public keys")
            infos = self._by_org.setdefault(org, [])
            for i, text in enumerate(keys):
                try:
                    raw = parse_public_key_text(text)
                except ValueError as exc:
                    raise UsageError(f"{source}: {kind.group}.{org}[{i}]: {exc}") from None
                kid = keyid_of(raw)
                if kid in self._by_keyid:
                    other = self._by_keyid[kid][0]
                    if other != org:
                        raise UsageError(f"{source}: key {key_label(raw)} is registered for both {other!r} "
                                         f"and {org!r}")
                    continue
                self._by_keyid[kid] = (org, raw)
                infos.append(KeyInfo(keyid=kid, public_key=public_key_text(raw)))

    @classmethod
    def from_mapping(cls, data: object, *, source: str = "<mapping>", kind: TrustKind = KEYS) -> TrustedKeys:
        """Validate a parsed trust document against its schema, the one definition of the format
        (``rules/<kind.rules>/schemas/<kind.schema>.schema.json``); the code adds only what a
        schema cannot say (a key decodes to 32 bytes, and belongs to one name)."""
        if not isinstance(data, Mapping):
            raise UsageError(f"{source}: a {kind.schema} file must be a mapping")
        if isinstance(data.get(kind.marker), float):  # YAML reads an unquoted 1.0 as a float
            data = {**data, kind.marker: repr(data[kind.marker])}
        if data and kind.group not in data and kind.marker not in data:
            # The obvious first try: names at the top level.  Say where they go.
            first = sorted(map(str, data))[0]
            raise UsageError(f"{source}: {kind.plural} go under {kind.group}:, next to "
                             f"{kind.marker}: '1.0' (found {first!r} at the top level; {kind.hint})")
        problem = first_error(dict(data), kind.schema, kind.rules)
        if problem:
            raise UsageError(f"{source}: {problem}")
        return cls(data[kind.group], source=source, kind=kind)

    @classmethod
    def load(cls, path: Path, kind: TrustKind = KEYS) -> TrustedKeys:
        path = Path(path)
        doc = read_trust_file(path, kind.schema.replace("-", " "))
        return cls.from_mapping(doc, source=str(path), kind=kind)

    @property
    def organisations(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_org))

    def org_for(self, keyid: str) -> str | None:
        hit = self._by_keyid.get(keyid)
        return hit[0] if hit else None

    def keys_for(self, org: str) -> tuple[KeyInfo, ...]:
        return tuple(self._by_org.get(org, ()))

    def public_key_for(self, keyid: str) -> bytes | None:
        hit = self._by_keyid.get(keyid)
        return hit[1] if hit else None
