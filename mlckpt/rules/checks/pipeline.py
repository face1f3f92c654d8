"""Check functions for a run's checkpoint mode and tiers (the ``result`` stage, rules 1.3 on).  Pure:
the pipeline run.json declares is the configuration's (PIPELINE-DECLARED), an asynchronous run's
stages follow one another per rank and checkpoint (ASYNC-TIMELINE), every drain from the fast tier
was verified (TIER-DRAIN-VERIFIED), and each restore read the tier the pipeline says holds its
checkpoint (TIER-RESTORE-SOURCE)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from mlckpt.rules.checks.result import writes_by_rank
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table, rank_shift
from mlckpt.rules.rundata import at, run_data, written
from mlckpt.workload.pipeline import DURABLE, Pipeline


def pipeline_declared(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Every write record follows the configured pipeline: its mode, its stages in order, and a
    training interval at least as long as configured (overlap is only credited for real time)."""
    d = run_data(ctx)
    pipe = Pipeline.of(d.config)
    want = list(pipe.stages)
    least = int(pipe.compute_interval_s * 1e9)
    for r in d.records:
        if r.get("op") != "write":
            continue
        tiers = [str(st.get("tier")) for st in r.get("stages", [])]
        ok = r.get("mode") == pipe.mode and tiers == want
        if not ok:
            yield Outcome(False, f"mode {pipe.mode}, stages {' → '.join(want)}",
                          f"mode {r.get('mode')}, stages {' → '.join(tiers) or 'none'}", where=at(r))
        elif int(r["compute_ns"]) < least:
            yield Outcome(False, f"a training interval of at least {pipe.compute_interval_s:g} s",
                          f"{int(r['compute_ns']) / 1e9:.3f} s", where=at(r))


def async_timeline(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """On each rank: request ≤ end of back-pressure ≤ blocking stage ≤ staged ≤ durable, stages
    one after another, the last one durable; the previous checkpoint was durable before this
    one's blocking stage (one staging slot); the part of a checkpoint's background work that
    training waited through (exposed) is within the next one's back-pressure and never more than
    the background work itself."""
    d = run_data(ctx)
    for _, recs in sorted(writes_by_rank(d).items()):
        for i, r in enumerate(recs):
            t0, staged, t1 = int(r["t0_ns"]), int(r["staged_ns"]), int(r["t1_ns"])
            bp, exposed = int(r["backpressure_ns"]), int(r["exposed_ns"])
            stages = list(r.get("stages", []))
            problem = None
            if not t0 + bp <= staged <= t1:
                problem = "t0 + backpressure <= staged <= t1 violated"
            elif not stages or stages[-1].get("tier") != DURABLE or int(stages[-1]["t1_ns"]) != t1:
                problem = "the last stage is the durable one and ends at t1"
            elif int(stages[0]["t0_ns"]) < t0 + bp or int(stages[0]["t1_ns"]) > staged:
                problem = "the blocking stage lies inside the stall, after the back-pressure wait"
            elif any(int(st["t1_ns"]) <= int(st["t0_ns"]) for st in stages):
                problem = "every stage takes a positive time"
            elif any(int(b["t0_ns"]) < int(a["t1_ns"]) for a, b in itertools.pairwise(stages)):
                # (the first background stage may start a moment before ``staged``: it is handed
                # over at the end of the blocking stage, before the training thread takes the time)
                problem = "stages run one after another"
            elif exposed > t1 - staged:
                problem = f"exposed {exposed} ns exceeds the background work ({t1 - staged} ns)"
            elif i + 1 < len(recs):
                nxt = recs[i + 1]
                if exposed > int(nxt["backpressure_ns"]):
                    problem = (f"exposed {exposed} ns exceeds write {nxt['index']}'s back-pressure "
                               f"{nxt['backpressure_ns']} ns")
                elif nxt.get("stages") and t1 > int(nxt["stages"][0]["t0_ns"]):
                    problem = f"durable after write {nxt['index']}'s blocking stage began (one staging slot)"
            if problem:
                yield Outcome(False, "an ordered checkpoint timeline", problem, where=at(r))
                break


def tier_drain_verified(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    if not Pipeline.of(d.config).tiered:
        yield Outcome(True)  # one tier: nothing to check
        return
    for r in d.records:
        if r.get("op") != "write":
            continue
        for st in r.get("stages", []):
            if st.get("tier") != DURABLE:
                continue
            ok = int(st.get("verified_bytes", -1)) == int(st["bytes"]) == int(r["bytes"]) \
                and int(st.get("mismatches", 1)) == 0
            if not ok:
                yield Outcome(False, f"{r['bytes']} B verified on the drain, 0 mismatches",
                          f"{st.get('verified_bytes')} B of {st['bytes']} verified, "
                          f"{st.get('mismatches')} mismatches",
                          where=f"write {r['index']} rank {r['rank']}")


def tier_restore_source(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Each restore read from the nearest tier holding a copy (mlckpt/workload/pipeline.py: restore_tier)."""
    d, plan = run_data(ctx), ctx.plan
    if plan is None:
        yield NotChecked("no run data or plan")
        return
    pipe = Pipeline.of(d.config)
    nw = written(d)
    host_of = {int(rank): str(h.get("host")) for h in d.run.get("hosts", []) for rank in h.get("ranks", [])}
    shift = int(d.run.get("rank_shift", rank_shift(ctx)))
    restore = str(d.config["checkpoint"]["restore"])
    writers_of: dict[int, set[str]] = {}  # a rank's restores all read the same files
    for r in d.records:
        if r.get("op") != "read":
            continue
        rank = int(r["rank"])
        if not 0 <= rank < plan.ranks:
            continue  # BYTES-PLAN reports it
        writers = writers_of.get(rank)
        if writers is None:
            reads = plan.restore_reads(rank, restore, shift)  # type: ignore[arg-type]
            writers = writers_of[rank] = {host_of.get(rd.writer, "?") for rd in reads}
        want = pipe.restore_tier(int(r["checkpoint"]), nw, writers, host_of.get(rank, "?"))
        if r.get("tier") != want:
            yield Outcome(False, f"restore from the {want} tier", f"{r.get('tier')} tier",
                          where=f"read {r['index']} rank {rank}")


CHECKS = checks_table(pipeline_declared, async_timeline, tier_drain_verified, tier_restore_source)
