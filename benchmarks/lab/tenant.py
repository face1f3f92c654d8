"""Another tenant of the checkpoint disk: copies files there while honest runs go on beside it.

Each round writes a file (buffered, then fsync), drops it from the page cache, reads it back cold
and deletes it, paced to ``--rate-mb-s`` on average (0: as fast as the disk goes).  By default the
written pages start for the disk as they go (POSIX_FADV_DONTNEED after every 4 MiB starts their
writeback, as a copy sees once the kernel's writeback keeps up), so the disk sees the paced
rate; ``--bursty`` leaves them dirty until the file's fsync, so the disk sees each file as one
flush at full speed (a 512 MiB burst every few seconds).  ``--busy-cores`` keeps that many cores
spinning in other processes.  Bounded: it stops after ``--seconds`` (and when its parent goes
away), and removes what it wrote.

    python benchmarks/lab/tenant.py --dir /path/on/the/checkpoint/disk --rate-mb-s 250 --busy-cores 1

Used by tests/mpi/test_environment.py (a fixture starts it) and by hand, beside `mlckpt run` or the
whole test suite, to see that honest runs stay valid (or are called disturbed, never invalid).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

CHUNK = 4 << 20


def _spin(deadline: float) -> None:
    x = 0
    while time.monotonic() < deadline:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


class Pacer:
    """Keeps the bytes moved at ``rate`` bytes/s (0: no limit).  A tenant starved of CPU for a
    while does not catch up in a burst afterwards: a lag of more than ``slack_s`` is forgiven, so
    the disk never sees more than the rate for long."""

    def __init__(self, rate: float, slack_s: float = 0.2) -> None:
        self.rate, self.slack_s, self.due = rate, slack_s, time.monotonic()

    def moved(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.due = max(self.due + nbytes / self.rate, now - self.slack_s)
        if self.due > now:
            time.sleep(self.due - now)


def copy_round(folder: Path, file_bytes: int, pace: Pacer, moved: int, n: int, bursty: bool = False) -> int:
    """One file written, synced, dropped, read back cold and removed; returns the bytes moved so far."""
    path = folder / f"tenant-{os.getpid()}-{n}.bin"
    buf = os.urandom(CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(file_bytes // CHUNK):
            os.write(fd, buf)
            if not bursty:
                # starts writeback of the chunk's dirty pages without waiting (Linux)
                os.posix_fadvise(fd, i * CHUNK, CHUNK, os.POSIX_FADV_DONTNEED)
            moved += CHUNK
            pace.moved(CHUNK)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, CHUNK):
            moved += CHUNK
            pace.moved(CHUNK)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return moved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="a folder on the checkpoint disk")
    ap.add_argument("--rate-mb-s", type=float, default=250.0, help="average MB/s moved (0: flat out)")
    ap.add_argument("--file-mib", type=int, default=512, help="size of each file copied")
    ap.add_argument("--bursty", action="store_true", help="leave the writes dirty until each file's fsync")
    ap.add_argument("--busy-cores", type=int, default=0, help="cores kept spinning by other processes")
    ap.add_argument("--seconds", type=float, default=3600.0, help="stop after this long")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + a.seconds
    spinners = [multiprocessing.Process(target=_spin, args=(deadline,), daemon=True)
                for _ in range(a.busy_cores)]
    for p in spinners:
        p.start()
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    start, moved, n = time.monotonic(), 0, 0
    pace = Pacer(a.rate_mb_s * 1e6)
    try:
        while time.monotonic() < deadline and os.getppid() == parent:
            moved = copy_round(a.dir, a.file_mib << 20, pace, moved, n, a.bursty)
            n += 1
    finally:
        for p in spinners:
            p.terminate()
        for f in a.dir.glob(f"tenant-{os.getpid()}-*.bin"):
            f.unlink(missing_ok=True)
        took = time.monotonic() - start
        rate = moved / 1e6 / max(took, 1e-9)
        print(f"tenant: {n} rounds, {moved / 1e6:.0f} MB in {took:.0f} s ({rate:.0f} MB/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
