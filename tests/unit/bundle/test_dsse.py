"""DSSE envelopes (mlckpt/dsse.py): what is refused, and the kind each refusal carries."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from mlckpt import dsse
from mlckpt.errors import EnvelopeError, IntegrityError

TYPE = "application/vnd.example+json"
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def sealed(doc: object = None, payload: bytes | None = None) -> dict:
    return dsse.seal(dsse.canonical_json(doc) if payload is None else payload, KEY, TYPE)


def raw(env: dict) -> bytes:
    return json.dumps(env).encode()


def kind_of(data: bytes, payload_type: str = TYPE) -> str:
    with pytest.raises(EnvelopeError) as info:
        dsse.open_signed(data, payload_type)
    assert isinstance(info.value, IntegrityError)  # exit status 3 where it reaches the command line
    return info.value.kind


def test_a_sealed_document_opens_with_its_signer() -> None:
    doc, keyid, text = dsse.open_signed(raw(sealed({"b": 1, "a": [1.5, "x"]})), TYPE)
    assert doc == {"a": [1.5, "x"], "b": 1}
    assert keyid == dsse.keyid_of(dsse.raw_public(KEY))
    assert text == dsse.public_key_text(KEY) and text.startswith("ed25519:")
    assert dsse.fingerprint(dsse.raw_public(KEY)) == keyid[:16]


def test_the_pre_authentication_encoding_is_dsse_v1() -> None:
    assert dsse.pae("t/x", b"hello") == b"DSSEv1 3 t/x 5 hello"
    assert dsse.pae("", b"") == b"DSSEv1 0  0 "


@pytest.mark.parametrize(("change", "why"), [
    (lambda e: {**e, "payloadType": "other"}, "payloadType must be"),
    (lambda e: {k: v for k, v in e.items() if k != "payload"}, "missing payload"),
    (lambda e: {**e, "extra": 1}, "unexpected 'extra'"),
    (lambda e: {**e, "payload": "not base64!"}, "payload is not valid base64"),
    (lambda e: {**e, "signatures": []}, "exactly one signature"),
    (lambda e: {**e, "signatures": [{**e["signatures"][0], "keyid": "0" * 64}]}, "keyid is not the sha256"),
    (lambda e: {**e, "signatures": [{**e["signatures"][0], "sig": base64.b64encode(b"x" * 63).decode()}]},
     "64 bytes, this one 63"),
])
def test_a_malformed_envelope_is_refused_before_any_verification(change, why: str) -> None:
    with pytest.raises(EnvelopeError, match=why) as info:
        dsse.open_signed(raw(change(sealed({"a": 1}))), TYPE)
    assert info.value.kind == EnvelopeError.MALFORMED


def test_not_json_at_all_is_malformed() -> None:
    assert kind_of(b"{truncated") == EnvelopeError.MALFORMED
    assert kind_of(b"[]") == EnvelopeError.MALFORMED


def test_a_payload_changed_after_signing_is_a_bad_signature() -> None:
    env = sealed({"bytes": 100})
    env["payload"] = base64.b64encode(dsse.canonical_json({"bytes": 900})).decode()
    assert kind_of(raw(env)) == EnvelopeError.SIGNATURE


def test_a_signature_under_another_key_is_a_bad_signature() -> None:
    other = Ed25519PrivateKey.from_private_bytes(bytes(32))
    env = sealed({"a": 1})
    env["signatures"][0]["public_key"] = base64.b64encode(dsse.raw_public(other)).decode()
    env["signatures"][0]["keyid"] = dsse.keyid_of(dsse.raw_public(other))
    assert kind_of(raw(env)) == EnvelopeError.SIGNATURE


def test_a_signed_payload_that_is_not_json_is_a_payload_problem() -> None:
    assert kind_of(raw(sealed(payload=b"\xff not json"))) == EnvelopeError.PAYLOAD


def test_verify_names_what_was_signed() -> None:
    env = dsse.parse(raw(sealed({"a": 1})), TYPE)
    env.verify()
    other = dsse.raw_public(Ed25519PrivateKey.from_private_bytes(bytes(32)))
    with pytest.raises(EnvelopeError, match="the statement or the signature was altered"):
        env.verify(other, what="the statement")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_an_envelope_error_never_another_exception(data: bytes) -> None:
    with pytest.raises(EnvelopeError):
        dsse.open_signed(data, TYPE)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=7))
def test_any_flipped_bit_of_a_sealed_envelope_is_refused(position: int, bit: int) -> None:
    data = bytearray(raw(sealed({"run": "r1", "bytes": 123456})))
    i = position % len(data)
    data[i] ^= 1 << bit
    try:
        doc, _, _ = dsse.open_signed(bytes(data), TYPE)
    except EnvelopeError:
        return
    # a flip the JSON reading absorbs (e.g. in insignificant base64 padding bits) must leave the document
    assert doc == {"run": "r1", "bytes": 123456}
