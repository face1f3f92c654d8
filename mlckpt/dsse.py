"""DSSE v1 envelopes (secure-systems-lab/dsse) as mlckpt writes and reads them: one Ed25519
signature over the pre-authentication encoding of the payload, with the signing key embedded beside
its id (the sha256 of the raw key).

A bundle's ``bundle.dsse.json`` holds its in-toto statement in one; the witness signs its receipts
and transcripts in one, and rank 0 signs its open request in one.  What goes wrong is an
:class:`~mlckpt.errors.EnvelopeError` whose ``kind`` is set here, where it is raised.  Whether the
key is trusted is the caller's question.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from mlckpt import strict
from mlckpt.errors import EnvelopeError

HEX64 = re.compile(r"[0-9a-f]{64}")
FIELDS = ("payloadType", "payload", "signatures")


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: object, what: str) -> bytes:
    """Strict standard base64 (padding required, no whitespace); ValueError naming ``what``."""
    if not isinstance(text, str):
        raise ValueError(f"{what} is not a string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64") from None


def canonical_json(obj: object) -> bytes:
    """Deterministic serialisation: sorted keys, compact, UTF-8, no NaN/Infinity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def raw_public(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of a key's public half."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def keyid_of(raw_public_key: bytes) -> str:
    """sha256 hex of the raw 32-byte Ed25519 public key."""
    return hashlib.sha256(raw_public_key).hexdigest()


def fingerprint(raw_public_key: bytes) -> str:
    """A key's short form for eyes and grep: the first 16 hex digits of its key id, which is how
    the ``keyid`` in an envelope begins."""
    return keyid_of(raw_public_key)[:16]


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey | bytes) -> str:
    """``ed25519:<base64 raw key>``: the one-line form used in ``.pub`` and trusted-keys files."""
    return "ed25519:" + b64encode(key if isinstance(key, bytes) else raw_public(key))


def key_label(raw_public_key: bytes) -> str:
    """How every message names a key: its ``ed25519:<base64>`` text, as written in ``.pub`` and
    trusted-keys files, and its fingerprint."""
    return f"{public_key_text(raw_public_key)} (fingerprint {fingerprint(raw_public_key)})"


def seal(payload: bytes, key: Ed25519PrivateKey, payload_type: str) -> dict[str, object]:
    """``payload`` signed by ``key`` into an envelope of ``payload_type``."""
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError(f"expected an Ed25519PrivateKey, got {type(key).__name__}")
    raw = raw_public(key)
    return {
        "payloadType": payload_type,
        "payload": b64encode(payload),
        "signatures": [
            {"keyid": keyid_of(raw), "sig": b64encode(key.sign(pae(payload_type, payload))),
             "public_key": b64encode(raw)}
        ],
    }


@dataclass(frozen=True)
class Envelope:
    """A parsed envelope; nothing in it is authenticated until :meth:`verify` returns."""

    payload_type: str
    payload: bytes
    keyid: str
    sig: bytes
    public_key: bytes  # raw, embedded; its id is ``keyid``

    def verify(self, key: bytes | None = None, *, what: str = "the document") -> None:
        """The signature holds under ``key`` (raw; the embedded key by default), or
        EnvelopeError(SIGNATURE) saying that ``what`` or the signature was altered."""
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key if key is None else key).verify(
                self.sig, pae(self.payload_type, self.payload))
        except (InvalidSignature, ValueError):
            raise EnvelopeError(f"bad signature by key {key_label(self.public_key)}: {what} or the "
                                "signature was altered", EnvelopeError.SIGNATURE) from None

    def document(self) -> object:
        """The payload, strictly parsed as JSON; EnvelopeError(PAYLOAD) when it is not."""
        try:
            return strict.parse_json(self.payload)
        except ValueError as exc:  # strict.ParseError
            raise EnvelopeError(f"the signed payload is not valid JSON ({exc})",
                                EnvelopeError.PAYLOAD) from None


def parse(data: bytes, payload_type: str) -> Envelope:
    """Strict structural parse of an envelope of ``payload_type``; verifies nothing.
    EnvelopeError(MALFORMED) saying what is wrong."""
    try:
        return _parse(data, payload_type)
    except ValueError as exc:  # strict.ParseError, or one of the checks below
        raise EnvelopeError(str(exc), EnvelopeError.MALFORMED) from None


def open_signed(data: bytes, payload_type: str) -> tuple[Any, str, str]:
    """An envelope's document after its signature is checked against the key it embeds, with that
    key's id and text.  EnvelopeError of the kind that failed."""
    env = parse(data, payload_type)
    env.verify()
    return env.document(), env.keyid, public_key_text(env.public_key)


def _parse(data: bytes, payload_type: str) -> Envelope:
    try:
        env = strict.parse_json(data)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc}); truncated or corrupted?") from None
    if not isinstance(env, dict):
        raise ValueError("not a JSON object")
    if set(env) != set(FIELDS):
        extra = ", ".join(map(repr, sorted(set(env) - set(FIELDS))))
        missing = ", ".join(sorted(set(FIELDS) - set(env)))
        parts = (missing and f"missing {missing}", extra and f"unexpected {extra}")
        detail = "; ".join(p for p in parts if p)
        raise ValueError(f"envelope fields must be exactly payloadType, payload, signatures ({detail})")
    if env["payloadType"] != payload_type:
        raise ValueError(f"payloadType must be {payload_type!r}, got {env['payloadType']!r:.80}")
    payload = b64decode(env["payload"], "payload")
    sigs = env["signatures"]
    if not isinstance(sigs, list) or len(sigs) != 1:
        raise ValueError("signatures must be a list of exactly one signature (format 1.0)")
    entry = sigs[0]
    if not isinstance(entry, dict) or set(entry) != {"keyid", "sig", "public_key"}:
        raise ValueError("the signature entry must have exactly keyid, sig and public_key")
    keyid = entry["keyid"]
    if not isinstance(keyid, str) or not HEX64.fullmatch(keyid):
        raise ValueError("keyid must be 64 lowercase hex digits")
    sig = b64decode(entry["sig"], "sig")
    if len(sig) != 64:
        raise ValueError(f"an Ed25519 signature has 64 bytes, this one {len(sig)}")
    pub = b64decode(entry["public_key"], "public_key")
    if len(pub) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, this one {len(pub)}")
    if keyid_of(pub) != keyid:
        raise ValueError("keyid is not the sha256 of the embedded public key")
    return Envelope(payload_type=payload_type, payload=payload, keyid=keyid, sig=sig, public_key=pub)
