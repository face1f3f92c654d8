"""Rank 0's guardian: a helper process that names a rank killed mid-run and cleans up after it.

When a rank dies (SIGKILL, the OOM killer, a crash), mpiexec kills every other rank at once, rank
0 included, so no rank can say what happened nor remove the run's files.  So rank 0 forks, before
MPI starts, a small process in its own session (mpiexec's cleanup signals the ranks' process
groups, not it).  Rank 0 tells it over a pipe the ranks' pids and hosts, this run's planned paths
and the step in progress.  When rank 0 ends without saying goodbye, the guardian waits for this
host's ranks to be gone, prints one line naming the first local rank that died (life-pipe order),
its exit and the step it was in, removes this run's planned checkpoint files (``sweep_run``;
unless checkpoint.keep) and exits.  Its stdout and stderr are rank 0's, so mpiexec forwards that
line.  Ranks on other hosts are not watched: if none of this host's ranks died first, the line
says so.

:class:`GuardianState` is the pure part (messages in, who died first, the report line), unit
tested without processes; :func:`guardian_main` is the thin poll loop around it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlckpt.run.cleanup import sweep_run

SETTLE_S = 5.0  # how long the guardian lets this host's other ranks end before it sweeps


class Guardian:
    """Rank 0's end of the control pipe (see the module docstring)."""

    def __init__(self, wfd: int | None = None) -> None:
        self.wfd = wfd

    @classmethod
    def start(cls) -> Guardian | None:
        if launcher_rank() != 0 or not hasattr(os, "pidfd_open"):
            return None
        rfd, wfd = os.pipe()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(rfd)
            os.close(wfd)
            return None
        if pid == 0:  # the guardian
            code = 0
            try:
                os.close(wfd)
                guardian_main(rfd, parent)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(rfd)
        return cls(wfd)

    def send(self, **msg: Any) -> None:
        if self.wfd is None:
            return
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.wfd, data) :]
        except OSError:  # the guardian is gone: carry on without it
            self.close()

    def end(self, how: str) -> None:
        """Goodbye: ``clean`` (rank 0 finished and cleaned up) or ``reported`` (rank 0 reported the
        failure itself and is aborting the job)."""
        self.send(end=how)
        self.close()

    def close(self) -> None:
        if self.wfd is not None:
            fd, self.wfd = self.wfd, None
            try:
                os.close(fd)
            except OSError:
                pass


def launcher_rank() -> int | None:
    """This process's rank as the MPI launcher announces it (before MPI starts), if it does."""
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


_KEPT = ("run", "names", "keep", "dirs", "partial", "end", "final", "fast_run", "fast_dirs")


@dataclass
class GuardianState:
    """What the guardian knows: the messages rank 0 sent, and which rank ended first while the
    run was going on.  Pure: no processes, no files."""

    hosts: dict[int, str] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    how: dict[int, str] = field(default_factory=dict)  # rank -> "killed by signal 9, SIGKILL"
    step: str = "start-up"
    ckpt: int = 0  # the last checkpoint whose write started (files may exist up to it)
    cur: int = 0  # the checkpoint of the step in progress
    info: dict[str, Any] = field(default_factory=dict)  # the _KEPT keys rank 0 sent
    first: list[int] = field(default_factory=list)

    def handle(self, msg: dict[str, Any]) -> list[tuple[int, int, int | None]]:
        """Take one message; returns the (rank, pid, life-pipe fd) of this host's ranks to watch."""
        watch: list[tuple[int, int, int | None]] = []
        if "ranks" in msg:
            for rank, pid, host, life_fd in msg["ranks"]:
                self.hosts[rank] = host
                if host == msg["host"] and rank != 0:
                    self.pids[rank] = pid
                    watch.append((rank, pid, life_fd))
        if "step" in msg:
            self.step = str(msg["step"])
            self.cur = int(msg.get("ckpt", 0))
            if self.step.startswith("write "):
                self.ckpt = max(self.ckpt, self.cur)
        for k in _KEPT:
            if k in msg:
                self.info[k] = msg[k]
        return watch

    def ended(self, ranks: list[int]) -> None:
        """Ranks seen ending together; only the first such batch before the final step counts."""
        if ranks and not self.first and not self.info.get("final"):
            self.first.extend(sorted(ranks))

    @property
    def said_goodbye(self) -> bool:
        return bool(self.info.get("end"))

    def what(self) -> str:
        """Who died, during which step and (for a write or read) in which file."""
        culprits = self.first or [0]
        if len(culprits) == 1:
            rank = culprits[0]
            what = (
                f"rank {rank} on {self.hosts.get(rank, '?')} (pid {self.pids.get(rank, '?')}) "
                f"died during {self.step}"
            )
            what += f" ({self.how[rank]})" if self.how.get(rank) else ""
        else:
            what = (
                f"ranks {', '.join(map(str, culprits))} on {self.hosts.get(culprits[0], '?')} "
                f"died at the same moment during {self.step}"
            )
        op = self.step.split()[0] if self.step else ""
        run = self.info.get("run")
        if op in ("write", "read") and run and self.cur:
            cdir = Path(run) / f"ckpt-{self.cur:04d}"
            names = self.info.get("names") or []
            rank = culprits[0]
            if op == "write" and rank < len(names) and names[rank]:
                more = len(names[rank]) - 1
                what += f", writing {cdir / names[rank][0]}" + (f" (+{more} more)" if more else "")
            else:
                what += f", reading from {cdir}"
        return what

    def sweep(self) -> str:
        """Remove this run's planned files (effects: the files named by rank 0's messages)."""
        i = self.info
        names = [n for ns in i.get("names", []) for n in ns]
        note = "; " + sweep_run(
            Path(i["run"]),
            names,
            self.ckpt,
            keep=bool(i.get("keep")),
            dirs=i.get("dirs", []),
            partial=i.get("partial"),
        )
        if i.get("fast_run"):
            fast = sweep_run(
                Path(i["fast_run"]), names, self.ckpt, keep=bool(i.get("keep")), dirs=i.get("fast_dirs", [])
            )
            note += f" (fast tier: {fast.removeprefix('removed ')})"
        return note

    def report(self) -> str:
        line = f"mlckpt: error: {self.what()}; the MPI job was ended"
        if self.info.get("run"):
            try:
                line += self.sweep()
            except Exception as exc:  # never let cleanup hide the report
                line += f"; cleanup failed: {exc}"
        return line


