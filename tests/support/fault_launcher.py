#!/usr/bin/env python3
"""TEST-ONLY: ``mlckpt run`` with faults injected through the runner's fault seam.

    python tests/support/fault_launcher.py run OVERRIDES...      (environment: the variables below)

Outside mpiexec it validates and self-launches exactly as ``mlckpt run`` does, with itself as the
rank command; under mpiexec each rank runs :func:`mlckpt.run.runner.mpi_main` with
:class:`EnvFaults`.  The product itself has no switch for any of this.

* ``MLCKPT_TEST_FAULT=KIND:R:OP:K`` (OP ``write``, ``read``, ``drain`` or a serving run's ``load``,
  counted from 0) acts on rank R inside
  its timed op OP K, after t0 and before its first byte.  KIND ``stall``: sleep forever (a stalled
  rank); ``kill``: SIGKILL itself; ``pause``: wait until the ready file is removed, then do the op;
  ``slow``: a slowed storage path, the op takes ``MLCKPT_TEST_SLOW_S`` seconds (default 6) longer;
  ``killmid``: start the op, SIGKILL itself ``MLCKPT_TEST_KILL_AFTER_S`` seconds (default 0.5) later.
  With ``MLCKPT_TEST_FAULT_READY=PATH`` the rank first writes its pid to PATH.
* ``MLCKPT_TEST_FLIP=R:I:OFF``: rank R flips one bit of byte OFF of its file I of checkpoint 1,
  between the writes and the restores (an object on object storage: read, flipped, put back).
* ``MLCKPT_TEST_FAST_FLIP=WHEN:R:K:I:OFF``: the same on the fast tier's copy of checkpoint K, at
  WHEN ``drain`` (before it is drained) or ``restore`` (before the restores).
* ``MLCKPT_TEST_CORRUPT``: ``truncate:R:I:N``, ``swap:R:S:I``, ``stale:R:I``, ``foreign:R:I:PATH``
  (see :meth:`EnvFaults.corrupt`), between the writes and the restores.
* ``MLCKPT_TEST_UNPLACED=1``: every restore reads all its bytes (through the engine or the library)
  into buffers of its own and never places them in the state: a loader that reads but drops.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlckpt import engine
from mlckpt.cli.run_cmd import find_mpiexec, launch, under_mpi
from mlckpt.command_line import run_guarded
from mlckpt.run.faults import Faults, Place
from mlckpt.run.runner import mpi_main

FAULT, READY, CORRUPT = "MLCKPT_TEST_FAULT", "MLCKPT_TEST_FAULT_READY", "MLCKPT_TEST_CORRUPT"
FLIP, FAST_FLIP, UNPLACED = "MLCKPT_TEST_FLIP", "MLCKPT_TEST_FAST_FLIP", "MLCKPT_TEST_UNPLACED"
ALL = (FAULT, READY, CORRUPT, FLIP, FAST_FLIP, UNPLACED, "MLCKPT_TEST_KILL_AFTER_S", "MLCKPT_TEST_SLOW_S")


def unplaced_restores() -> None:
    """Restores that read every byte into buffers of their own, never into the state: the engine's
    reads and the libraries' loads replaced in this rank's process."""
    import numpy as np

    from mlckpt.engine import frameworks

    read_files, load = engine.read_files, frameworks.load

    def read_elsewhere(files: Sequence[engine.FileIO], opts: Any) -> Any:
        return read_files([engine.FileIO(f.path, engine.alloc(max(engine.PAGE, f.buf.size)), f.nbytes)
                           for f in files], opts)

    def load_elsewhere(writer: str, cdir: Path, items: Sequence[Any], rank: int) -> None:
        load(writer, cdir, [dataclasses.replace(it, buf=np.zeros_like(it.buf)) for it in items], rank)

    engine.read_files = read_elsewhere  # type: ignore[assignment]
    frameworks.load = load_elsewhere  # type: ignore[assignment]


def flip_object_bit(url: str, offset: int) -> None:
    """The same on object storage: the object read, one bit flipped, the object put back whole."""
    import boto3
    from botocore.config import Config

    bucket, _, key = url.removeprefix("s3://").partition("/")
    c = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
    data = bytearray(c.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[offset] ^= 0x01
    c.put_object(Bucket=bucket, Key=key, Body=bytes(data))


def flip_bit(path: str, offset: int) -> None:
    if path.startswith("s3://"):
        flip_object_bit(path, offset)
        return
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        old = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([old[0] ^ 0x01]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    engine.evict(path)


def replace_with_copy(src: str, dst: str) -> None:
    """``dst`` becomes a copy of ``src`` (same directory temp file, then rename; fsynced)."""
    tmp = f"{dst}.mlckpt-test-tmp"
    shutil.copyfile(src, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dst)


class EnvFaults(Faults):
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        if env.get(UNPLACED):
            unplaced_restores()

    def timed_action(self, rank: int, op: str, index: int, action: Callable[[], Any]) -> Callable[[], Any]:
        spec = self.env.get(FAULT)
        if not spec:
            return action
        kind, frank, fop, findex = spec.split(":")
        if kind not in ("stall", "kill", "killmid", "pause", "slow"):
            raise ValueError(f"{FAULT}: unknown fault {kind!r}")
        if (int(frank), fop, int(findex)) != (rank, op, index):
            return action
        ready = self.env.get(READY)

        def faulty() -> None:
            if ready:
                with open(f"{ready}.tmp", "w") as fh:
                    fh.write(f"{os.getpid()}\n")
                os.replace(f"{ready}.tmp", ready)
            if kind == "slow":
                time.sleep(float(self.env.get("MLCKPT_TEST_SLOW_S", "6")))
                return action()
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "killmid":  # killed while its requests are in flight (parts sent, none complete)
                threading.Thread(target=action, daemon=True).start()
                time.sleep(float(self.env.get("MLCKPT_TEST_KILL_AFTER_S", "0.5")))
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "pause" and ready:
                while os.path.exists(ready):
                    time.sleep(0.01)
                return action()
            while True:  # stall
                time.sleep(3600)

        return faulty

    def after_writes(self, rank: int, durable: Place, fast_root: Path | None, plan: Any, nw: int) -> None:
        names = [f.name for f in plan.rank_plans[rank].files]
        if spec := self.env.get(FLIP):
            frank, index, offset = (int(x) for x in spec.split(":"))
            if frank == rank:
                flip_bit(durable.at(f"ckpt-0001/{names[index]}"), offset)
        self.fast_flip("restore", rank, nw, fast_root, names)
        if spec := self.env.get(CORRUPT):  # files only
            self.corrupt(spec, rank, Path(durable.at()), plan)

    def before_drain(self, rank: int, k: int, fast_root: Path, names: Sequence[str]) -> None:
        self.fast_flip("drain", rank, k, fast_root, names)

    def fast_flip(self, when: str, rank: int, k: int, fast_root: Path | None, names: Sequence[str]) -> None:
        spec = self.env.get(FAST_FLIP)
        if not spec or fast_root is None:
            return
        fwhen, frank, fk, index, offset = spec.split(":")
        if (fwhen, int(frank), int(fk)) == (when, rank, k):
            flip_bit(str(fast_root / f"ckpt-{k:04d}" / names[int(index)]), int(offset))

    @staticmethod
    def corrupt(spec: str, rank: int, root: Path, plan: Any) -> None:
        """``truncate:R:I:N``: rank R truncates its file I of checkpoint 1 to N bytes;
        ``swap:R:S:I``: rank R swaps its file I of checkpoint 1 with rank S's file I;
        ``stale:R:I``: rank R replaces its file I of checkpoint 2 with a copy of checkpoint 1's;
        ``foreign:R:I:PATH``: rank R replaces its file I of checkpoint 1 with a copy of PATH."""
        kind, _, rest = spec.partition(":")
        parts = rest.split(":", 3 if kind == "foreign" else -1)
        if int(parts[0]) != rank:
            return
        mine = plan.rank_plans[rank].files
        c1 = root / "ckpt-0001"
        if kind == "truncate":
            touched = [c1 / mine[int(parts[1])].name]
            os.truncate(touched[0], int(parts[2]))
        elif kind == "swap":
            index = int(parts[2])
            a, b = c1 / mine[index].name, c1 / plan.rank_plans[int(parts[1])].files[index].name
            tmp = c1 / f"{a.name}.mlckpt-test-tmp"
            os.rename(a, tmp)
            os.rename(b, a)
            os.rename(tmp, b)
            touched = [a, b]
        elif kind == "stale":
            name = mine[int(parts[1])].name
            touched = [root / "ckpt-0002" / name]
            replace_with_copy(str(c1 / name), str(touched[0]))
        elif kind == "foreign":
            touched = [c1 / mine[int(parts[1])].name]
            replace_with_copy(parts[2], str(touched[0]))
        else:
            raise ValueError(f"{CORRUPT}: unknown corruption {kind!r}")
        for path in touched:
            engine.evict(str(path))


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] != "run":
        print("usage: fault_launcher.py run OVERRIDES...", file=sys.stderr)
        return 2
    overrides = list(argv[1:])
    if under_mpi():
        return mpi_main(overrides, faults=EnvFaults({k: v for k, v in os.environ.items() if k in ALL}))
    here = [sys.executable, os.path.abspath(__file__), "run"]
    return run_guarded(lambda: launch(find_mpiexec(None), overrides, rank_command=here))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
