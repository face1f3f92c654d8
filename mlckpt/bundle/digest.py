"""The runner's code digest: one hash over the shipped code and rule data."""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from mlckpt import resources


def _code_files() -> list[tuple[str, Path]]:
    """(name in the digest, file) for the mlckpt package and its shipped data folders."""
    pkg = Path(__file__).resolve().parents[1]  # the mlckpt package (this file is mlckpt/bundle/...)
    out: list[tuple[str, Path]] = []

    def add(base: Path, prefix: str, skip_data: bool) -> None:
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = Path(dirpath).relative_to(base).as_posix()
            dirnames[:] = [
                d
                for d in dirnames
                if d != "__pycache__" and not (skip_data and rel_dir == "." and d == "_data")
            ]
            for fn in filenames:
                if fn.endswith((".pyc", ".pyo")):
                    continue
                p = Path(dirpath) / fn
                if not p.is_file() or p.is_symlink():
                    continue
                rel = fn if rel_dir == "." else f"{rel_dir}/{fn}"
                out.append((prefix + rel, p))

    add(pkg, "", skip_data=True)
    for name in ("workloads", "rules"):
        try:
            base = resources.data_dir(name)
        except FileNotFoundError:
            continue
        add(base, f"_data/{name}/", skip_data=False)
    return sorted(out)


@cache
def code_digest() -> str:
    """sha256 hex over the installed mlckpt package (algorithm ``mlckpt-tree-sha256-v1``).

    For each file, sorted by name: ``name NUL len(content) NUL content``, where names are
    relative POSIX paths of every file under the package folder except ``__pycache__`` and
    ``*.pyc``, with the data folders named ``_data/workloads/...`` and ``_data/rules/...``
    whether they come from a wheel or a source checkout.  Length-prefixing keeps the framing
    unambiguous.  This is self-reported: a modified runner can report any value; the checker
    can only compare it to the digests of released versions.
    """
    h = hashlib.sha256()
    for name, path in _code_files():
        data = path.read_bytes()
        h.update(name.encode("utf-8") + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()
