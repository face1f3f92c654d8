"""The LLM checkpointing sizer (the seed talk's "LLM Checkpointing Sizer").  Pure arithmetic.

Synchronous checkpointing stalls training for the checkpoint's write time, so with a checkpoint
every ``interval`` seconds the overhead fraction is ``write_time / interval``.  Solving for the
bandwidth that keeps overhead at ``f``: ``bandwidth = checkpoint_bytes / (f · interval)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlckpt.units import GB, GiB, fmt_bytes, fmt_duration
from mlckpt.workload.layout import Plan


@dataclass(frozen=True)
class SizerResult:
    checkpoint_bytes: int
    interval_s: float
    bandwidth_bytes_s: float
    write_time_s: float
    overhead_fraction: float
    restore_own_bytes: int
    restore_repopulate_bytes: int
    restore_own_s: float
    restore_repopulate_s: float
    steps: tuple[str, ...]  # the arithmetic, line by line

    def to_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "steps"}
        d["bandwidth_gib_s"] = self.bandwidth_bytes_s / GiB
        d["bandwidth_gb_s"] = self.bandwidth_bytes_s / GB
        d["steps"] = list(self.steps)
        return d


def size(plan: Plan, interval_s: float, *, overhead: float | None = None,
         bandwidth_bytes_s: float | None = None) -> SizerResult:
    """Exactly one of ``overhead`` (→ needed bandwidth) or ``bandwidth_bytes_s`` (→ overhead)."""
    if (overhead is None) == (bandwidth_bytes_s is None):
        raise ValueError("give exactly one of overhead or bandwidth")
    ckpt = plan.total_bytes
    own, rep = plan.restore_bytes("own"), plan.restore_bytes("repopulate")
    steps = [f"checkpoint = {ckpt:,} B ({fmt_bytes(ckpt)}) from {plan.workload.name} on "
             f"{plan.ranks} ranks"]
    if overhead is not None:
        budget = overhead * interval_s
        bw = ckpt / budget
        steps += [
            f"write-time budget = overhead × interval = {overhead:g} × {interval_s:g} s = "
            f"{budget:g} s",
            f"bandwidth needed = checkpoint / budget = {ckpt:,} B / {budget:g} s = "
            f"{bw / GiB:.2f} GiB/s ({bw / GB:.2f} GB/s)",
        ]
    else:
        assert bandwidth_bytes_s is not None
        bw = bandwidth_bytes_s
        steps.append(f"write time = checkpoint / bandwidth = {ckpt:,} B / {bw / GiB:.2f} GiB/s "
                     f"= {ckpt / bw:.2f} s")
        steps.append(f"overhead = write time / interval = {ckpt / bw:.2f} s / {interval_s:g} s = "
                     f"{ckpt / bw / interval_s:.2%}")
    write_s = ckpt / bw
    steps += [
        f"restore (own) = {own:,} B / {bw / GiB:.2f} GiB/s = {fmt_duration(own / bw)}",
        f"restore (repopulate: every replica reads its model states) = {rep:,} B / "
        f"{bw / GiB:.2f} GiB/s = {fmt_duration(rep / bw)}",
    ]
    return SizerResult(ckpt, interval_s, bw, write_s, write_s / interval_s, own, rep,
                       own / bw, rep / bw, tuple(steps))


# ---------------------------------------------------------------------- failures: the interval worth choosing
@dataclass(frozen=True)
class FailureResult:
    """What failures cost at a checkpoint interval, and the interval that costs least.

    ``cost_s`` is what training waits per checkpoint (the write time when synchronous, the stall
    when asynchronous); ``durable_after_s`` when the checkpoint is safe (equal to the cost when
    synchronous).  Young (1974): ``τ = √(2·C·M)``.  Daly (2006), for ``C < 2M``:
    ``τ = √(2·C·M)·(1 + ⅓·√(C/2M) + (C/2M)/9) − C``, else ``τ = M``.  A failure loses, on average,
    half a period of work plus the time until the last checkpoint was safe, plus the restore:
    ``lost = (τ + C)/2 + (D − C) + R``.  Wasted share of the job: ``C/τ + lost/M``."""

    mtbf_s: float
    cost_s: float
    durable_after_s: float
    restore_s: float
    interval_s: float
    young_interval_s: float
    daly_interval_s: float
    lost_per_failure_s: float
    wasted_fraction: float
    daly_lost_per_failure_s: float
    daly_wasted_fraction: float
    steps: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "steps"}
        d["steps"] = list(self.steps)
        return d


def _lost_and_waste(interval: float, cost: float, durable: float, restore: float, mtbf: float
                    ) -> tuple[float, float]:
    lost = (interval + cost) / 2 + (durable - cost) + restore
    return lost, cost / interval + lost / mtbf


def failure_cost(mtbf_s: float, cost_s: float, restore_s: float, interval_s: float,
                 durable_after_s: float | None = None) -> FailureResult:
    """The cost of failures at ``interval_s`` and at the optimal interval (all in seconds)."""
    if min(mtbf_s, cost_s, interval_s) <= 0 or restore_s < 0:
        raise ValueError("mtbf, cost and interval must be positive, restore not negative")
    durable = cost_s if durable_after_s is None else max(durable_after_s, cost_s)
    young = math.sqrt(2 * cost_s * mtbf_s)
    x = cost_s / (2 * mtbf_s)
    daly = young * (1 + math.sqrt(x) / 3 + x / 9) - cost_s if cost_s < 2 * mtbf_s else mtbf_s
    lost, waste = _lost_and_waste(interval_s, cost_s, durable, restore_s, mtbf_s)
    d_lost, d_waste = _lost_and_waste(daly, cost_s, durable, restore_s, mtbf_s)
    steps = (
        f"cost per checkpoint C = {cost_s:.2f} s (training waits), safe after D = {durable:.2f} s, "
        f"restore R = {restore_s:.2f} s, mean time between failures M = {fmt_duration(mtbf_s)}",
        f"optimal interval (Young) = √(2·C·M) = {fmt_duration(young)}; (Daly) = {fmt_duration(daly)}",
        f"at every {fmt_duration(interval_s)}: lost per failure = (τ + C)/2 + (D − C) + R = "
        f"{fmt_duration(lost)}; wasted = C/τ + lost/M = {waste:.2%} of the job",
        f"at the Daly interval: lost per failure = {fmt_duration(d_lost)}; wasted = {d_waste:.2%}",
    )
    return FailureResult(mtbf_s, cost_s, durable, restore_s, interval_s, young, daly, lost, waste,
                         d_lost, d_waste, steps)