def exit_how(pid: int) -> str:
    """How a process that just ended did so, read while it is a zombie (best effort)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
        code = int(raw[raw.rindex(")") + 2 :].split()[-1])  # field 52, exit_code
    except (OSError, ValueError, IndexError):
        return ""
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "?"
        return f"killed by signal {sig}, {name}"
    if os.WIFEXITED(code):
        return f"exited with status {os.WEXITSTATUS(code)}"
    return ""


def _realtime(on: bool) -> None:
    """Switch this process to the lowest real-time priority (SCHED_FIFO 1) or back; best effort:
    without the privilege it stays an ordinary process."""
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass


class _Watcher:
    """The guardian's file descriptors: the control pipe, pidfds and life pipes, in one poller.
    Who died first is told by the *life pipes*: each rank holds the write end of a pipe whose read
    end the guardian opens through /proc; it reports end of file the moment the rank's files are
    closed as it dies, before mpiexec can even notice and kill the others (pidfds only fire once a
    process is completely gone, which for a rank with a large address space can come after
    mpiexec has killed the rest).  The control pipe is rank 0's life pipe."""

    def __init__(self, rfd: int, parent: int, state: GuardianState) -> None:
        self.rfd, self.state = rfd, state
        self.poller = select.poll()
        self.poller.register(rfd, select.POLLIN)
        self.life: dict[int, int] = {}  # life-pipe fd -> rank
        self.pidfds: dict[int, tuple[int, int]] = {}  # pidfd -> (rank, pid)
        self.buf = b""
        state.pids[0] = parent
        try:
            pfd = os.pidfd_open(parent)
            self.pidfds[pfd] = (0, parent)
            self.poller.register(pfd, select.POLLIN)
        except OSError:
            pass

    def watch(self, rank: int, pid: int, life_fd: int | None) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            self.state.ended([rank])
            return
        except OSError:  # no pidfds here (old kernel): the life pipe alone will do
            pass
        else:
            self.pidfds[fd] = (rank, pid)
            self.poller.register(fd, select.POLLIN)
        if life_fd is not None:
            try:
                lfd = os.open(f"/proc/{pid}/fd/{life_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return  # the pidfd alone will do (if there is one)
            self.life[lfd] = rank
            self.poller.register(lfd, select.POLLIN)

    def gone(self, fd: int) -> int | None:
        """A pidfd fired: that process is completely gone.  Returns its rank if it has no life pipe."""
        rank, pid = self.pidfds.pop(fd)
        self.poller.unregister(fd)
        self.state.how[rank] = exit_how(pid)
        os.close(fd)
        return rank if rank not in self.life.values() else None  # rank 0: see run_until_rank0_gone

    def drop_life(self, fd: int) -> int:
        rank = self.life.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        return rank

    def read_control(self) -> bool:
        """Read rank 0's messages; False at end of file (rank 0 is gone)."""
        data = os.read(self.rfd, 1 << 16)
        if not data:
            self.poller.unregister(self.rfd)
            return False
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            for rank, pid, life_fd in self.state.handle(json.loads(line)):
                self.watch(rank, pid, life_fd)
        return True

    def run_until_rank0_gone(self) -> None:
        rank0_gone = False
        while not rank0_gone:
            batch: list[int] = []
            for fd, _ev in self.poller.poll():
                if fd == self.rfd:
                    if not self.read_control():
                        rank0_gone = True
                        batch.append(0)
                elif fd in self.life:
                    batch.append(self.drop_life(fd))
                elif fd in self.pidfds:
                    rank = self.gone(fd)
                    if rank == 0 and not rank0_gone:  # its control pipe is still open elsewhere
                        rank0_gone = True
                        batch.append(0)
                    elif rank:
                        batch.append(rank)
            self.state.ended(sorted(set(batch)))

    def settle(self, seconds: float) -> None:
        """Let this host's other ranks end (mpiexec is killing them), so nothing writes while the
        run's files are removed."""
        until = time.monotonic() + seconds
        while self.pidfds and time.monotonic() < until:
            for fd, _ev in self.poller.poll(100):
                if fd in self.pidfds:
                    self.gone(fd)
                elif fd in self.life:
                    self.drop_life(fd)


def guardian_main(rfd: int, parent: int) -> None:
    """The guardian process (see the module docstring)."""
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Who died first is only known if the guardian runs the moment a life pipe closes, before
    # mpiexec's proxy (woken by the same death) kills the rest: on a busy host a normal-priority
    # guardian can wake too late and see two deaths at once.  A real-time priority (where allowed)
    # makes it preempt the ranks and the proxy; it only ever sleeps in poll, so it costs nothing.
    _realtime(True)
    os.closerange(3, rfd)
    os.closerange(rfd + 1, 1 << 16)
    state = GuardianState(hosts={0: socket.gethostname()})
    watcher = _Watcher(rfd, parent, state)
    watcher.run_until_rank0_gone()
    _realtime(False)  # cleanup is ordinary work
    if state.said_goodbye:
        return
    watcher.settle(SETTLE_S)
    try:
        print(state.report(), file=sys.stderr, flush=True)
    except OSError:
        pass
