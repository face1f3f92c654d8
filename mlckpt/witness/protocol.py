"""The witness protocol: requests, the order a run's events must follow, receipts and the
transcript (witness format 1; history in mlckpt/formats.py).  Pure.

A client never states a time: requests carry what happened (an op started, an op is durable) and
the witness stamps every event with its own clocks when the request reaches it.  A write's start
receipt carries a fresh nonce that the runner binds into that checkpoint's content.

From witness format 2 an open is a DSSE envelope of ``OPEN_TYPE`` signed by a key the witness
trusts, over an open document naming the witness (its keyid) and a challenge it issued (see
mlckpt/witness/admission.py); the open entry records the signer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from mlckpt import formats

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

WITNESS_FORMAT = formats.WITNESS.version
# The ops a witness times, and the index each counts from: a checkpoint run's writes and restores
# from 1, a serving run's loads (witness format 3) from 0, as their records number them.
OPS = {"write": 1, "read": 1, "load": 0}
RECEIPT_TYPE = "application/vnd.mlckpt.witness-receipt+json"
TRANSCRIPT_TYPE = "application/vnd.mlckpt.witness-transcript+json"
OPEN_TYPE = "application/vnd.mlckpt.witness-open+json"
MAX_REQUEST_BYTES = 64 << 10  # a configuration fits many times over; anything larger is refused
MAX_EVENTS = 100_000  # per run: ten thousand checkpoints and restores, with pings

_HEX = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
REQUESTS: dict[str, dict[str, object]] = {
    "open": {  # the signed document inside the open's envelope
        "type": "object", "required": ["_type", "witness_keyid", "challenge", "plan_digest", "config"],
        "properties": {"_type": {"const": "mlckpt-witness-open"}, "witness_keyid": _HEX,
                       "challenge": {"type": "string", "maxLength": 100},
                       "plan_digest": _HEX, "config": {"type": "object", "maxProperties": 64},
                       "client": {"type": "string", "maxLength": 200}},
        "additionalProperties": False,
    },
    "event": {
        "type": "object", "required": ["kind", "op", "index"],
        "properties": {"kind": {"enum": ["start", "end"]}, "op": {"enum": list(OPS)},
                       "index": {"type": "integer", "minimum": 0, "maximum": 100_000},
                       "bytes": {"type": "integer", "minimum": 0, "maximum": 1 << 60}},
        "additionalProperties": False,
    },
    "pong": {
        "type": "object", "required": ["token"],
        "properties": {"token": {"type": "string", "pattern": "^[0-9a-f]{32}$"}},
        "additionalProperties": False,
    },
    "close": {"type": "object", "properties": {}, "additionalProperties": False},
}


@cache
def _validator(kind: str) -> Draft202012Validator:
    from jsonschema import Draft202012Validator  # imported where a request is judged: the checker never is

    return Draft202012Validator(REQUESTS[kind])


def compile_requests() -> None:
    """Every request's validator, made now: the service does this before it listens, so that its
    memory does not grow at the first request a client sends."""
    for kind in REQUESTS:
        _validator(kind)


def request_problem(kind: str, body: object) -> str | None:
    """Why ``body`` is not a valid ``kind`` request (one line), or None."""
    errors = sorted(_validator(kind).iter_errors(body), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    where = ".".join(str(p) for p in err.absolute_path) or "request"
    if err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"{where}: unknown key(s) {', '.join(extra)} (a client states no time: the witness stamps it)"
    return f"{where}: {err.message}"


def order_problem(entries: Sequence[Mapping[str, Any]], event: Mapping[str, Any]) -> str | None:
    """Why ``event`` cannot follow the run's journal ``entries`` (one line), or None.

    A run opens once; each op starts, then ends, one at a time; writes and restores each count
    1, 2, 3… in order, loads 0, 1, 2…; nothing follows the close."""
    kinds = [e["kind"] for e in entries]
    if not kinds or kinds[0] != "open":
        return "the run was never opened"
    if "close" in kinds:
        return "the run is closed"
    if "expire" in kinds:
        return ended_problem(entries)
    if len(entries) >= MAX_EVENTS:
        return f"more than {MAX_EVENTS} events in one run"
    if event["kind"] not in ("start", "end"):
        return None
    ops = [e for e in entries if e["kind"] in ("start", "end")]
    current = ops[-1] if ops and ops[-1]["kind"] == "start" else None
    if event["kind"] == "end":
        if current is None or (current["op"], current["index"]) != (event["op"], event["index"]):
            return f"{event['op']} {event['index']} ends, but it is not the op in progress"
        return None
    if current is not None:
        return (f"{event['op']} {event['index']} starts while {current['op']} {current['index']} "
                "is in progress")
    done = [e["index"] for e in ops if e["op"] == event["op"] and e["kind"] == "end"]
    want = max(done) + 1 if done else OPS[event["op"]]
    if event["index"] != want:
        return f"{event['op']} {event['index']} starts; the next {event['op']} is {want}"
    return None


def open_document(witness_keyid: str, challenge: str, plan_digest: str, config: Mapping[str, object],
                  client: str) -> dict[str, object]:
    """What a client signs to open a run at the witness ``witness_keyid``."""
    return {"_type": "mlckpt-witness-open", "witness_keyid": witness_keyid, "challenge": challenge,
            "plan_digest": plan_digest, "config": dict(config), "client": client}


def ended_problem(entries: Sequence[Mapping[str, object]]) -> str:
    """What a request to a run that took its last event hears."""
    last = entries[-1]
    if last["kind"] == "expire":
        return f"the run expired after {last['idle_s']:.0f} s without an event"
    return "the run is closed"


def tag_run_id(run_id: int, nonce: str) -> int:
    """What a witnessed write's page tags carry in their ``run_id`` field: the run's id XOR the
    first eight bytes of the nonce the witness issued at that write's start (little-endian)."""
    return run_id ^ int.from_bytes(bytes.fromhex(nonce)[:8], "little")


def transcript_format(entries: Sequence[Mapping[str, object]]) -> int:
    """The witness format a run's journal is written in: 3 once it holds a load, else 2."""
    return WITNESS_FORMAT if any(e.get("op") == "load" for e in entries) else formats.WITNESS_WITHOUT_LOADS


def receipt(run: str, entry: Mapping[str, object]) -> dict[str, object]:
    """What the witness signs for one journal entry."""
    return {"_type": "mlckpt-witness-receipt", "witness_format": WITNESS_FORMAT, "run": run,
            **{k: v for k, v in entry.items() if k != "body"}}


def transcript(run: str, entries: Sequence[Mapping[str, object]], witness_keyid: str) -> dict[str, object]:
    """The whole run as the witness saw it: every journal entry with the witness's own times."""
    return {"_type": "mlckpt-witness-transcript", "witness_format": transcript_format(entries), "run": run,
            "witness_keyid": witness_keyid, "entries": [dict(e) for e in entries]}
