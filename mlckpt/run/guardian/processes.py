"""Small readings of processes for the guardian: the launcher's rank numbers, how a process ended,
a process's name, and the guardian's scheduling class."""

from __future__ import annotations

import os
import signal


def launcher_rank() -> int | None:
    """This process's rank as the MPI launcher announces it (before MPI starts), if it does."""
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def local_rank() -> int | None:
    """This process's rank among its host's ranks, as the launcher announces it, if it does."""
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "PMI_LOCAL_RANK",
                "SLURM_LOCALID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


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


def realtime(on: bool) -> None:
    """Switch this process to the lowest real-time priority (SCHED_FIFO 1) or back; best effort:
    without the privilege it stays an ordinary process."""
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def comm_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""
