"""What one host's guardian knows and decides (pure: messages in, decisions and lines out).

Every host's first rank (its *leader*) has a guardian (:mod:`mlckpt.run.guardian`).  Rank 0's is
the *hub*; the others are *spokes*, linked to it (:mod:`mlckpt.run.guardian.link`).  The state here
takes the leader's notes (ranks, step, this run's planned paths), the deaths of this host's ranks,
the messages from the other guardians and the loss of a link, and answers three questions once the
job has ended without the leader's goodbye:

* who failed first: a rank of this host (the first batch seen ending), a rank of another host (the
  hub's verdict: the first report it received wins), or a host lost from contact;
* whether this guardian prints the one line (:attr:`GuardianState.printer`): the guardian of the
  host where the failure was seen first, or the one that lost contact; never a second one;
* what it sweeps (:meth:`GuardianState.sweep_parts`): the printer removes everything of the run it
  can reach; the others only what sits on their own host (a node-local run folder or fast tier),
  so that the shared folder is swept once and the count in the line is true.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

from mlckpt.run.guardian.link import CONTACT_S
from mlckpt.run.storage.cleanup import remove_shm, shm_mapped_by
from mlckpt.run.storage.kinds import sweep

# Signals that end a job step on purpose (scancel, a time limit, Slurm's --signal, Ctrl-C).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
_KEPT = ("run", "names", "keep", "dirs", "partial", "end", "final", "fast_run", "fast_dirs",
         "shared", "fast_shared", "s3")


def ranks_text(ranks: list[int]) -> str:
    """``4`` / ``4-7`` / ``4, 6``: ranks as a person reads them."""
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def ranks_phrase(ranks: list[int]) -> str:
    """``rank 4`` / ``ranks 4-7``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"


