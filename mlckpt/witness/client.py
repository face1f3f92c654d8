"""A witness client (the runner's rank 0, tests, the load benchmark): plain blocking HTTP(S) with a
bounded timeout per request, so a witness that never answers cannot hold a run up for longer.

It opens a run with a request signed by its key over the witness's fresh challenge, checks the
witness's key against the one it expects (if told), and every receipt's signature against it."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt import bundle, dsse
from mlckpt.errors import EnvelopeError
from mlckpt.witness import protocol

DEFAULT_TIMEOUT_S = 5.0


class WitnessError(Exception):
    """The witness refused a request (its one-line reason), or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                 key: Ed25519PrivateKey | None = None, expect: str | None = None,
                 ca_file: str | None = None) -> None:
        """``key``: the private key that signs the open (a key of the witness's trusted keys);
        ``expect``: the witness's public key text (ed25519:…) to insist on; ``ca_file``: PEM
        certificates to trust for https (default: the system's)."""
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.key, self.expect = key, expect
        self.tls = ssl.create_default_context(cafile=ca_file) if self.url.startswith("https:") else None
        self.run: str | None = None
        self.keyid: str | None = None  # the witness's, once :meth:`info` checked it
        # The perf counter as the last request was about to go out and as its answer had been
        # read (before its receipt is checked): what the runner holds against the witness's clock.
        self.sent_ns = self.answered_ns = 0

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request.  A refused or reset connection (a witness restarting: its journal keeps
        what it acknowledged) is tried again until ``timeout_s`` has passed since the first try;
        an answer the witness gives, or a connection it accepts and never answers, is final."""
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + self.timeout_s
        pause = 0.05
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
            left = deadline - time.monotonic()
            try:
                self.sent_ns = time.perf_counter_ns()
                with urllib.request.urlopen(req, timeout=max(left, 0.01), context=self.tls) as resp:
                    raw = resp.read()
                    self.answered_ns = time.perf_counter_ns()
                    return json.loads(raw)
            except urllib.error.HTTPError as exc:
                try:
                    reason = json.loads(exc.read()).get("error", exc.reason)
                except ValueError:
                    reason = exc.reason
                raise WitnessError(str(reason), exc.code) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                why = getattr(exc, "reason", exc)
                if isinstance(why, ConnectionRefusedError | ConnectionResetError) and left > pause:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
                    continue
                raise WitnessError(f"witness {self.url} unreachable: {why}") from None

    def info(self) -> dict[str, object]:
        """The witness's identity, its key checked against the one expected (if any)."""
        out = dict(self.call("GET", "/v1/witness"))
        try:
            raw = bundle.parse_public_key_text(out["public_key"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WitnessError(f"witness {self.url} gave no usable public key: {exc}") from None
        keyid = bundle.keyid_of(raw)
        if keyid != out.get("keyid"):
            raise WitnessError(f"witness {self.url}: its keyid is not its public key's")
        if self.expect is not None and bundle.public_key_text(raw) != self.expect:
            raise WitnessError(f"witness {self.url} has the key {bundle.key_label(raw)}, not the expected "
                               f"{self.expect} (witness.public_key)")
        self.keyid = keyid
        return out

    def open(self, plan_digest: str, config: dict[str, object], client: str = "mlckpt") -> dict[str, object]:
        """Open a run: the witness's challenge, signed with ``key`` into the open request."""
        if self.key is None:
            raise WitnessError("opening a witnessed run needs a signing key the witness trusts")
        if self.keyid is None:
            self.info()
        challenge = str(self.call("GET", "/v1/challenge")["challenge"])
        doc = protocol.open_document(str(self.keyid), challenge, plan_digest, config, client)
        envelope = bundle.make_envelope(doc, self.key, protocol.OPEN_TYPE)
        out = self.signed(self.call("POST", "/v1/runs", envelope))
        self.run = str(out["run"])
        return out

    def signed(self, answer: Any) -> dict[str, Any]:
        """An answer whose receipt the witness signed (checked, once its key is known)."""
        out = dict(answer)
        if self.keyid is not None and "receipt" in out:
            try:
                receipt_of(out, self.keyid)
            except (EnvelopeError, KeyError, TypeError) as exc:
                raise WitnessError(f"witness {self.url}: a receipt that does not hold: {exc}") from None
        return out

    def event(self, kind: str, op: str, index: int, nbytes: int | None = None) -> dict[str, object]:
        body: dict[str, object] = {"kind": kind, "op": op, "index": index}
        if nbytes is not None:
            body["bytes"] = nbytes
        return self.signed(self.call("POST", f"/v1/runs/{self.run}/events", body))

    def round_trip(self) -> dict[str, object]:
        """One round trip the witness measures on its own clock (ping, then pong at once)."""
        token = self.call("POST", f"/v1/runs/{self.run}/pings", {})["token"]
        return self.signed(self.call("POST", f"/v1/runs/{self.run}/pongs", {"token": token}))

    def close(self) -> dict[str, Any]:
        out = self.signed(self.call("POST", f"/v1/runs/{self.run}/close", {}))
        if self.keyid is not None:
            try:
                transcript_of(out, self.keyid)
            except (EnvelopeError, KeyError, TypeError) as exc:
                raise WitnessError(f"witness {self.url}: a transcript that does not hold: {exc}") from None
        return out


def opened(envelope: object, payload_type: str, keyid: str | None = None) -> dict[str, object]:
    """A receipt's or transcript's document, its signature checked (and its signer, if given)."""
    doc, signer, _ = dsse.open_signed(json.dumps(envelope).encode(), payload_type)
    if keyid is not None and signer != keyid:
        raise EnvelopeError(f"signed by the key with fingerprint {signer[:16]}, not by the witness's "
                            f"{keyid[:16]}", EnvelopeError.KEY)
    return dict(doc)


def receipt_of(answer: dict[str, object], keyid: str | None = None) -> dict[str, object]:
    return opened(answer["receipt"], protocol.RECEIPT_TYPE, keyid)


def transcript_of(answer: dict[str, object], keyid: str | None = None) -> dict[str, object]:
    return opened(answer["transcript"] if "transcript" in answer else answer, protocol.TRANSCRIPT_TYPE, keyid)
