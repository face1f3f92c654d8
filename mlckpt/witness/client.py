"""A witness client (the runner's rank 0, tests, the load benchmark): plain blocking HTTP with a
bounded timeout per request, so a witness that never answers cannot hold a run up for longer."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from mlckpt import bundle
from mlckpt.witness import protocol

DEFAULT_TIMEOUT_S = 5.0


class WitnessError(Exception):
    """The witness refused a request (its one-line reason), or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.run: str | None = None

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
                with urllib.request.urlopen(req, timeout=max(left, 0.01)) as resp:
                    return json.loads(resp.read())
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

    def info(self) -> dict[str, Any]:
        return dict(self.call("GET", "/v1/witness"))

    def open(self, plan_digest: str, config: dict[str, Any], client: str = "mlckpt") -> dict[str, Any]:
        out = dict(self.call("POST", "/v1/runs", {"plan_digest": plan_digest, "config": config,
                                                  "client": client}))
        self.run = str(out["run"])
        return out

    def event(self, kind: str, op: str, index: int, nbytes: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": kind, "op": op, "index": index}
        if nbytes is not None:
            body["bytes"] = nbytes
        return dict(self.call("POST", f"/v1/runs/{self.run}/events", body))

    def round_trip(self) -> dict[str, Any]:
        """One round trip the witness measures on its own clock (ping, then pong at once)."""
        token = self.call("POST", f"/v1/runs/{self.run}/pings", {})["token"]
        return dict(self.call("POST", f"/v1/runs/{self.run}/pongs", {"token": token}))

    def close(self) -> dict[str, Any]:
        return dict(self.call("POST", f"/v1/runs/{self.run}/close", {}))


def opened(envelope: Any, payload_type: str, keyid: str | None = None) -> dict[str, Any]:
    """A receipt's or transcript's document, its signature checked (and its signer, if given)."""
    doc, signer, _ = bundle.open_envelope(json.dumps(envelope).encode(), payload_type)
    if keyid is not None and signer != keyid:
        raise ValueError(f"signed by the key with fingerprint {signer[:16]}, not by the witness's "
                         f"{keyid[:16]}")
    return dict(doc)


def receipt_of(answer: dict[str, Any], keyid: str | None = None) -> dict[str, Any]:
    return opened(answer["receipt"], protocol.RECEIPT_TYPE, keyid)


def transcript_of(answer: dict[str, Any], keyid: str | None = None) -> dict[str, Any]:
    return opened(answer["transcript"] if "transcript" in answer else answer, protocol.TRANSCRIPT_TYPE, keyid)
