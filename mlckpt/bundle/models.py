"""The bundle's value types: the signed predicate, a verified bundle, a key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path

from mlckpt.bundle._common import (
    BUNDLE_FORMAT,
    CODE_DIGEST_ALG,
    DIVISIONS,
    HEX64,
    REQUIRED_PREDICATE_KEYS,
    SUPPORTED_BUNDLE_FORMATS,
)
from mlckpt.dsse import canonical_json
from mlckpt.errors import UsageError


@dataclass(frozen=True)
class Predicate:
    """What the runner asserts about a run; ``extra`` keys are added to the predicate object."""

    run_id: str
    mlckpt_version: str
    runner_code_sha256: str
    rules_version: str
    workload: str
    division: str
    started: str
    ended: str
    bundle_format: str = BUNDLE_FORMAT
    runner_code_hash_alg: str = CODE_DIGEST_ALG
    extra: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        clash = sorted(set(out) & set(self.extra))
        if clash:
            raise UsageError(f"predicate extra keys shadow standard keys: {', '.join(clash)}")
        out.update(self.extra)
        return out


def _parse_utc(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None or when.utcoffset() != timedelta(0):
        return None
    return when


def predicate_problems(pred: object) -> list[str]:
    """Format-level checks of a predicate (both when signing and when verifying)."""
    if not isinstance(pred, Mapping):
        return ["predicate is not an object"]
    out = []
    missing = [k for k in REQUIRED_PREDICATE_KEYS if k not in pred]
    if missing:
        out.append(f"predicate lacks required keys: {', '.join(missing)}")
    for k in REQUIRED_PREDICATE_KEYS:
        if k in pred and (not isinstance(pred[k], str) or not pred[k]):
            out.append(f"predicate key {k!r} must be a non-empty string, got {pred[k]!r:.80}")
    fmt = pred.get("bundle_format")
    if isinstance(fmt, str) and fmt and fmt not in SUPPORTED_BUNDLE_FORMATS:
        out.append(f"unsupported bundle_format {fmt!r}")
    code = pred.get("runner_code_sha256")
    if isinstance(code, str) and code and not HEX64.fullmatch(code):
        out.append("predicate key 'runner_code_sha256' must be 64 lowercase hex digits")
    div = pred.get("division")
    if isinstance(div, str) and div and div not in DIVISIONS:
        out.append(f"predicate key 'division' must be one of {', '.join(DIVISIONS)}, got {div!r}")
    times = {}
    for k in ("started", "ended"):
        if isinstance(pred.get(k), str) and pred[k]:
            times[k] = _parse_utc(pred[k])
            if times[k] is None:
                out.append(f"predicate key {k!r} must be an ISO-8601 UTC time, got {pred[k]!r}")
    started, ended = times.get("started"), times.get("ended")
    if started is not None and ended is not None and ended < started:
        out.append("predicate 'ended' is before 'started'")
    return out


def predicate_dict(predicate: Predicate | Mapping[str, object]) -> dict[str, object]:
    if isinstance(predicate, Predicate):
        pred = predicate.to_dict()
    elif isinstance(predicate, Mapping):
        pred = dict(predicate)
        pred.setdefault("bundle_format", BUNDLE_FORMAT)
        pred.setdefault("runner_code_hash_alg", CODE_DIGEST_ALG)
    else:
        raise UsageError(f"predicate must be a Predicate or a mapping, got {type(predicate)}")
    problems = predicate_problems(pred)
    if pred.get("bundle_format") != BUNDLE_FORMAT:
        problems.append(f"this mlckpt writes bundle_format {BUNDLE_FORMAT!r} only")
    if problems:
        raise UsageError("invalid predicate: " + "; ".join(dict.fromkeys(problems)))
    try:
        canonical_json(pred)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid predicate: not serialisable as strict JSON: {exc}") from None
    return pred


@dataclass(frozen=True)
class VerifiedBundle:
    """A bundle whose signature, paths and digests all hold."""

    folder: Path
    statement: dict[str, object]
    predicate: dict[str, object]
    keyid: str
    public_key: str  # ed25519:<base64>
    org: str | None  # from the trusted-keys file; None when verified without one
    files: dict[str, str]  # name -> sha256 hex, as signed and as found on disk
    statement_sha256: str  # of the signed payload bytes: a replay/duplicate-submission key

    @property
    def key_label(self) -> str:
        """The signer's key as every message names it (:func:`mlckpt.bundle.keys.key_label`)."""
        return f"{self.public_key} (fingerprint {self.keyid[:16]})"


@dataclass(frozen=True)
class KeyInfo:
    """A public key (``ed25519:<base64>``), its keyid and, for generated keys, the file paths."""

    keyid: str
    public_key: str
    path: Path | None = None
    public_path: Path | None = None

    @property
    def fingerprint(self) -> str:
        return self.keyid[:16]

    @property
    def label(self) -> str:
        """The key as every message names it (:func:`mlckpt.bundle.keys.key_label`)."""
        return f"{self.public_key} (fingerprint {self.fingerprint})"
