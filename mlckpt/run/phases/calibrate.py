"""The host's own timing, measured before the first op (rules 1.8, run format 8).

The evidence rules bound how far apart a host's ranks leave an op's barrier (RECORDS-SKEW) and how
long before and after an op its leader reads the kernel's counters (DEVICE-COUNTERS).  A constant
fitted on one quiet machine is too tight for 64 ranks on 2 cores and too loose for 8 ranks on 128;
so every run first goes through the op's own choreography with no I/O in it, ``ROUNDS`` times,
with all its ranks running, and records what each host measured (``run.json``'s ``calibration``).
The checker derives each host's bounds from those samples (``mlckpt.rules.checks.timing``).

Each round is what :class:`mlckpt.run.collective.OpTimer` does around an op: a barrier, the
leader's counters, a second barrier, every rank's t0, the ranks waiting asleep for each other, the
agreement, the leader's counters again.

Rules 1.9 (run format 9): then every rank sleeps ``background_s`` between two of its leader's
counter samples, so the checker sees what other processes move on the device while the run does
nothing at all (a tenant's own rate, which over a short op cannot be told from the run's share).
"""

from __future__ import annotations

import time
from typing import Any

from mlckpt.attribution import backgrounds
from mlckpt.run.collective import OpTimer
from mlckpt.units import fmt_bytes

ROUNDS = 24
Round = tuple[int, int | None, int | None]  # t0, the counters before, the counters after


def _round(timer: OpTimer) -> Round:
    job = timer.job
    job.comm.Barrier()
    before = timer.probe()["t_ns"] if timer.probe is not None else None
    job.comm.Barrier()
    t0 = time.perf_counter_ns()
    job.idle_barrier()
    job.agree(None)
    after = timer.probe(closing=True)["t_ns"] if timer.probe is not None else None
    return t0, before, after


def _background(timer: OpTimer, seconds: float) -> dict[str, object] | None:
    """Every rank asleep for ``seconds`` between two of its host leader's counter samples; the
    leader of a host with a block device returns them (``calibration.hosts[].background``)."""
    job = timer.job
    job.comm.Barrier()
    leader = timer.probe is not None and timer.device is not None
    before = timer.probe() if leader else None  # type: ignore[misc]
    time.sleep(seconds)
    job.idle_barrier()
    after = timer.probe(closing=True) if leader else None  # type: ignore[misc]
    return {"device": timer.device, "before": before, "after": after} if leader else None


Row = tuple[str, int, list[Round], dict[str, object] | None]


def host_samples(rows: list[Row]) -> list[dict[str, Any]]:
    """Each host's samples from every rank's ``(host, rank, rounds, background)`` (pure): per
    round, the spread of its ranks' t0 (``skew_ns``), the leader's t0 after its first counters
    (``head_ns``) and its second counters after the host's last t0 (``tail_ns``); the leader's
    ``background`` where it took one.  Hosts in first-rank order."""
    by_host: dict[str, list[tuple[int, list[Round], dict[str, object] | None]]] = {}
    for host, rank, rounds, background in sorted(rows, key=lambda r: r[1]):
        by_host.setdefault(host, []).append((rank, rounds, background))
    out = []
    for host, ranks in by_host.items():
        leader, background = ranks[0][1], ranks[0][2]  # the host's first rank reads the counters
        skew, head, tail = [], [], []
        for k in range(len(leader)):
            t0s = [rounds[k][0] for _, rounds, _ in ranks]
            skew.append(max(t0s) - min(t0s))
            t0, before, after = leader[k]
            if before is not None and after is not None:
                head.append(t0 - before)
                tail.append(after - max(t0s))
        out.append({"host": host, "ranks": len(ranks), "skew_ns": skew, "head_ns": head, "tail_ns": tail,
                    **({"background": background} if background is not None else {})})
    return out


def calibrate(timer: OpTimer, rounds: int = ROUNDS, background_s: float = 0.0) -> dict[str, object] | None:
    """Every rank: ``rounds`` empty ops, then (``background_s`` > 0) the device's background.
    Rank 0 returns run.json's ``calibration`` block (the others None) and says in one line what
    the worst host measured."""
    job = timer.job
    with job.step("timing calibration"):
        collecting = timer.hold_gc()
        try:
            mine = [_round(timer) for _ in range(rounds)]
        finally:
            timer.release_gc(collecting)
    background = None
    if background_s > 0:
        with job.step("the device's background, the run idle"):
            background = _background(timer, background_s)
    rows = job.gather((job.host, job.rank, mine, background))
    if job.rank != 0:
        return None
    hosts = host_samples(rows)
    skew = max(max(h["skew_ns"]) for h in hosts)
    tails = [max(h["tail_ns"]) for h in hosts if h["tail_ns"]]
    job.say(f"timing calibration ({rounds} empty ops): a host's ranks leave a barrier within "
            f"{skew / 1e6:.1f} ms" + (f", counters read {max(tails) / 1e6:.1f} ms after an op's end"
                                       if tails else ""))
    block = {"rounds": rounds, "hosts": hosts}
    busiest = max(backgrounds({"calibration": block}), key=lambda b: b.foreign_bytes_per_s, default=None)
    if busiest is not None:
        moved = (f"{fmt_bytes(busiest.foreign_bytes_per_s)}/s" if busiest.window.foreign_bytes else "nothing")
        job.say(f"before the first op, with the run asleep {busiest.window.window_ns / 1e9:.1f} s, other "
                f"processes moved {moved} on device {busiest.device} (host {busiest.host})")
    return block
