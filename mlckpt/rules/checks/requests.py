"""Rules 1.10's result checks of what a run says about itself.  Pure.

RECORDS-REQUESTS: each rank's requests, as its records carry them (records format 7,
mlckpt/latency.py), hold together with the rest of its record.

A histogram that does not decode, or whose count is not its own, is no evidence; no request can
take longer than the rank's whole op, nor the op's phases add up to more than the op; and either
every rank of an op carries its requests or none does (a rank that drops its histogram would hide
its slow requests from the percentiles).  What it cannot see: latencies edited coherently, each
still inside its op (only a witness bounds time).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt import latency
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import run_data

PHASE_SLACK_NS = 1_000_000  # the phases' own clock reads, between the op's t0 and t1


def request_evidence(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    if int(d.run.get("records_format", 0)) < 7:
        yield NotChecked("records before format 7 carry no requests")
        return
    for (op, idx), recs in d.grouped().items():
        carried = [r for r in recs if "requests" in r]
        if carried and len(carried) != len(recs):
            missing = sorted(int(r["rank"]) for r in recs if "requests" not in r)
            yield Outcome(False, "every rank's requests, or none", f"none from rank(s) {missing[:8]}",
                          where=f"{op} {idx}")
        for r in carried:
            try:  # the summary's recomputation (METRICS-RECOMPUTE, before this rule) decoded most
                longest, bucket = d.longest.get(id(r["requests"])) or latency.longest(
                    latency.decode(r["requests"]))
            except ValueError as exc:
                yield Outcome(False, "a histogram of the rank's requests", str(exc),
                              where=_at(op, idx, r))
                continue
            dur = int(r["t1_ns"]) - int(r["t0_ns"])
            if bucket > dur:
                yield Outcome(False, f"no request longer than the rank's op ({dur / 1e6:.3f} ms)",
                              f"a request of {longest / 1e6:.3f} ms", where=_at(op, idx, r))
            phases = sum(int(v) for v in (r.get("phases_ns") or {}).values())
            if phases > dur + PHASE_SLACK_NS:
                yield Outcome(False, f"phases within the rank's op ({dur / 1e6:.3f} ms)",
                              f"phases of {phases / 1e6:.3f} ms", where=_at(op, idx, r))


def _at(op: str, idx: int, r: Mapping[str, Any]) -> str:
    """Where a finding about one rank's requests is (made only for a finding)."""
    return f"{op} {idx}, rank {r['rank']}"


def run_claims(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """RUN-CLAIMS: what run.json says of the run that its configuration and records can check: the
    ``scaled`` flag is the configuration's scale below 1; every host run.json places ranks on has
    records, no record names a host run.json does not, and each record's rank sits on the host
    run.json places it (a host that nothing evidences would count on the leaderboard)."""
    d = run_data(ctx)
    scale = d.config.get("scale")
    if isinstance(scale, int | float) and "scaled" in d.run:
        yield Outcome(d.run["scaled"] == (scale < 1), f"run.json scaled={scale < 1} (scale {scale})",
                      f"scaled={d.run['scaled']}")
    placed = {int(r): str(h.get("host")) for h in d.run.get("hosts") or () for r in h.get("ranks") or ()}
    seen = {str(r["host"]) for r in d.records}
    for host in sorted(set(placed.values()) - seen):
        yield Outcome(False, "records from every host run.json places ranks on", f"none from host {host}")
    for host in sorted(seen - set(placed.values())):
        yield Outcome(False, "records only from hosts run.json names", f"records from host {host}")
    wrong = sorted({(int(r["rank"]), str(r["host"])) for r in d.records
                    if placed.get(int(r["rank"])) not in (None, str(r["host"]))})
    for rank, host in wrong[:3]:
        yield Outcome(False, f"rank {rank} on host {placed[rank]} (run.json)", f"its records from {host}")


CHECKS = checks_table(request_evidence, run_claims)