@dataclass
class GuardianState:
    """One guardian's knowledge (see the module docstring)."""

    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host, every rank of the job
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid, this host's ranks
    how: dict[int, str] = field(default_factory=dict)  # rank -> "killed by signal 9, SIGKILL"
    step: str = "start-up"
    ckpt: int = 0  # the last checkpoint prepared or written (files may exist up to it)
    cur: int = 0  # the checkpoint of the step in progress
    info: dict[str, Any] = field(default_factory=dict)  # the _KEPT keys the leader sent
    first: list[int] = field(default_factory=list)  # this host's first ranks to end
    hub: bool = True  # rank 0's guardian (False: another host's)
    host: str = ""
    leader_pid: int = 0
    elsewhere: str = ""  # the hub's verdict: the first failure was on another host (its line)
    confirmed: bool = False  # the hub's verdict: this host's report was the first
    lost: list[str] = field(default_factory=list)  # hosts (or "hub") no longer heard from
    job_end: str = ""  # the hub said the job ended ("clean" or "reported" by rank 0)
    stopped: str = ""  # what a spoke that lost the hub stopped ("ranks 4-7 and their MPI proxy")
    cancelled: str = ""  # the signal the guardian itself received with its step ("SIGTERM": scancel)
    shm: set[str] = field(default_factory=set)  # this host's ranks' MPI segments in /dev/shm

    def handle(self, msg: dict[str, Any]) -> list[tuple[int, int, int | None]]:
        """Take one note from the leader; returns the (rank, pid, life-pipe fd) of this host's
        other ranks, to watch."""
        watch: list[tuple[int, int, int | None]] = []
        if "ranks" in msg:
            self.host = str(msg["host"])
            for rank, pid, host, life_fd in msg["ranks"]:
                self.hosts[rank] = host
                if host == self.host:
                    self.pids[rank] = pid
                    if pid != self.leader_pid:
                        watch.append((rank, pid, life_fd))
            # MPI's shared memory is in place by now: what the sweep may remove if they are killed
            self.shm |= shm_mapped_by(list(self.pids.values()))
        if "step" in msg:
            self.step = str(msg["step"])
            self.cur = int(msg.get("ckpt", 0))
            if self.step.startswith("write "):
                self.ckpt = max(self.ckpt, self.cur)
        if "made" in msg:  # checkpoint k's folders (and files) may exist from its preparation on
            self.ckpt = max(self.ckpt, int(msg["made"]))
        for k in _KEPT:
            if k in msg:
                self.info[k] = msg[k]
        return watch

    @property
    def leader(self) -> int:
        return next((r for r, p in self.pids.items() if p == self.leader_pid), 0)

    @property
    def quiet(self) -> bool:
        """Ends from now on are expected: the run is finishing, or rank 0 ended the job itself."""
        return bool(self.info.get("final") or self.info.get("end") or self.job_end or self.elsewhere)

    def hello_from(self, msg: dict[str, object], token: str, linked: set[str]) -> str | None:
        """The host a spoke's hello names, if the hub takes it: the job's secret, one of the job's
        other hosts, not linked yet.  Anything else on the port (a scanner, another job) is not a
        peer: were it taken, its silence would end a healthy job."""
        host = str(msg.get("hello", ""))
        ok = (bool(token) and msg.get("token") == token and host in self.hosts.values()
              and host != self.host and host not in linked)
        return host if ok else None

    def ended(self, ranks: list[int]) -> bool:
        """Ranks seen ending together; only the first such batch counts, and only while a death
        is news.  True when this batch is the first (to be reported to the hub)."""
        if ranks and not self.first and not self.quiet and not self.lost:
            self.first.extend(sorted(ranks))
            return True
        return False

    def report_msg(self) -> dict[str, object]:
        """This host's first death, for the hub."""
        return {"dead": self.first, "host": self.host, "line": self.what()}

    def verdict(self, msg: dict[str, object]) -> None:
        """The hub's word on which death came first (spokes)."""
        if msg.get("host") == self.host and msg.get("dead") == self.first:
            self.confirmed = True
        elif not self.confirmed:
            self.elsewhere = str(msg.get("line", "another host"))

    def arbitrate(self, msg: dict[str, object]) -> bool:
        """A spoke's report reached the hub: the first report (or this host's own first death,
        if earlier) wins.  True when ``msg`` wins (the hub then tells every spoke)."""
        if self.first or self.elsewhere or self.lost or self.quiet:
            return False
        self.elsewhere = str(msg.get("line", ""))
        return True

    @property
    def said_goodbye(self) -> bool:
        return bool(self.info.get("end"))

    @property
    def waiting_for_verdict(self) -> bool:
        """A spoke that reported the first death here waits for the hub's word before printing."""
        return not self.hub and bool(self.first) and not (
            self.confirmed or self.elsewhere or self.lost or self.job_end
        )

    @property
    def deputy(self) -> bool:
        """This host is the first after rank 0's (by rank): the one spoke that speaks when rank
        0's host is lost, so that the survivors print one line, not one each."""
        first = self.hosts.get(0)
        others = sorted(r for r, h in self.hosts.items() if h != first)
        return bool(others) and self.hosts[others[0]] == self.host

    @property
    def printer(self) -> bool:
        if self.lost:
            return self.hub or self.deputy
        if self.elsewhere or self.job_end:
            return False
        return self.hub or bool(self.first)

    def where(self, culprit: int) -> str:
        op = self.step.split()[0] if self.step else ""
        run = self.info.get("run")
        if op not in ("write", "read") or not run or not self.cur:
            return ""
        cdir = f"{str(run).rstrip('/')}/ckpt-{self.cur:04d}"  # a folder or a store's prefix alike
        names = self.info.get("names") or []
        if op == "write" and culprit < len(names) and names[culprit]:
            more = len(names[culprit]) - 1
            return f", writing {cdir}/{names[culprit][0]}" + (f" (+{more} more)" if more else "")
        return f", reading from {cdir}"

    def what(self) -> str:
        """Who failed, during which step and (for a write or read) in which file."""
        if self.lost:
            return self.lost_what()
        culprits = self.first or [self.leader]
        if len(culprits) == 1:
            rank = culprits[0]
            how = self.how.get(rank, "") or (f"{self.cancelled} to the job step" if self.cancelled else "")
            stopped = how.endswith(STOP_SIGNALS) or bool(self.cancelled)  # cancelled, not a crash
            what = (
                f"rank {rank} on {self.hosts.get(rank, '?')} (pid {self.pids.get(rank, '?')}) "
                f"{'was stopped' if stopped else 'died'} during {self.step}"
            )
            what += f" ({how}{': the job was cancelled' if stopped else ''})" if how else ""
        else:
            hows = {self.how.get(r, "") for r in culprits}
            stopped = all(h.endswith(STOP_SIGNALS) for h in hows)  # Ctrl-C reaches every rank at once
            what = (
                f"ranks {', '.join(map(str, culprits))} on {self.hosts.get(culprits[0], '?')} "
                f"{'were stopped' if stopped else 'died'} at the same moment during {self.step}"
                + (f" ({', '.join(sorted(hows))}: the job was cancelled)" if stopped else "")
            )
        return what + self.where(culprits[0])

    def ranks_on(self, host: str) -> list[int]:
        return sorted(r for r, h in self.hosts.items() if h == host)

    def lost_what(self) -> str:
        silent = f"nothing heard for {CONTACT_S:g} s: a network partition, or that host is down"
        if not self.hub:
            mine = self.ranks_on(self.host)
            return (f"{ranks_phrase(mine)} on {self.host} lost contact with rank 0's host "
                    f"{self.hosts.get(0, '?')} during {self.step} ({silent}; "
                    f"every host's guardian stops its own ranks)")
        who = "; ".join(f"{h} ({ranks_phrase(self.ranks_on(h))})" for h in self.lost)
        return f"lost contact with {who} during {self.step} ({silent})"

    def sweep_parts(self) -> tuple[bool, bool]:
        """(run folder, fast tier): which of them this guardian sweeps (see the module docstring)."""
        if self.printer:
            return True, True
        return not self.info.get("shared", True), not self.info.get("fast_shared", False)

    def sweep(self) -> str:
        """Remove this run's planned files this guardian is responsible for (effects: the files
        named by the leader's notes)."""
        i = self.info
        names = [n for ns in i.get("names", []) for n in ns]
        run_part, fast_part = self.sweep_parts()
        note = ""
        if run_part and i.get("run"):
            note = "; " + sweep(str(i["run"]), names, self.ckpt, keep=bool(i.get("keep")), s3=i.get("s3"),
                                dirs=i.get("dirs", []), partial=i.get("partial") if self.hub else None)
        elif self.hub and i.get("partial"):  # rank 0's unfinished result folder is the hub's alone
            shutil.rmtree(i["partial"], ignore_errors=True)
        if fast_part and i.get("fast_run"):
            fast = sweep(str(i["fast_run"]), names, self.ckpt, keep=bool(i.get("keep")),
                         dirs=i.get("fast_dirs", []))
            note += f" (fast tier{'' if self.hub else ' on ' + self.host}: {fast.removeprefix('removed ')})"
        return note

    def headline(self) -> str:
        # Ctrl-C at the terminal (SIGINT to every rank) is the user's own stop, not an error.
        culprits = self.first or [self.leader]
        interrupted = not self.lost and all(self.how.get(r, "").endswith("SIGINT") for r in culprits)
        line = f"mlckpt: {'interrupted' if interrupted else 'error'}: {self.what()}"
        return line + (f"; stopped {self.stopped}" if self.stopped else "; the MPI job was ended")

    def swept(self) -> str:
        """Sweep (:meth:`sweep`) and say what was done, never raising."""
        remove_shm(self.shm)  # what the killed ranks' MPI left in this host's memory
        if not self.info.get("run"):
            return ""
        try:
            return self.sweep()
        except Exception as exc:  # never let cleanup hide the report
            return f"; cleanup failed: {exc}"

    def report(self) -> str:
        return self.headline() + self.swept()
