"""The runner's side of the guardians on several hosts (before any I/O): link every host's
guardian to rank 0's, and tell each guardian whether the run's folders are shared between hosts
(so that exactly one guardian sweeps a shared folder after a failure).  See
:mod:`mlckpt.run.guardian`."""

from __future__ import annotations

import secrets
from pathlib import Path

from mlckpt.errors import ConfigError
from mlckpt.run.collective import Job
from mlckpt.run.guardian.link import CONNECT_S

KEY = "guardians"  # named in the refusal: there is no config key for this, it is the hosts' network


def link_guardians(job: Job, names: list[str]) -> None:
    """Every other host's guardian connects to rank 0's; a host that cannot is refused (exit 2).
    Inside a collective step: every rank fails alike."""
    g = job.guardian
    hub = job.comm.bcast(g.addresses() if job.rank == 0 and g is not None else None)
    # The job's secret, so that nothing else on the network can pose as one of its guardians.
    token = job.comm.bcast(secrets.token_hex(16) if job.rank == 0 else None)
    has = job.comm.allgather(g is not None)
    if not hub or g is None:
        return  # no hub (rank 0 could not fork one): each host's guardian still watches its ranks
    if job.rank == 0:
        expect = sorted({names[r] for r, yes in enumerate(has) if yes and names[r] != names[0]})
        if not expect:
            return
        got = g.ask(CONNECT_S + 5, expect=expect, token=token) or {}
        missing = sorted(set(expect) - set(got.get("linked", [])))
        if missing:
            raise ConfigError(
                f"{KEY}: the guardian{'s' if len(missing) > 1 else ''} of {', '.join(missing)} "
                f"could not reach rank 0's host {names[0]} over TCP within {CONNECT_S:g} s "
                f"(it listens on port {g.port}: TCP between the hosts must be open, as MPI needs)",
                key=KEY,
            )
    else:
        got = g.ask(CONNECT_S + 5, hub=hub, token=token) or {}
        if not got.get("linked"):
            raise ConfigError(
                f"{KEY}: {job.host} cannot reach rank 0's guardian on {names[0]} "
                f"({got.get('why', 'no answer')})",
                key=KEY,
            )


def tell_shared(job: Job, root: Path, leader: bool, what: str) -> None:
    """Whether ``root`` (made by every host's leader) is one folder for all hosts: rank 0 leaves a
    probe in it, every other leader looks for it.  The guardians are told (``what``: ``shared``
    for the run folder, ``fast_shared`` for the fast tier)."""
    probe = root / f".mlckpt-probe-{job.comm.bcast(secrets.token_hex(6) if job.rank == 0 else None)}"
    made = False
    if job.rank == 0:
        try:
            probe.touch()
            made = True
        except OSError:  # a full disk, say (the writes will say so)
            pass
    shared = False  # unknown: every guardian sweeps what it sees (a shared folder, more than once)
    if job.comm.bcast(made):  # (a collective: every rank gets here, whatever rank 0 met)
        seen = probe.exists() if leader else True
        shared = all(job.comm.allgather(seen))
        if job.rank == 0:
            probe.unlink(missing_ok=True)
    job.note(**{what: shared})
