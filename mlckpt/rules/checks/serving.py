"""Rules 1.13: serving runs, replicas loading a model's weights (mlckpt/workload/serving_run.py,
mlckpt/run/phases/loads.py).  Pure.

SERVING-SCOPE (config): what a serving run cannot be run with, refused before any I/O.
SERVING-DIRECT (config, rules 1.14): weights on files are read with O_DIRECT, never through a
page cache that the replicas of a host share.
SERVING-CLOSED (config): no closed serving workload is defined: a serving run is an open result.
SERVING-RECORDED (result): run.json's serving block is the configuration's.
SERVING-PLAN (result): each load's records are the plan rebuilt from the configuration and the
hosts run.json places the ranks on (``serving_metrics.held_to_plan``): a strategy relabelled, a
replica count not the records', a byte moved between the storage, the tier and the network is
named by rank.  What it cannot see: records invented whole and coherently for ranks that never
ran (the same limit as a checkpoint run's records without a witness).
SERVING-COLD (result): each load began with its files out of the page cache.
SERVING-SUMMARY (result): summary.json is what the records recompute to.
SERVING-COUNTERS (result, rules 1.14): each load inside its hosts' kernel counters, and the bytes
claimed from the storage read from it (by the ranks' own accounting and on the device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mlckpt.errors import ConfigError
from mlckpt.locations import is_object_url
from mlckpt.rules.checks.counters import BLOCK_FILESYSTEMS
from mlckpt.rules.checks.evidence import host_facts
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData, run_data
from mlckpt.serving_metrics import by_load, held_to_plan, summary
from mlckpt.strict import mapping_at
from mlckpt.units import fmt_share
from mlckpt.workload.serving_run import ServingRun, scope_problems
from mlckpt.written import Written


def serving_scope(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    bad = scope_problems(ctx.config, witnessed=bool(ruleset.data.get("serving", {}).get("witnessed")))
    return Outcome(not bad, "a serving run without them", "; ".join(bad))


def serving_direct(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """Rules 1.14: weights on files are read with O_DIRECT (objects have no page cache of the
    host's).  Buffered, the replicas on one host share the page cache."""
    return direct_on_files(ctx, "weights")


def direct_on_files(ctx: Context, what: str) -> Outcome:
    """``what`` on files is read with O_DIRECT; on objects, any way (no page cache of the host's)."""
    folder = str(ctx.get("checkpoint.folder") or "")
    direct = ctx.get("io.direct")
    return Outcome(is_object_url(folder) or direct is True, f"io.direct=true ({what} on files)",
                   f"io.direct={str(direct).lower()}")


def serving_closed(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    return Outcome(False, "division=open", f"division={ctx.division}")


def _run(ctx: Context) -> ServingRun:
    run = ServingRun.of(ctx.config)
    if run is None:  # the engine judges a serving rule on serving runs only
        raise TypeError("a serving rule was evaluated on a checkpoint run: declare kinds: [serving]")
    return run


def serving_recorded(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    d, run = run_data(ctx), _run(ctx)
    want = run.block()
    got = mapping_at(d.run, "serving")
    keys = [k for k in want if k != "node_tier"]  # the tier as each run resolved it
    diff = [f"{k}={got.get(k)!r}" for k in keys if got.get(k) != want[k]]
    if (got.get("node_tier") is None) != (want["strategy"] != "nodecache"):
        diff.append(f"node_tier={got.get('node_tier')!r}")
    return Outcome(not diff, ", ".join(f"{k}={want[k]!r}" for k in keys), ", ".join(diff) or "")


def rank_hosts(run_json: Mapping[str, Any], ranks: int) -> list[str] | None:
    """Each rank's host as run.json places it; None unless every rank is placed exactly once."""
    placed: dict[int, str] = {}
    for h in run_json.get("hosts") or ():
        for r in h.get("ranks") or ():
            if int(r) in placed:
                return None
            placed[int(r)] = str(h.get("host"))
    return [placed[r] for r in range(ranks)] if sorted(placed) == list(range(ranks)) else None


def serving_plan(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    d, run = run_data(ctx), _run(ctx)
    ranks = int(d.config["ranks"])
    hosts = rank_hosts(d.run, ranks)
    if hosts is None:
        yield Outcome(False, f"run.json placing each of the {ranks} ranks on one host", "not so")
        return
    try:
        plan = run.plan(d.config, hosts)
    except ConfigError as exc:
        yield Outcome(False, "a plan for the configuration", exc.message)
        return
    loads = by_load(d.records)
    others = sum(1 for r in d.records if r.get("op") != "load")
    if others:
        yield Outcome(False, "load records only", f"{others} records of checkpoint ops")
    if sorted(loads) != list(range(run.loads)):
        yield Outcome(False, f"loads 0..{run.loads - 1} (serving.loads={run.loads})",
                      f"loads {sorted(loads)[:8]}")
    for index, recs in loads.items():
        for problem in held_to_plan(plan, recs):
            yield Outcome(False, "as planned", problem, where=f"load {index}")
        for r in recs:
            yield from _exchange(run.strategy, r, f"load {index}")


EXCHANGE_SLACK_NS = 1_000_000  # the thread CPU clock's granularity, with margin


def _exchange(strategy: str, r: Mapping[str, Any], where: str) -> Iterator[Outcome]:
    """Records format 12: a fan-out load's exchange happened inside the load: its exposed tail and
    the CPU time of the one thread that drove it each at most the load's own time; no other
    strategy exchanges."""
    if "exchange_tail_ns" not in r and "exchange_cpu_ns" not in r:
        return
    if strategy != "fanout":
        yield Outcome(False, f"no exchange in a {strategy} load", f"rank {r['rank']} records one",
                      where=where)
        return
    took = int(r["t1_ns"]) - int(r["t0_ns"])
    for key in ("exchange_tail_ns", "exchange_cpu_ns"):
        if int(r.get(key, 0)) > took + EXCHANGE_SLACK_NS:
            yield Outcome(False, f"{key} within the load ({took / 1e6:.3f} ms)",
                          f"{int(r[key]) / 1e6:.3f} ms on rank {r['rank']}", where=where)


def serving_cold(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    d = run_data(ctx)
    bound = float(ruleset.data["cold_read"]["max_resident_fraction"])
    if d.run.get("storage", {}).get("kind") == "s3":
        return  # objects: no page cache of the host's holds them (resident_bytes is 0)
    for index, recs in by_load(d.records).items():
        served = sum(int(r["storage_bytes"]) for r in recs)
        resident = sum(int(r["resident_bytes"]) for r in recs)
        frac = resident / served if served else (1.0 if resident else 0.0)
        yield Outcome(frac <= bound, f"at most {bound:.0%} resident", f"{fmt_share(frac, bound, 1)} resident",
                      where=f"load {index}")


def serving_counters(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Rules 1.14: each load on each host inside its leader's kernel counters (read on leaving the
    load's barrier and after every rank agreed it ended, as around a checkpoint op), and the bytes
    the host's ranks claim from the storage read from it in that window: by the kernel's
    accounting of those ranks (``own_read_bytes``) and on the weights' device (``read_bytes``).
    Judged on a block filesystem, where every byte an O_DIRECT read claims must come from the
    device; objects and other filesystems are not judged (said as not checked)."""
    d = run_data(ctx)
    slack = float(ruleset.data["serving"]["counters_slack_fraction"])
    yield from each_read_counted(d, by_load(d.records), slack, "load",
                                 lambda hr: sum(int(r["storage_bytes"]) for r in hr))


Claim = Callable[[Sequence[Mapping[str, Any]]], int]


def each_read_counted(d: RunData, reads: Mapping[int, Sequence[Mapping[str, Any]]], slack: float, what: str,
                      claim: Claim) -> Iterator[Outcome | NotChecked]:
    """Each timed read (a load, a resume: ``reads``, its records by index) on each host inside its
    leader's kernel counters, and the bytes its ranks claim (``claim``: what the host's records
    say they read from the storage at least) read from the storage in that window; judged on a block
    filesystem only, never on objects."""
    if d.run.get("storage", {}).get("kind") == "s3":
        return  # objects: no device of the host's serves them
    facts = host_facts(d)
    for index, recs in reads.items():
        for host, hr in d.hosts(recs).items():
            where = f"{what} {index} on {host}"
            fs = str(((facts.get(host) or {}).get("filesystem") or {}).get("fs_type"))
            if fs not in BLOCK_FILESYSTEMS:
                yield NotChecked(f"{where}: the files on {fs}, not a block filesystem")
                continue
            leaders = [r for r in hr if isinstance(r.get("host_counters"), Mapping)]
            if len(leaders) != 1:
                yield Outcome(False, f"the host's counters on one record of the {what}",
                              f"on {len(leaders)} records", where=where)
                continue
            yield from counted(leaders[0]["host_counters"], hr, slack, where, claim)


def counted(hc: Mapping[str, Any], hr: Sequence[Mapping[str, Any]], slack: float, where: str,
            claim: Claim) -> Iterator[Outcome]:
    """One host's records of one timed read inside its leader's counters, and the bytes they claim
    to have read from the storage (``claim``) read from it in that window."""
    before, after = hc.get("before") or {}, hc.get("after") or {}
    start, end = min(int(r["t0_ns"]) for r in hr), max(int(r["t1_ns"]) for r in hr)
    yield Outcome(int(before.get("t_ns", start + 1)) <= start and int(after.get("t_ns", -1)) >= end,
                  "every rank of the host inside its counters' window", "a rank outside it", where=where)
    claimed = claim(hr)
    need = int(claimed * (1 - slack))
    for key, who in (("own_read_bytes", "the host's ranks read"), ("read_bytes", "the device read")):
        if key in before and key in after:
            got = int(after[key]) - int(before[key])
            yield Outcome(got >= need, f"{who} at least the {claimed} B its records claim from the storage",
                          f"{got} B", where=where)


def summarized(ruleset: RuleSet, data: RunData, run: ServingRun) -> dict[str, object]:
    """A serving run's summary.json from its records (the runner writes it, SERVING-SUMMARY
    recomputes it)."""
    written = Written.of(ruleset.version)
    return summary(run, data.records, ranks=int(data.config["ranks"]),
                   hosts=len({str(h.get("host")) for h in data.run.get("hosts") or ()}),
                   max_resident_fraction=float(ruleset.data["cold_read"]["max_resident_fraction"]),
                   formats=(written.summary, written.records))


def recomputed(ruleset: RuleSet, data: RunData, run: ServingRun) -> dict[str, object] | None:
    """:func:`summarized`, which the checker reports, never the claim; None where a record's
    duration is not positive (SERVING-PLAN says so)."""
    if any(int(r["t1_ns"]) <= int(r["t0_ns"]) for r in data.records if r.get("op") == "load"):
        return None
    return summarized(ruleset, data, run)


def serving_summary_exact(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d, run = run_data(ctx), _run(ctx)
    yield from summary_exact(recomputed(ruleset, d, run), d.summary, "SERVING-PLAN")


def summary_exact(want: Mapping[str, Any] | None, got: Mapping[str, Any], plan_rule: str
                  ) -> Iterator[Outcome | NotChecked]:
    """A summary against its recomputation (``want``; None where a record's duration is not
    positive, which ``plan_rule`` says), key by key: the first four that differ."""
    if want is None:
        yield NotChecked(f"records with non-positive durations (see {plan_rule})")
        return
    diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    shown = [f"{k}: {_short(got.get(k))} (recomputed {_short(want.get(k))})" for k in diff[:4]]
    yield Outcome(not diff, "every key as recomputed", "; ".join(shown))


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


CHECKS = checks_table(serving_scope, serving_direct, serving_closed, serving_recorded, serving_plan,
                      serving_cold, serving_counters, serving_summary_exact)
