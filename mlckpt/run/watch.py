"""The op watch: a rank that never gets to an op's agreement (a hung syscall, dead storage).

Every timed op is watched by a thread on rank 0 (:class:`OpWatch`, ``io.timeout_s``).  Every other
rank sends a small "done" message on a private duplicate communicator after taking its t1; the
watch collects them and, at the deadline, hands the ranks still missing to a stall handler (which
names them, removes this run's files and aborts the job: mlckpt/run/phases/stalls.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mpi4py.MPI import Intracomm, Request

WATCH_POLL_S = 0.01  # how often rank 0's op watch looks for the other ranks' "done"
DONE_TAG = 7  # tag of the "done" messages, on the runner's private duplicate communicator


class DoneChannel(Protocol):
    """What the op watch needs of a communicator (mpi4py's, or a test's fake)."""

    def done_from(self) -> int | None:
        """The rank of one pending "done" message, received; None if there is none."""

    def recv_done(self, source: int) -> None:
        """Receive the "done" message of ``source`` (waiting for it)."""


class MPIDone:
    """:class:`DoneChannel` over an mpi4py communicator (the runner's private duplicate)."""

    def __init__(self, comm: Intracomm) -> None:
        from mpi4py import MPI

        self.comm, self.any, self.status = comm, MPI.ANY_SOURCE, MPI.Status()

    def done_from(self) -> int | None:
        if not self.comm.Iprobe(source=self.any, tag=DONE_TAG, status=self.status):
            return None
        src = int(self.status.Get_source())
        self.comm.recv(source=src, tag=DONE_TAG)
        return src

    def recv_done(self, source: int) -> None:
        self.comm.recv(source=source, tag=DONE_TAG)

    def send_done(self, index: int) -> Request:
        return self.comm.isend(index, dest=0, tag=DONE_TAG)


class OpWatch:
    """Rank 0's deadline for one timed op (see the module docstring).  A thread, so it works
    whatever rank 0's main thread is doing (its own I/O, waiting in a collective, or stalled
    itself).  ``on_stall(late_ranks, elapsed_s)`` is called from the thread at the deadline."""

    def __init__(
        self,
        channel: DoneChannel,
        size: int,
        timeout_s: float,
        on_stall: Callable[[list[int], float], None],
        poll_s: float = WATCH_POLL_S,
    ) -> None:
        self.channel, self.timeout_s, self.on_stall, self.poll_s = channel, timeout_s, on_stall, poll_s
        self.start = time.monotonic()
        self.pending = set(range(1, size))
        self.own = False  # rank 0 finished its own part of the op
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="mlckpt-op-watch", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while self.pending and (src := self.channel.done_from()) is not None:
            self.pending.discard(src)

    def _loop(self) -> None:
        deadline = self.start + self.timeout_s
        while not self.finished.is_set():
            self._drain()
            if self.own and not self.pending:
                return
            now = time.monotonic()
            if now >= deadline:
                late = sorted(self.pending | ({0} if not self.own else set()))
                self.on_stall(late, now - self.start)
                return
            self.finished.wait(min(self.poll_s, deadline - now))

    def own_done(self) -> None:
        self.own = True

    def finish(self) -> None:
        """After the op's agreement (every rank has sent "done"): stop and collect the rest."""
        self.finished.set()
        self.thread.join()
        if self.own:
            for src in sorted(self.pending):
                self.channel.recv_done(src)
            self.pending.clear()
