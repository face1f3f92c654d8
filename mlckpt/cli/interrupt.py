"""Ctrl-C at a self-launched `mlckpt run`: the prompt comes back only once the run's files are gone.

The terminal's SIGINT reaches mpiexec and the ranks as well as this process.  The ranks end; each
host's guardian removes what they wrote and then the checkpoint folder's lock
(:mod:`mlckpt.run.storage.folderlock`).  So this process does not kill mpiexec (a killed mpiexec takes the
ranks down before they can clean up, and returns the prompt over their files): it waits for
mpiexec, then for the lock its launch's run holds (the guardian releases it after its sweep,
which also removes the MPI segments its ranks mapped in /dev/shm), shows the removal and bounds it
(``BOUND_S``), removes the results folder this launch created if it stayed empty, and ends with
one line of its own.  Its own SIGINT handler counts the presses (no
KeyboardInterrupt, which could land anywhere in the cleanup): a second Ctrl-C does not cut the
cleanup short, it is told the cleanup is under way, with its bound.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mlckpt.errors import ExitStatus
from mlckpt.run.storage.cleanup import RUN_MARKER
from mlckpt.run.storage.folderlock import held_by_launch, lock_path, read_holder
from mlckpt.units import fmt_bytes

BOUND_S = 15.0  # from the Ctrl-C to the prompt, at most (then what is left is named)
MPIEXEC_GRACE_S = 10.0  # mpiexec ends its ranks; past this it is terminated, then killed


@dataclass(frozen=True)
class Launch:
    """What the self-launch knows of its run: the checkpoint folder (None: object storage), the
    launch token its rank 0 writes into the lock, the results folder and whether it existed
    before, and whether checkpoints are kept (checkpoint.keep, or a read-only invocation, which
    leaves its write invocation's checkpoints when it fails)."""

    folder: Path | None
    token: str
    results: Path
    results_existed: bool
    keep: bool


def _say(line: str) -> None:
    print(f"mlckpt: {line}", file=sys.stderr, flush=True)


def _contents(run_dir: Path) -> tuple[int, int]:
    """(checkpoint files, bytes) under a run folder (its marker is no checkpoint file)."""
    files, size = 0, 0
    for base, _dirs, names in os.walk(run_dir):
        for name in names:
            if name == RUN_MARKER:
                continue
            try:
                size += os.lstat(os.path.join(base, name)).st_size
                files += 1
            except OSError:
                pass
    return files, size


class Presses:
    """Ctrl-C presses while a launch runs, counted by this process's own SIGINT handler (no
    KeyboardInterrupt: one could land anywhere in the cleanup); the second one is answered. A
    SIGTERM (``kill``, a scheduler's cancel) counts as a press, and is passed on to mpiexec as
    the Ctrl-C the terminal would have sent its ranks."""

    def __init__(self) -> None:
        self.count = 0
        self.previous: object = None
        self.previous_term: object = None
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Presses:
        self.previous = signal.signal(signal.SIGINT, self.pressed)
        self.previous_term = signal.signal(signal.SIGTERM, self.terminated)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self.previous)  # type: ignore[arg-type]
        signal.signal(signal.SIGTERM, self.previous_term)  # type: ignore[arg-type]

    def terminated(self, _signum: int, frame: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.pressed(signal.SIGINT, frame)

    def pressed(self, _signum: int, _frame: object) -> None:
        self.count += 1
        if self.count == 1 and sys.stderr.isatty():
            sys.stderr.write("\n")  # the progress bar's line is not ours, nor the guardian's, to end with
        if self.count == 2:
            if sys.stderr.isatty():
                sys.stderr.write("\n")  # after the terminal's ^C
            _say(f"still removing the run's files (the prompt returns within {BOUND_S:.0f} s of the first "
                 "Ctrl-C)")


# What MPICH's mpiexec prints when its ranks end on an interrupt (its own lines, and the banner of
# a "bad termination"), a rank's own echo of it, and the traceback of a rank that the Ctrl-C caught
# while Python itself was starting (before mlckpt could take SIGINT): after a Ctrl-C they say
# nothing the launcher's lines do not, and looked like a crash.
NOISE = re.compile(
    r"^(\[mpiexec@[^\]]*\] .*|Sending Ctrl-C to processes as requested|Press Ctrl-C again to force abort"
    r"|=+|=   .*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*"
    r"|This typically refers to a problem with your application\.|Please see the FAQ page for "
    r"debugging suggestions|mlckpt: interrupted|Fatal Python error: .*|Python runtime state: .*"
    r"|Traceback \(most recent call last\):|  .*|KeyboardInterrupt|Current thread .*|Extension modules: .*"
    r"|)$")
HEARD = "Sending Ctrl-C to processes as requested"  # mpiexec may say so before this process's handler ran


class Relay:
    """One of mpiexec's output streams copied to ours as it comes. ``lines``: line by line (its
    stderr); else as bytes (stdout: a live bar's carriage returns pass as they are) until the
    interrupt. Once ``quiet()`` holds, or mpiexec said it passes a Ctrl-C on, NOISE is dropped."""

    def __init__(self, source: IO[bytes], target: IO[str], quiet: Callable[[], bool], lines: bool) -> None:
        self.source, self.target, self.quiet, self.lines = source, target, quiet, lines
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _write(self, data: bytes) -> None:
        try:  # bytes as they came (a live bar's carriage returns, any encoding)
            self.target.buffer.write(data)  # type: ignore[attr-defined]
        except AttributeError:  # a text stream without a buffer (a test's capture)
            self.target.write(data.decode(errors="replace"))
        self.target.flush()

    def _copy(self) -> None:
        fd, pending, heard = self.source.fileno(), b"", False
        while chunk := os.read(fd, 1 << 16):
            self.lines = self.lines or b"[mpiexec@" in chunk  # mpiexec speaks: whole lines from here
            if not (self.lines or self.quiet() or heard or pending):
                self._write(chunk)
                continue
            *complete, pending = (pending + chunk).split(b"\n")
            kept = []
            for raw in complete:
                text = raw.decode(errors="replace").rstrip("\r")
                heard = heard or HEARD in text
                if not ((self.quiet() or heard) and NOISE.match(text)):
                    kept.append(raw + b"\n")
            if kept:
                self._write(b"".join(kept))
        if pending and not ((self.quiet() or heard) and NOISE.match(pending.decode(errors="replace"))):
            self._write(pending)

    def join(self) -> None:
        self.thread.join(timeout=5.0)


def relayed(cmd: list[str], env: dict[str, str], out: IO[str] | None, presses: Presses
            ) -> tuple[subprocess.Popen[bytes], tuple[Relay, ...]]:
    """mpiexec started with its output relayed to ``out`` (default stdout) and stderr, where a person
    watches a terminal. Elsewhere (a batch job's file, a pipe) mpiexec writes to them itself: a
    launcher killed outright (a scheduler's SIGUSR1 or SIGKILL) must not take the ranks' and the
    guardians' last lines with it."""
    if not (sys.stdout.isatty() or sys.stderr.isatty()):
        proc = subprocess.Popen(cmd, env=env, stdout=out)
        presses.proc = proc
        return proc, ()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    presses.proc = proc
    quiet = lambda: presses.count > 0  # noqa: E731
    assert proc.stdout is not None and proc.stderr is not None
    return proc, (Relay(proc.stdout, out or sys.stdout, quiet, lines=False),
                  Relay(proc.stderr, sys.stderr, quiet, lines=True))


def wait(proc: subprocess.Popen[bytes], launch: Launch, presses: Presses, relays: tuple[Relay, ...] = ()
         ) -> int:
    """mpiexec's exit status, or after a Ctrl-C :func:`finish`'s; its output relayed to the end."""
    while not presses.count:
        try:
            status = proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue
        if not presses.count:  # (a Ctrl-C handled inside that wait still needs its cleanup)
            for relay in relays:
                relay.join()
            return status
    return finish(proc, launch, relays)


def finish(proc: subprocess.Popen[bytes], launch: Launch, relays: tuple[Relay, ...] = ()) -> int:
    """After a Ctrl-C: wait for the run to end and its files to go (bounded), then one line."""
    t0 = time.monotonic()
    deadline = t0 + BOUND_S
    holder = read_holder(launch.folder) if launch.folder is not None else None
    ours = holder is not None and holder.launch == launch.token
    run_dir = launch.folder / holder.run if ours and launch.folder is not None and holder else None
    files, size = _contents(run_dir) if run_dir is not None else (0, 0)
    if run_dir is None:
        _say("interrupted; ending the ranks")
    elif launch.keep:
        _say(f"interrupted; ending the ranks (the checkpoints in {run_dir} are kept)")
    else:
        _say(f"interrupted; ending the ranks and removing the run's {files} files ({fmt_bytes(size)}) "
             f"in {run_dir}")
    _end_mpiexec(proc, min(deadline, t0 + MPIEXEC_GRACE_S))
    if run_dir is None and launch.folder is not None:  # rank 0 took the lock after the Ctrl-C
        late = read_holder(launch.folder)
        if late is not None and late.launch == launch.token:
            run_dir = launch.folder / late.run
    while (launch.folder is not None and held_by_launch(launch.folder, launch.token)
           and time.monotonic() < deadline):
        time.sleep(0.05)
    _drop_empty_results(launch)
    for relay in relays:  # the ranks' last lines before the launcher's own
        relay.join()
    return _last_line(launch, run_dir, files, time.monotonic() - t0)


def _end_mpiexec(proc: subprocess.Popen[bytes], until: float) -> None:
    for stop in (None, proc.terminate, proc.kill):
        if stop is not None:
            stop()
        try:
            proc.wait(timeout=max(0.1, until - time.monotonic()) if stop is None else 2.0)
            return
        except subprocess.TimeoutExpired:
            continue


def _drop_empty_results(launch: Launch) -> None:
    if launch.results_existed:
        return
    try:
        launch.results.rmdir()  # only if empty: a bundle already written stays
    except OSError:
        pass


def _last_line(launch: Launch, run_dir: Path | None, files: int, took: float) -> int:
    if launch.folder is not None and held_by_launch(launch.folder, launch.token):
        left = _contents(run_dir)[0] if run_dir is not None else 0
        _say(f"interrupted; after {BOUND_S:.0f} s the run's cleanup has not finished: {left} files left in "
             f"{run_dir}; when no mlckpt process is left (pgrep -f 'mlckpt run'), remove it and "
             f"{lock_path(launch.folder)}")
        return ExitStatus.INTERRUPTED
    if run_dir is None:
        _say(f"interrupted; the run ended before it wrote any checkpoint ({took:.1f} s)")
    elif launch.keep and run_dir.exists():
        _say(f"interrupted; the run ended in {took:.1f} s; its checkpoints are kept in {run_dir} "
             "(checkpoint.keep=true, or a read-only invocation: run it again)")
    elif run_dir.exists():
        _say(f"interrupted; the run ended, but {_contents(run_dir)[0]} files are left in {run_dir}: "
             "remove them")
    else:
        _say(f"interrupted; the run ended and its {files} files were removed ({took:.1f} s)")
    return ExitStatus.INTERRUPTED
