"""Reading a verified bundle's documents: the one way the checker, compare and the leaderboard
read what a bundle says.  Each file is read once, within its cap (``mlckpt.strict.CAPS``), never
through a link, and must still be the bytes the signature covers (a file swapped after
verification is refused, not read)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from mlckpt import strict
from mlckpt.bundle.models import VerifiedBundle

# A bundle's documents and the schema each is validated against (records.jsonl: each line against
# the record schema).
DOCUMENTS = (("run.json", "run"), ("config.yaml", "config"), ("summary.json", "summary"),
             ("system.json", "system"))


def read_document(folder: Path, name: str, verified: VerifiedBundle) -> bytes:
    """The bytes of ``name`` as signed; ``strict.ParseError`` says why not."""
    if name not in verified.files:
        raise strict.ParseError("not in the bundle (not signed)")
    data = strict.read_capped(Path(folder) / name, strict.CAPS[name])
    if hashlib.sha256(data).hexdigest() != verified.files[name]:
        raise strict.ParseError("changed since it was verified")
    return data


def parse_document(name: str, data: bytes) -> Any:
    """A JSON or YAML document (by its name), parsed strictly."""
    return strict.parse_yaml(data) if name.endswith(".yaml") else strict.parse_json(data)
