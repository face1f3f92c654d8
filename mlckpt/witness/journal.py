"""The witness's append-only journal: one file per run, one JSON line per event, each line holding
the SHA-256 of the one before (a hash chain), written and fsync'ed before the witness answers.  A
restarted witness reloads every open run from it: nothing it acknowledged is lost.  A last line
cut off by a crash was never acknowledged and is dropped; any other damage refuses the start.

A run that closed or expired is archived: its lines, unchanged, gzip'ed under ``closed/`` (the
chain still verifiable, checked again whenever it is read), so that the witness's memory holds
the open runs only.  Archives are kept for a declared time or count (:meth:`Journal.prune`).
A write that fails (a full disk) is cut back to the last acknowledged line before the failure is
reported: no acknowledged event is ever damaged by a later one.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import re
import time
from pathlib import Path

from mlckpt.errors import UsageError

GENESIS = "0" * 64
_RUN = re.compile(r"^[0-9a-f]{16}$")
ENDINGS = ("close", "expire")  # the entries after which a run takes no event


class JournalFull(OSError):
    """An event could not be made durable (the journal's filesystem is full or failing); the
    journal is as it was before the attempt."""


def line_of(entry: dict[str, object]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def chained(lines: list[bytes], where: str) -> tuple[list[dict[str, object]], str]:
    """The entries of complete journal ``lines`` (without their newlines), the hash chain checked,
    and the digest of the last line; UsageError naming the damaged line."""
    prev, entries = GENESIS, []
    for n, raw in enumerate(lines, 1):
        try:
            entry = json.loads(raw)
        except ValueError:
            raise UsageError(f"witness journal {where} line {n}: not JSON (damaged)") from None
        if not isinstance(entry, dict) or entry.get("prev") != prev:
            raise UsageError(f"witness journal {where} line {n}: the hash chain is broken (edited?)")
        prev = hashlib.sha256(raw + b"\n").hexdigest()
        entries.append(entry)
    return entries, prev


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.closed = self.folder / "closed"
        self.closed.mkdir(parents=True, exist_ok=True)
        self.heads: dict[str, str] = {}  # open run -> digest of its last line

    def path(self, run: str) -> Path:
        if not _RUN.match(run):
            raise ValueError(f"bad run id {run!r}")
        return self.folder / f"{run}.jsonl"

    def archive_path(self, run: str) -> Path:
        return self.closed / f"{self.path(run).name}.gz"

    def append(self, run: str, entry: dict[str, object]) -> tuple[dict[str, object], int]:
        """``entry`` with its chain link, durable on return, and its size in bytes.
        JournalFull when it could not be made durable (the file cut back to what it was)."""
        prev = self.heads.get(run, GENESIS)
        full = {**entry, "prev": prev}
        data = line_of(full)
        fd = os.open(self.path(run), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            try:
                left = memoryview(data)
                while left:  # a short write is followed by one that says why (ENOSPC, EFBIG)
                    n = os.write(fd, left)
                    if n == 0:
                        raise OSError(errno.EIO, "the journal's filesystem took no byte")
                    left = left[n:]
                os.fsync(fd)
            except OSError as exc:
                try:
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                except OSError:
                    pass  # the torn line is dropped at the next load: it was never acknowledged
                raise JournalFull(exc.errno, f"the witness's journal could not take the event: "
                                             f"{exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if size == 0 and prev == GENESIS:
            _fsync_dir(self.folder)  # a new run's file survives a crash once acknowledged
        self.heads[run] = hashlib.sha256(data).hexdigest()
        return full, len(data)

    def archive(self, run: str) -> None:
        """Move a closed or expired run's journal under ``closed/`` (gzip'ed, lines unchanged)."""
        src, dst = self.path(run), self.archive_path(run)
        tmp = dst.with_name(dst.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(gzip.compress(src.read_bytes(), mtime=0))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dst)
        _fsync_dir(self.closed)
        src.unlink()
        _fsync_dir(self.folder)
        self.heads.pop(run, None)

    def archived(self, run: str) -> list[dict[str, object]] | None:
        """A closed run's entries, the chain checked; None if it is not (or no longer) kept."""
        try:
            data = gzip.decompress(self.archive_path(run).read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        except (OSError, EOFError) as exc:
            raise UsageError(f"witness journal {self.archive_path(run)}: unreadable ({exc})") from None
        lines = data.split(b"\n")
        if lines.pop():
            raise UsageError(f"witness journal {self.archive_path(run)}: its last line is cut off")
        return chained(lines, str(self.archive_path(run)))[0]

    def prune(self, keep_s: float | None, keep_runs: int | None, now: float | None = None) -> int:
        """Remove archived runs older than ``keep_s`` (by the time they closed) or beyond the
        newest ``keep_runs``; how many were removed."""
        now = time.time() if now is None else now
        kept = sorted(self.closed.glob("*.jsonl.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
        gone = [p for n, p in enumerate(kept)
                if (keep_runs is not None and n >= keep_runs)
                or (keep_s is not None and now - p.stat().st_mtime > keep_s)]
        for p in gone:
            p.unlink()
        if gone:
            _fsync_dir(self.closed)
        return len(gone)

    def free_bytes(self) -> int:
        st = os.statvfs(self.folder)
        return st.f_bavail * st.f_frsize

    def load(self) -> dict[str, list[dict[str, object]]]:
        """Every open run's entries, the chain checked; a torn last line (a crash mid-write)
        removed; a run found ended but not yet archived (a crash between the two) archived."""
        runs: dict[str, list[dict[str, object]]] = {}
        for tmp in self.closed.glob("*.tmp"):
            tmp.unlink()  # an archive cut off by a crash: its source is still in place
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
            entries, self.heads[run] = chained(lines, str(path))
            if entries and entries[-1]["kind"] in ENDINGS:
                self.archive(run)
            elif entries:
                runs[run] = entries
            else:
                path.unlink()  # an open whose first line never became durable: never acknowledged
                self.heads.pop(run, None)
        return runs
