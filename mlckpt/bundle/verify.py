"""Verifying a bundle folder, in named steps: envelope read and parsed, signature and signer
checked, then the statement, then every file's digest."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

from mlckpt import dsse, strict
from mlckpt.bundle._common import (
    HEX64,
    MAX_ENVELOPE_BYTES,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    SIGNATURE_FILE,
    STATEMENT_TYPE,
    SUPPORTED_BUNDLE_FORMATS,
    Problem,
    fail,
    problem,
    raise_problems,
    relpath_problem,
)
from mlckpt.bundle._fs import hash_many, open_beneath, open_error, open_kind, open_root, scan
from mlckpt.bundle.keys import TrustedKeys
from mlckpt.bundle.models import VerifiedBundle, predicate_problems
from mlckpt.dsse import key_label, public_key_text
from mlckpt.errors import EnvelopeError, IntegrityKind, UsageError


def _read_envelope_bytes(root_fd: int, where: str) -> bytes:
    try:
        fd = open_beneath(root_fd, SIGNATURE_FILE)
    except OSError as exc:
        why = open_error(exc)
        if why == "missing":
            why = "missing: the bundle is not signed"
        fail(where, SIGNATURE_FILE, why, open_kind(exc))
    with io.FileIO(fd, "rb", closefd=True) as f:
        if os.fstat(fd).st_size > MAX_ENVELOPE_BYTES:
            fail(where, SIGNATURE_FILE, f"larger than {MAX_ENVELOPE_BYTES >> 20} MiB")
        chunks = []
        total = 0
        while total <= MAX_ENVELOPE_BYTES:
            chunk = f.read(min(1 << 20, MAX_ENVELOPE_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    if total > MAX_ENVELOPE_BYTES:
        fail(where, SIGNATURE_FILE, f"larger than {MAX_ENVELOPE_BYTES >> 20} MiB")
    return b"".join(chunks)


def _statement_problems(stmt: Any) -> tuple[dict[str, str], list[Problem]]:
    """Subjects (name -> sha256) and every problem with the statement's subject list."""
    files: dict[str, str] = {}
    problems: list[Problem] = []
    subjects = stmt["subject"]
    if not isinstance(subjects, list):
        return files, [problem(SIGNATURE_FILE, "statement 'subject' is not a list")]
    for i, item in enumerate(subjects):
        if not isinstance(item, dict) or set(item) != {"name", "digest"}:
            problems.append(problem(SIGNATURE_FILE, f"subject #{i} must have exactly name and digest"))
            continue
        name, digest = item["name"], item["digest"]
        label = name if isinstance(name, str) else f"subject #{i}"
        why = relpath_problem(name)
        if why is None and name == SIGNATURE_FILE:
            why = "the envelope cannot be its own subject"
        if why:
            problems.append(problem(label, f"subject name rejected: {why}", IntegrityKind.PATHS))
            continue
        if (
            not isinstance(digest, dict)
            or set(digest) != {"sha256"}
            or not isinstance(digest["sha256"], str)
            or not HEX64.fullmatch(digest["sha256"])
        ):
            problems.append(problem(name, "subject digest must be exactly {sha256: 64 lowercase hex}"))
            continue
        if name in files:
            problems.append(problem(name, "duplicate subject"))
            continue
        files[name] = digest["sha256"]
    return files, problems


def verify_bundle(
    folder: Path, trusted: TrustedKeys | None = None, *, org: str | None = None
) -> VerifiedBundle:
    """Verify ``folder``; return what was verified or raise BundleIntegrityError (exit 3).

    Steps, in order: the envelope read and parsed (:func:`_read_envelope_bytes`,
    :func:`mlckpt.dsse.parse`); the signer (:func:`_signer_key`: with ``trusted``, registered, and
    for ``org`` when given); the signature over PAE of the payload bytes (:func:`_check_signature`);
    only then the statement (:func:`_statement`: types, bundle_format); then the subjects against
    the folder (:func:`_subject_problems`) and every digest (:func:`_digest_problems`).  Problems
    from the statement's predicate on are all collected before raising.
    """
    folder = Path(folder)
    where = str(folder)
    _check_org_request(trusted, org)
    root_fd = open_root(folder)
    try:
        data = _read_envelope_bytes(root_fd, where)
        try:
            env = dsse.parse(data, PAYLOAD_TYPE)
        except EnvelopeError as exc:
            fail(where, SIGNATURE_FILE, str(exc))
        signer_org, key_raw = _signer_key(where, env, trusted, org)
        _check_signature(where, env, key_raw)
        stmt, pred = _statement(where, env.payload)  # authenticated from here on
        problems: list[Problem] = [problem(SIGNATURE_FILE, p) for p in predicate_problems(pred)]
        subjects, subject_problems = _statement_problems(stmt)
        problems += subject_problems
        on_disk, bad = scan(root_fd)
        problems += _subject_problems(subjects, subject_problems, on_disk, bad)
        digests = hash_many(root_fd, {n: on_disk[n] for n in subjects if n in on_disk})
    finally:
        os.close(root_fd)
    problems += _digest_problems(subjects, digests)
    raise_problems(where, problems)
    return VerifiedBundle(
        folder=folder,
        statement=stmt,
        predicate=pred,
        keyid=env.keyid,
        public_key=public_key_text(env.public_key),
        org=signer_org,
        files=dict(sorted(subjects.items())),
        statement_sha256=hashlib.sha256(env.payload).hexdigest(),
    )


