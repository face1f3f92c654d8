"""The witness's append-only journal: one file per run, one JSON line per event, each line holding
the SHA-256 of the one before (a hash chain), written and fsync'ed before the witness answers.  A
restarted witness reloads every run from it: nothing it acknowledged is lost.  A last line cut off
by a crash was never acknowledged and is dropped; any other damage refuses the start."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from mlckpt.errors import UsageError

GENESIS = "0" * 64
_RUN = re.compile(r"^[0-9a-f]{16}$")


def line_of(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


class Journal:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.heads: dict[str, str] = {}  # run -> digest of its last line

    def path(self, run: str) -> Path:
        if not _RUN.match(run):
            raise ValueError(f"bad run id {run!r}")
        return self.folder / f"{run}.jsonl"

    def append(self, run: str, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with its sequence number and chain link, durable on return."""
        prev = self.heads.get(run, GENESIS)
        full = {**entry, "prev": prev}
        data = line_of(full)
        fd = os.open(self.path(run), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.heads[run] = hashlib.sha256(data).hexdigest()
        return full

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """Every run's entries, the chain checked; a torn last line (a crash mid-write) removed."""
        runs: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(self.folder.glob("*.jsonl")):
            run = path.stem
            if not _RUN.match(run):
                continue
            data = path.read_bytes()
            lines = data.split(b"\n")
            torn = lines.pop()  # after the last newline: empty, or a line the crash cut off
            if torn:
                with open(path, "r+b") as fh:  # never acknowledged: drop it
                    fh.truncate(len(data) - len(torn))
                    os.fsync(fh.fileno())
            prev, entries = GENESIS, []
            for n, raw in enumerate(lines, 1):
                try:
                    entry = json.loads(raw)
                except ValueError:
                    raise UsageError(f"witness journal {path} line {n}: not JSON (damaged)") from None
                if not isinstance(entry, dict) or entry.get("prev") != prev:
                    raise UsageError(f"witness journal {path} line {n}: the hash chain is broken (edited?)")
                prev = hashlib.sha256(raw + b"\n").hexdigest()
                entries.append(entry)
            runs[run] = entries
            self.heads[run] = prev
        return runs
