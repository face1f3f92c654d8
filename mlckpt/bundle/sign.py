"""Signing a bundle folder: statement, DSSE envelope, ``bundle.dsse.json`` written atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
)

from mlckpt.bundle._common import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    SIGNATURE_FILE,
    STATEMENT_TYPE,
    atomic_write,
    problem,
    raise_problems,
    relpath_problem,
)
from mlckpt.bundle._fs import hash_many, open_error, open_kind, open_root, scan
from mlckpt.bundle.models import Predicate, predicate_dict
from mlckpt.dsse import canonical_json, seal
from mlckpt.errors import IntegrityKind


def make_statement(files: Mapping[str, str], predicate: Mapping[str, object]) -> dict[str, object]:
    """The in-toto statement for ``files`` (name -> sha256 hex), subjects sorted by name."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": files[n]}} for n in sorted(files)],
        "predicateType": PREDICATE_TYPE,
        "predicate": dict(predicate),
    }


def make_envelope(statement: Mapping[str, object], key: Ed25519PrivateKey,
                  payload_type: str = PAYLOAD_TYPE) -> dict[str, object]:
    """Serialise ``statement`` deterministically and sign it into a DSSE envelope (``payload_type``:
    a bundle's in-toto statement by default; the witness signs its receipts under its own)."""
    return seal(canonical_json(statement), key, payload_type)


def sign_bundle(folder: Path, key: Ed25519PrivateKey, predicate: Predicate | Mapping[str, object]) -> Path:
    """Hash every file of ``folder`` and write (or replace) its signed envelope; return its path.

    Raises UsageError for a bad predicate or folder, BundleIntegrityError when the folder holds
    anything that cannot be part of a bundle (symlinks, devices, unacceptable names).
    """
    folder = Path(folder)
    pred = predicate_dict(predicate)
    root_fd = open_root(folder)
    try:
        files, bad = scan(root_fd)
        problems = list(bad)
        problems += [problem(n, why, IntegrityKind.PATHS) for n in files if (why := relpath_problem(n))]
        target = folder / SIGNATURE_FILE
        if target.is_symlink() or (target.exists() and not target.is_file()):
            problems.append(problem(SIGNATURE_FILE, "exists and is not a regular file", IntegrityKind.PATHS))
        raise_problems(f"{folder}: cannot sign", sorted(problems))
        digests = hash_many(root_fd, files)
    finally:
        os.close(root_fd)
    errors = [problem(n, open_error(d), open_kind(d)) for n, d in digests.items() if isinstance(d, OSError)]
    raise_problems(f"{folder}: cannot sign", sorted(errors))
    statement = make_statement({n: str(d) for n, d in digests.items()}, pred)
    envelope = make_envelope(statement, key)
    atomic_write(target, (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode())
    return target
