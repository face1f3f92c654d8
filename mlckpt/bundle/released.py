"""The committee's list of released runners (``released-runners.yaml``, at the root of a
submission tree next to ``trusted-keys.yaml``): the code digests a bundle's signed predicate must
name to be eligible for a leaderboard row (rule RUNNER-RELEASED).  Read with the same strict
loader and size limit as the trusted keys; its format is versioned in mlckpt/formats.py and
its schema is ``rules/1.2/schemas/released-runners.schema.json``.

Example (``mlckpt digest`` prints the entry for the installed runner)::

    mlckpt_released_runners: "1.0"
    runners:
      - version: "0.1.0"
        code_sha256: "3f1c…"          # 64 hex digits
        released: "2026-11-24"
"""

from __future__ import annotations

from pathlib import Path

from mlckpt import formats, strict
from mlckpt.bundle._common import MAX_TRUSTED_KEYS_BYTES
from mlckpt.errors import UsageError

RELEASED_RUNNERS_FORMAT = formats.RELEASED_RUNNERS.version
SCHEMA_RULES = "1.2"  # the rules folder that holds this file's schema


def load_released(path: Path) -> frozenset[str]:
    """The code digests ``path`` lists; a usage error (one line) for anything unreadable,
    malformed or not in the schema."""
    from mlckpt.schemas import first_error

    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRUSTED_KEYS_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read released runners: {exc.strerror or exc}") from None
    if len(data) > MAX_TRUSTED_KEYS_BYTES:
        raise UsageError(f"{path}: released-runners file larger than 1 MiB")
    try:
        doc = strict.parse_yaml(data)
    except ValueError as exc:  # strict.ParseError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"{path}: cannot parse released runners: {first}") from None
    problem = first_error(doc, "released-runners", SCHEMA_RULES)
    if problem:
        raise UsageError(f"{path}: {problem}")
    return frozenset(str(r["code_sha256"]) for r in doc["runners"])


def entry(version: str, digest: str, released: str) -> str:
    """A paste-ready entry of ``runners:`` for one runner."""
    return f'  - version: "{version}"\n    code_sha256: "{digest}"\n    released: "{released}"\n'
