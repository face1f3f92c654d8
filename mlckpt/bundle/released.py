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

from mlckpt import formats
from mlckpt.bundle.keys import read_trust_file
from mlckpt.errors import UsageError

RELEASED_RUNNERS_FORMAT = formats.RELEASED_RUNNERS.version
SCHEMA_RULES = "1.2"  # the rules folder that holds this file's schema


def load_released(path: Path) -> frozenset[str]:
    """The code digests ``path`` lists; a usage error (one line) for anything unreadable,
    malformed or not in the schema."""
    from mlckpt.schemas import first_error

    doc = read_trust_file(Path(path), "released runners")
    problem = first_error(doc, "released-runners", SCHEMA_RULES)
    if problem:
        raise UsageError(f"{path}: {problem}")
    return frozenset(str(r["code_sha256"]) for r in doc["runners"])


def entry(version: str, digest: str, released: str) -> str:
    """A paste-ready entry of ``runners:`` for one runner."""
    return f'  - version: "{version}"\n    code_sha256: "{digest}"\n    released: "{released}"\n'
