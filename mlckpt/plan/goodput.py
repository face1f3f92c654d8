"""Goodput: the share of a job's wall time that is useful training, given what each checkpoint
costs and how often the job fails, and the checkpoint interval that maximises it.  Pure.

The model is Daly's (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", Future Generation Computer Systems 22(3), 2006), failures arriving as a Poisson
process with mean time between failures ``M`` (the job's: a GPU's MTBF over the job's GPUs).
Training computes ``τ`` between checkpoints and waits ``C`` for each (the stall: the write time
when synchronous); after a failure it restores for ``R`` and redoes the work since the last
checkpoint that was safe.  Daly's expected wall time for ``W`` of work is
``M·e^(R/M)·(e^((τ+C)/M) − 1)·W/τ``, so::

    goodput  G(τ) = τ / (M · e^((R + D − C)/M) · (e^((τ+C)/M) − 1))

where ``D ≥ C`` is when a checkpoint is safe, counted from its start: an asynchronous checkpoint
is safe ``D − C`` after training resumes, and a failure in that window rolls back one checkpoint
further, which on average costs ``D − C`` more per failure; it enters as that much more restart
time (exact for a synchronous checkpoint, ``D = C``; to first order in ``(D − C)/M`` otherwise).

``G`` is largest where ``e^u − 1 = (τ/M)·e^u`` with ``u = (τ+C)/M``, which Lambert's W solves
exactly::

    τ* = M · (1 + W₀(−e^(−1 − C/M)))

Young's ``√(2CM)`` (J. W. Young, "A first order approximation to the optimum checkpoint
interval", CACM 17(9), 1974) is its first-order estimate and Daly's
``√(2CM)·(1 + √(C/2M)/3 + C/18M) − C`` (for ``C < 2M``) its higher-order one: τ* lies within 1 %
of Daly's and below Young's wherever ``C ≤ M/10`` (tests/unit/plan/test_goodput_model.py).  Neither
``R`` nor ``D`` moves τ*, but an asynchronous checkpoint cannot come more often than its
persisting allows: below ``τ = D − C`` the next checkpoint waits for the last one (back-pressure),
so the interval chosen is ``max(τ*, D − C)``.  The work a failure loses on average is the time
since the segment began, ``M − T/(e^(T/M) − 1)`` for a segment ``T = τ + C`` (about ``T/2``), plus
``D − C`` and the restore ``R``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlckpt.metrics import group_ops, op_stats
from mlckpt.workload.layout import make_plan, restore_pattern
from mlckpt.workload.model import workload_from_config
from mlckpt.workload.pipeline import DURABLE
from mlckpt.written import named_has


@dataclass(frozen=True)
class Costs:
    """What one checkpoint of the job costs, in seconds."""

    stall_s: float  # C: what training waits per checkpoint
    durable_s: float  # D: from the checkpoint's start until it is safe (at least C)
    restore_s: float  # R: from a failure's restart until training runs again

    def __post_init__(self) -> None:
        if not (self.stall_s > 0 and self.durable_s >= self.stall_s and self.restore_s >= 0):
            raise ValueError(f"a checkpoint's costs need 0 < stall ≤ durable and restore ≥ 0 (stall "
                             f"{self.stall_s}, durable {self.durable_s}, restore {self.restore_s})")


@dataclass(frozen=True)
class Goodput:
    """The interval that maximises goodput for ``costs`` at a job MTBF, and what it gives."""

    costs: Costs
    mtbf_s: float
    optimal_s: float  # τ*, Lambert W
    young_s: float
    daly_s: float
    keep_up_s: float  # D − C: the shortest interval persisting keeps up with
    interval_s: float  # max(τ*, D − C): the interval to choose
    goodput: float  # G at interval_s
    lost_per_failure_s: float  # at interval_s

    def to_dict(self) -> dict[str, float]:
        return {"stall_s": self.costs.stall_s, "durable_s": self.costs.durable_s,
                "restore_s": self.costs.restore_s, "mtbf_s": self.mtbf_s, "optimal_s": self.optimal_s,
                "young_s": self.young_s, "daly_s": self.daly_s, "keep_up_s": self.keep_up_s,
                "interval_s": self.interval_s, "goodput": self.goodput,
                "lost_per_failure_s": self.lost_per_failure_s}


def _branch_root(c: float) -> float:
    """``y = 1 + W₀(−e^(−1−c))``, the root in (0, 1) of ``−ln(1 − y) − y = c`` (take logarithms of
    ``w·e^w = −e^(−1−c)`` with ``w = y − 1``), by Newton's method: the left side is convex and
    increasing, so from a start where it is already past ``c`` every step lands closer from the
    same side.  Solved in ``y`` rather than ``w`` (log1p), so a checkpoint of 10 ms in a MTBF of
    months keeps its digits, where ``1 + w`` would cancel them."""
    if c <= 0:
        raise ValueError("the stall must be positive")
    y = min(math.sqrt(2 * c), -math.expm1(-c - 1))  # both are at or past the root
    if y >= 1.0:  # C/M beyond 36: the root is within e^-37 of 1 (checkpointing once per MTBF)
        return 1.0
    for _ in range(200):
        h = -math.log1p(-y) - y - c
        step = h * (1 - y) / y  # h / h'(y), h'(y) = y / (1 − y)
        if step <= 0:
            break
        y -= step
        if step <= 4e-16 * y:
            break
    return y


def goodput_at(interval_s: float, costs: Costs, mtbf_s: float) -> float:
    """G(τ): the share of wall time that is useful work at a checkpoint every ``interval_s`` of
    training (Daly's model, the module's docstring)."""
    if interval_s <= 0 or mtbf_s <= 0:
        raise ValueError("the interval and the MTBF must be positive")
    c, m = costs.stall_s, mtbf_s
    extra = costs.restore_s + costs.durable_s - c
    # in logarithms: a restore of many MTBFs gives a goodput of 0, not an overflow
    log_g = math.log(interval_s / m) - extra / m - _log_expm1((interval_s + c) / m)
    return math.exp(log_g)


def _log_expm1(u: float) -> float:
    """ln(e^u − 1) for u > 0, with its digits for u ≪ 1 (expm1) and no overflow for u ≫ 1."""
    return math.log(math.expm1(u)) if u < 30 else u + math.log1p(-math.exp(-u))


def lost_per_failure(interval_s: float, costs: Costs, mtbf_s: float) -> float:
    """The work a failure loses on average: the time since its segment began, the unsafe window of
    the last checkpoint, and the restore."""
    segment = interval_s + costs.stall_s
    since = mtbf_s - segment * math.exp(-_log_expm1(segment / mtbf_s))
    return since + (costs.durable_s - costs.stall_s) + costs.restore_s


def young(costs: Costs, mtbf_s: float) -> float:
    return math.sqrt(2 * costs.stall_s * mtbf_s)


def daly(costs: Costs, mtbf_s: float) -> float:
    c, m = costs.stall_s, mtbf_s
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def optimal_interval(costs: Costs, mtbf_s: float) -> float:
    """τ* = M·(1 + W₀(−e^(−1 − C/M))): where G is largest, persisting aside."""
    return mtbf_s * _branch_root(costs.stall_s / mtbf_s)


def best(costs: Costs, mtbf_s: float) -> Goodput:
    """The interval to choose for ``costs`` at a job MTBF of ``mtbf_s``, and what it gives."""
    if mtbf_s <= 0:
        raise ValueError("the MTBF must be positive")
    tau = optimal_interval(costs, mtbf_s)
    keep_up = costs.durable_s - costs.stall_s
    chosen = max(tau, keep_up)
    return Goodput(costs, mtbf_s, tau, young(costs, mtbf_s), daly(costs, mtbf_s), keep_up, chosen,
                   goodput_at(chosen, costs, mtbf_s), lost_per_failure(chosen, costs, mtbf_s))


# ------------------------------------------------------------------ a result's costs, at full size
@dataclass(frozen=True)
class Measured:
    """A checkpoint run's costs per checkpoint, as its records give them and projected to the full
    checkpoint of its workload on its ranks (a scaled run's bytes at the rates it measured)."""

    costs: Costs  # at full size
    as_run: Costs  # as measured
    writes: int  # checkpoints averaged
    reads: int  # restores averaged
    write_scale: float  # full checkpoint bytes ÷ measured bytes per checkpoint (1: a full-size run)
    read_scale: float

    def to_dict(self) -> dict[str, object]:
        return {"writes": self.writes, "reads": self.reads, "write_scale": self.write_scale,
                "read_scale": self.read_scale, "as_run": vars(self.as_run).copy(),
                "full_size": vars(self.costs).copy()}


def measured(records: Sequence[Mapping[str, Any]], config: Mapping[str, Any],
             framework: Mapping[str, object] | None = None) -> Measured:
    """The mean stall, time to durable and durable-tier restore of a checkpoint run's records, and
    the same at the full size of its workload (ValueError when the records hold no write or no
    restore from the durable tier).  A library run's costs are its library's checkpoints only."""
    writer = (framework or {}).get("writer")
    barrier = named_has(config.get("rules_version"), "barrier_start")
    mine = (r for r in records if writer is None or r.get("writer") in (None, writer))
    ops = [op_stats(recs) for recs in group_ops(mine, barrier=barrier).values()]
    writes = [o for o in ops if o.op == "write"]
    reads = [o for o in ops if o.op == "read" and o.tier in (None, DURABLE)]
    if not writes or not reads:
        raise ValueError(f"{len(writes)} checkpoint(s) and {len(reads)} restore(s) from the durable tier: "
                         "goodput needs both (a split result: give its read invocation's restore too)")
    stall = statistics.fmean(o.stall_s if o.stall_s is not None else o.duration_s for o in writes)
    durable = statistics.fmean(o.time_to_durable_s or o.duration_s for o in writes)
    restore = statistics.fmean(o.duration_s for o in reads)
    full = make_plan(workload_from_config(config["workload"]), int(config["ranks"]), 1.0)
    w_scale = full.total_bytes / statistics.fmean(o.bytes for o in writes)
    r_scale = full.restore_bytes(restore_pattern(str(config["checkpoint"]["restore"]))) / statistics.fmean(
        o.bytes for o in reads)
    as_run = Costs(stall, max(durable, stall), restore)
    return Measured(Costs(stall * w_scale, max(durable, stall) * w_scale, restore * r_scale), as_run,
                    len(writes), len(reads), w_scale, r_scale)


def at_reference(records: Sequence[Mapping[str, object]], config: Mapping[str, object],
                 framework: Mapping[str, Any] | None, reference: Mapping[str, Any] | None) -> Goodput | None:
    """A checkpoint result's goodput at a rules version's reference job (``goodput:``: ``gpus``
    of ``gpu_mtbf_s`` each), from its records at full size; None without a reference, or for
    records that hold no durable-tier restore (a write invocation alone)."""
    if not reference:
        return None
    try:
        costs = measured(records, config, framework).costs
    except ValueError:
        return None
    return best(costs, float(reference["gpu_mtbf_s"]) / int(reference["gpus"]))
