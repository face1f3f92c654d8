"""The result checks of what a run says about its requests, and of run.json's claims.  Pure.

RECORDS-REQUESTS (rules 1.10): each rank's requests, as its records carry them (records format 7,
mlckpt/latency.py), hold together with the rest of its record.  A histogram that does not decode,
or whose count is not its own, is no evidence; no request can take longer than the rank's whole
op, nor the op's phases add up to more than the op; and either every rank of an op carries its
requests or none does (a rank that drops its histogram would hide its slow requests from the
percentiles).

REQUESTS-PLANNED and REQUESTS-BUSY (rules 1.17) hold the histograms to what the engine must do:
it issues exactly one request per ``io.block_size`` piece of each file the plan gives the rank's op
(so a histogram re-encoded with more, faster requests is refused), and a rank has ``io.threads``
requests in flight at most, so its requests cannot add up to more than ``io.threads`` times its
op (so an op cut short with its real histogram kept is refused).  What they cannot see: latencies
edited coherently within both bounds (only a witness bounds time).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from mlckpt import latency
from mlckpt.rules.checks.result import op_files
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table, rank_shift
from mlckpt.rules.rundata import run_data
from mlckpt.workload.layout import file_requests

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
                longest, bucket, _ = d.blocks.get(id(r["requests"])) or latency.block_facts(
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


def requests_planned(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """REQUESTS-PLANNED: a record's request count is the engine's for the files the plan gives its
    op: one per ``io.block_size`` piece of each (records without requests: RECORDS-REQUESTS)."""
    data, plan = run_data(ctx), ctx.plan
    if plan is None:
        yield NotChecked("no plan")
        return
    block_size = int(data.config["io"]["block_size"])
    shift = int(data.run.get("rank_shift", rank_shift(ctx)))
    restore = str(data.config["checkpoint"]["restore"])
    wanted: dict[tuple[bool, int, bool], tuple[int, int]] = {}
    for r in data.records:
        rank = int(r["rank"])
        if "requests" not in r or not 0 <= rank < plan.ranks:  # (a rank outside: BYTES-MATCH-PLAN)
            continue
        key = (r["op"] == "write", rank, bool(r.get("direct")))
        if key not in wanted:
            files = op_files(plan, key[0], rank, restore, shift)
            wanted[key] = sum(file_requests(f.bytes, block_size, key[2]) for f in files), len(files)
        want, nfiles = wanted[key]
        got = r["requests"].get("count")
        if got != want:
            yield Outcome(False, f"{want} requests (one per io.block_size={block_size} piece of the op's "
                          f"{nfiles} files)", f"{got}", where=_at(str(r["op"]), int(r["index"]), r))


def requests_busy(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """REQUESTS-BUSY: a rank's requests, each counted at the least its histogram allows, add up to
    no more than ``io.threads`` requests in flight through the whole of its op."""
    data = run_data(ctx)
    threads = int(data.config["io"]["threads"])
    slack_ns = int(rule.params.get("slack_ns", 0))
    for r in data.records:
        if "requests" not in r:
            continue
        try:
            floor = (data.blocks.get(id(r["requests"])) or latency.block_facts(
                latency.decode(r["requests"]))).floor_ns
        except ValueError:
            continue  # no evidence: RECORDS-REQUESTS names it
        dur = int(r["t1_ns"]) - int(r["t0_ns"])
        if floor > threads * dur + slack_ns:
            yield Outcome(False, f"requests adding up to at most io.threads={threads} × the rank's op "
                          f"({threads * dur / 1e6:.3f} ms)", f"{floor / 1e6:.3f} ms of requests",
                          where=_at(str(r["op"]), int(r["index"]), r))


def _at(op: str, idx: int, r: Mapping[str, object]) -> str:
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


CHECKS = checks_table(request_evidence, requests_planned, requests_busy, run_claims)
