"""One run at a time on a checkpoint folder: the lock file ``FOLDER/.mlckpt-lock``.

Two runs on one folder measure each other, and a run started while the previous one's files are
still being removed measures that removal. So rank 0 creates the lock (written aside, then linked
into place: atomic on a local filesystem and on NFS, and never seen half written) before the run's
first checkpoint I/O, and it goes only once the run's files are gone: rank 0 removes it after its
cleanup, a guardian after its sweep (a killed or interrupted run), the self-launching ``mlckpt run``
waits for it before the prompt returns. A run that meets it refuses before any I/O, on whichever
host it starts, naming the run that holds it.

The lock says who holds it (JSON): the run, the host, rank 0's and its guardian's pids, when, and
the launch token of a self-launching ``mlckpt run``.  Held from this host by processes that are all
gone, it is stale (a machine crash, ``kill -9`` of everything) and is taken over with a note; held
from another host, only its owner can tell, so the message says how to remove it by hand.  Object
storage has no such lock (a prefix has no exclusive create here): one run at a time is the
operator's to keep there.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlckpt.errors import UsageError

LOCK = ".mlckpt-lock"
LAUNCH_ENV = "MLCKPT_LAUNCH"  # the self-launching `mlckpt run`'s token, passed to its ranks


@dataclass(frozen=True)
class Holder:
    run: str
    host: str
    pids: tuple[int, ...]  # rank 0 and its guardian: the lock is stale once all are gone
    started: str
    launch: str = ""
    problem: str = field(default="", compare=False)  # an unreadable lock: what is wrong with it

    def describe(self) -> str:
        if self.problem:
            return f"a lock file mlckpt cannot read ({self.problem})"
        pids = ", ".join(map(str, self.pids))
        return f"run {self.run} (host {self.host}, pids {pids}, started {self.started})"


def lock_path(folder: Path) -> Path:
    return Path(folder) / LOCK


def read_holder(folder: Path) -> Holder | None:
    """Who holds ``folder``'s lock; None when it is free."""
    try:
        text = lock_path(folder).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # no lock; or no folder (the folder gate says why)
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return Holder("?", "?", (), "?", problem=str(exc))
    try:
        doc = json.loads(text)
        return Holder(str(doc["run"]), str(doc["host"]), tuple(int(p) for p in doc["pids"]),
                      str(doc["started"]), str(doc.get("launch", "")))
    except (ValueError, KeyError, TypeError) as exc:  # half written, or not ours
        return Holder("?", "?", (), "?", problem=f"{type(exc).__name__}: {exc}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def stale(h: Holder, host: str | None = None) -> bool:
    """Held from this host by processes that are all gone (nothing can be removing files)."""
    return not h.problem and h.host == (host or socket.gethostname()) and not any(map(_alive, h.pids))


def refusal(folder: Path) -> str | None:
    """The one line that refuses a run on ``folder`` while another holds it; None when free or
    stale (the run takes a stale lock over)."""
    h = read_holder(folder)
    if h is None or stale(h):
        return None
    return (f"checkpoint.folder: {folder} is in use by {h.describe()}: another run measures it or its "
            f"files are still being removed; wait for it to end (if no run uses the folder, remove "
            f"{lock_path(folder)})")


def acquire(folder: Path, run: str, pids: Sequence[int], started: str) -> str:
    """Take ``folder``'s lock for ``run`` (the folder exists); a note when a stale lock was taken
    over, else ''.  UsageError (:func:`refusal`'s line) when another run holds it."""
    path = lock_path(folder)
    doc = Holder(run, socket.gethostname(), tuple(pids), started, os.environ.get(LAUNCH_ENV, ""))
    body = json.dumps({k: v for k, v in asdict(doc).items() if k != "problem"}).encode() + b"\n"
    note = ""
    # The lock appears whole or not at all: written to a file of this process's own, then linked
    # into place (link fails if the name exists: atomic on local filesystems and on NFS).  Another
    # host's leader of this run reads it at once and must never meet it empty.
    tmp = path.with_name(f"{LOCK}.{socket.gethostname()}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        for _ in range(2):
            try:
                os.link(tmp, path)
            except FileExistsError:
                h = read_holder(folder)
                if h is None:
                    continue  # released in between
                if h.run == run:  # a shared folder: another host's leader of this run took it
                    return ""
                if not stale(h):
                    raise UsageError(refusal(folder) or f"checkpoint.folder: {folder} is in use",
                                     key="checkpoint.folder") from None
                path.unlink(missing_ok=True)
                note = f"took over the lock of {h.describe()}: none of its processes is alive"
                continue
            return note
    finally:
        tmp.unlink(missing_ok=True)
    raise UsageError(f"checkpoint.folder: cannot take the lock {path}", key="checkpoint.folder")


def release(folder: Path, run: str) -> bool:
    """Remove ``folder``'s lock if ``run`` holds it (never another run's)."""
    h = read_holder(folder)
    if h is None or h.run != run:
        return False
    lock_path(folder).unlink(missing_ok=True)
    return True


def held_by_launch(folder: Path, launch: str) -> bool:
    """Whether the lock is still held by the run of this self-launch (its token)."""
    h = read_holder(folder)
    return h is not None and bool(launch) and h.launch == launch
