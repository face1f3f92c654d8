"""RECORDS-REQUESTS (rules 1.10): each rank's requests, as its records carry them (records format 7,
mlckpt/latency.py), hold together with the rest of its record.  Pure.

A histogram that does not decode, or whose count is not its own, is no evidence; no request can
take longer than the rank's whole op, nor the op's phases add up to more than the op; and either
every rank of an op carries its requests or none does (a rank that drops its histogram would hide
its slow requests from the percentiles).  What it cannot see: latencies edited coherently, each
still inside its op (only a witness bounds time).
"""

from __future__ import annotations

from collections.abc import Iterator

from mlckpt import latency
from mlckpt.metrics import group_ops
from mlckpt.rules.checks.result import _run
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table

PHASE_SLACK_NS = 1_000_000  # the phases' own clock reads, between the op's t0 and t1


def request_evidence(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = _run(ctx)
    if int(d.run.get("records_format", 0)) < 7:
        yield NotChecked(rule.id, "records before format 7 carry no requests")
        return
    for (op, idx), recs in group_ops(d.records).items():
        carried = [r for r in recs if "requests" in r]
        if carried and len(carried) != len(recs):
            missing = sorted(int(r["rank"]) for r in recs if "requests" not in r)
            yield Outcome(False, "every rank's requests, or none", f"none from rank(s) {missing[:8]}",
                          where=f"{op} {idx}")
        for r in carried:
            where = f"{op} {idx}, rank {r['rank']}"
            try:
                h = latency.decode(r["requests"])
            except ValueError as exc:
                yield Outcome(False, "a histogram of the rank's requests", str(exc), where=where)
                continue
            dur = int(r["t1_ns"]) - int(r["t0_ns"])
            longest = h.get_max_value()
            if h.get_lowest_equivalent_value(longest) > dur:
                yield Outcome(False, f"no request longer than the rank's op ({dur / 1e6:.3f} ms)",
                              f"a request of {longest / 1e6:.3f} ms", where=where)
            phases = sum(int(v) for v in (r.get("phases_ns") or {}).values())
            if phases > dur + PHASE_SLACK_NS:
                yield Outcome(False, f"phases within the rank's op ({dur / 1e6:.3f} ms)",
                              f"phases of {phases / 1e6:.3f} ms", where=where)


CHECKS = checks_table(request_evidence)
