"""Speed of mlckpt.engine on this machine: content generation, verification, direct I/O.

    python benchmarks/engine_speed.py [--size-gib 1] [--folder DIR] [--repeat 3]

fill and verify run on one core (the calling thread), so their figures are per core.  Writes and
reads use O_DIRECT on one file in --folder (default: a temporary folder under the current
directory, i.e. on the current filesystem), each write timed from create to fsync done, each
read timed after the file was evicted from the page cache.  GB = 1e9 bytes.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time

from mlckpt import engine
from mlckpt.engine import FileIO, IOOptions, PageId

GB = 1e9
GiB = 1 << 30


def _rate(nbytes: int, seconds: list[float]) -> str:
    rates = sorted(nbytes / s / GB for s in seconds)
    return (
        f"{statistics.median(rates):6.2f} GB/s  (median of {len(rates)}; "
        f"min {rates[0]:.2f}, max {rates[-1]:.2f})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="bytes per test, GiB (default 1)")
    ap.add_argument("--folder", help="where the test file goes (default: temp dir under cwd)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions per figure (default 3)")
    ap.add_argument("--block-mib", type=int, default=4, help="request size, MiB (default 4)")
    args = ap.parse_args(argv)

    nbytes = int(args.size_gib * GiB)
    own_folder = args.folder is None
    folder = tempfile.mkdtemp(prefix=".mlckpt-bench-", dir=os.getcwd()) if own_folder else args.folder
    key, pid = secrets.token_bytes(16), PageId(secrets.randbits(64), 0, 0, 0)
    try:
        t = time.perf_counter()
        buf = engine.alloc(nbytes)
        print(f"alloc (pre-touch)  {nbytes / (time.perf_counter() - t) / GB:6.2f} GB/s  "
              f"({nbytes / GiB:.2f} GiB, once)")

        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            engine.fill(buf, nbytes, key, pid)
            times.append(time.perf_counter() - t)
        print(f"fill    per core   {_rate(nbytes, times)}")

        scratch = engine.alloc(engine.VERIFY_SCRATCH_BYTES)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            bad = engine.verify(buf, nbytes, key, pid, scratch)
            times.append(time.perf_counter() - t)
            if bad is not None:
                print(f"verify FAILED: {bad.describe()}")
                return 1
        print(f"verify  per core   {_rate(nbytes, times)}")

        if not engine.probe_direct(folder):
            print(f"O_DIRECT not supported in {folder}; skipping I/O figures")
            return 0
        print(f"I/O: one {nbytes / GiB:.2f} GiB file in {folder}, O_DIRECT, "
              f"{args.block_mib} MiB requests, fsync on")
        path = os.path.join(folder, "engine_speed.dat")
        for threads in (1, 4):
            opts = IOOptions(direct=True, threads=threads, block_size=args.block_mib << 20)
            writes, reads, resident = [], [], []
            for _ in range(args.repeat):
                if os.path.exists(path):
                    os.unlink(path)
                t = time.perf_counter()
                engine.write_files([FileIO(path, buf, nbytes)], opts, dir_fsync=[folder])
                writes.append(time.perf_counter() - t)
                engine.evict(path)
                resident.append(engine.resident_bytes(path)[0])
                buf[:] = 0  # the read must really bring the data back (verified below)
                t = time.perf_counter()
                engine.read_files([FileIO(path, buf, nbytes)], opts)
                reads.append(time.perf_counter() - t)
                bad = engine.verify(buf, nbytes, key, pid, scratch)
                if bad is not None:
                    print(f"read-back verification FAILED: {bad.describe()}")
                    return 1
            print(f"direct write  threads={threads}  {_rate(nbytes, writes)}")
            print(f"direct read   threads={threads}  {_rate(nbytes, reads)}  "
                  f"(resident before read: max {max(resident)} B)")
            os.unlink(path)
    finally:
        if own_folder:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