def _check_org_request(trusted: TrustedKeys | None, org: str | None) -> None:
    if org is None:
        return
    if trusted is None:
        raise UsageError("checking the organisation (--org) needs a trusted-keys file")
    if not trusted.keys_for(org):
        raise UsageError(f"organisation {org!r} has no keys in {trusted.source}")


def _signer_key(
    where: str, env: dsse.Envelope, trusted: TrustedKeys | None, org: str | None
) -> tuple[str | None, bytes]:
    """(the signer's organisation, the public key to verify with): the embedded key without
    ``trusted``; with it, the registered key, which must be the embedded one."""
    if trusted is None:
        return None, env.public_key
    signer_org = trusted.org_for(env.keyid)
    if signer_org is None:
        fail(where, SIGNATURE_FILE, f"signed by untrusted key {key_label(env.public_key)}",
              IntegrityKind.KEY)
    if org is not None and signer_org != org:
        fail(
            where,
            SIGNATURE_FILE,
            f"signed by key {key_label(env.public_key)} registered for organisation {signer_org!r}, "
            f"not {org!r}",
            IntegrityKind.KEY,
        )
    trusted_raw = trusted.public_key_for(env.keyid)
    if trusted_raw != env.public_key:
        fail(where, SIGNATURE_FILE, "embedded public key differs from the trusted key", IntegrityKind.KEY)
    return signer_org, trusted_raw


def _check_signature(where: str, env: dsse.Envelope, key_raw: bytes) -> None:
    try:
        env.verify(key_raw, what="the statement")
    except EnvelopeError as exc:
        fail(where, SIGNATURE_FILE, str(exc))


def _statement(where: str, payload: bytes) -> tuple[dict[str, object], dict[str, object]]:
    """The signed statement and its predicate, strictly parsed (the payload is authenticated)."""
    try:
        stmt = strict.parse_json(payload)
    except ValueError as exc:
        fail(where, SIGNATURE_FILE, f"signed payload is not valid JSON: {exc}")
    if not isinstance(stmt, dict) or set(stmt) != {"_type", "subject", "predicateType", "predicate"}:
        fail(
            where, SIGNATURE_FILE, "statement must have exactly _type, subject, predicateType and predicate"
        )
    if stmt["_type"] != STATEMENT_TYPE:
        fail(where, SIGNATURE_FILE, f"statement _type must be {STATEMENT_TYPE!r}")
    if stmt["predicateType"] != PREDICATE_TYPE:
        fail(
            where,
            SIGNATURE_FILE,
            f"predicateType must be {PREDICATE_TYPE!r}, got {stmt['predicateType']!r:.80}",
        )
    pred = stmt["predicate"]
    if not isinstance(pred, dict):
        fail(where, SIGNATURE_FILE, "predicate is not an object")
    fmt = pred.get("bundle_format")
    if not isinstance(fmt, str) or fmt not in SUPPORTED_BUNDLE_FORMATS:
        fail(
            where,
            SIGNATURE_FILE,
            f"unsupported bundle_format {fmt!r} (this mlckpt reads "
            f"{', '.join(sorted(SUPPORTED_BUNDLE_FORMATS))})",
        )
    return stmt, pred


def _subject_problems(
    subjects: dict[str, str], subject_problems: list[Problem], on_disk: dict[str, int], bad: list[Problem]
) -> list[Problem]:
    """The folder's file set against the signed subjects: missing and extra files (names already
    reported as rejected or unreadable are not reported twice)."""
    rejected = {p for p, _ in subject_problems}
    disk_problems: list[Problem] = list(bad)
    bad_names = {p for p, _ in bad}
    for name in sorted(set(subjects) - set(on_disk)):
        if name not in bad_names:
            disk_problems.append(problem(name, "missing (listed in the statement, not in the folder)"))
    for name in sorted(set(on_disk) - set(subjects)):
        if name not in rejected:
            disk_problems.append(problem(name, "extra file (not listed in the statement)"))
    return sorted(disk_problems)


def _digest_problems(subjects: dict[str, str], digests: dict[str, str | OSError]) -> list[Problem]:
    out: list[Problem] = []
    for name in sorted(digests):
        got = digests[name]
        if isinstance(got, OSError):
            out.append(problem(name, open_error(got), open_kind(got)))
        elif got != subjects[name]:
            out.append(problem(name, f"digest mismatch: signed sha256 {subjects[name]}, file has {got}"))
    return out


def read_envelope_predicate(folder: Path) -> dict[str, object]:
    """The predicate of ``folder``'s existing envelope, parsed strictly but NOT verified.

    For re-signing a bundle whose files changed: the new signer takes responsibility for it.
    """
    folder = Path(folder)
    root_fd = open_root(folder)
    try:
        data = _read_envelope_bytes(root_fd, str(folder))
    finally:
        os.close(root_fd)
    try:
        stmt = dsse.parse(data, PAYLOAD_TYPE).document()
    except EnvelopeError as exc:
        fail(str(folder), SIGNATURE_FILE, str(exc))
    pred = stmt.get("predicate") if isinstance(stmt, dict) else None
    if not isinstance(pred, dict):
        fail(str(folder), SIGNATURE_FILE, "statement has no predicate object")
    return pred
