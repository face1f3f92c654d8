"""Check functions that cross-examine a finished run's evidence (rules 1.2 on).  Pure.

A trusted vendor can edit a bundle and re-sign it; every integrity rule then holds.  These checks
look for what such an edit has to keep consistent and usually does not: the summary against its
own records and plan, the records against each other (barrier skew, copied timings), against the
flags the engine recorded, against each host's clocks and physics (memory copy rate, network
links), and against the kernel's own counters sampled around every op.  Each bound comes from
``rules.yaml`` (``evidence:``), where it is justified by measurements of honest runs.  What a
coherent forger can still do is written down in the docs ("What the checker can prove").
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mlckpt.attribution import cpu_window_s, foreign_summary
from mlckpt.dlio import DlioFacts, completed
from mlckpt.locations import is_object_url
from mlckpt.rules.checks.result import compare_values, writes_by_rank
from mlckpt.rules.checks.timing import abs_bound_ns, calibration_outcomes
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData, at, run_data, summary_format
from mlckpt.workload.frameworks import ENGINE
from mlckpt.workload.pipeline import DURABLE, Pipeline

# summary.json keys SUMMARY-EXACT compares with their recomputation (METRICS-RECOMPUTE compares
# the statistics): the plan's bytes, the read validity, and DLIO's shape (format 2: dlio_compat).
EXACT_KEYS = ("checkpoint_bytes", "restore_bytes", "read_valid")
DLIO_KEYS = ("metric", "start", "end", "num_accelerators", "num_hosts", "hostname", "host_cpu_count",
             "host_memory_GB", "epochs", "mlckpt_timing_basis", "mlckpt_read_guarantee")

Rec = Mapping[str, Any]
def evidence_bounds(ruleset: RuleSet) -> Mapping[str, Any]:
    return ruleset.data["evidence"]


def op_end(r: Rec) -> int:
    """Where the timed op of a record ended on its rank: a write's stall ends at ``staged_ns``
    (its background stages may go on), a read at ``t1_ns``."""
    return int(r["staged_ns"]) if r["op"] == "write" and "staged_ns" in r else int(r["t1_ns"])


def host_facts(data: RunData) -> dict[str, Mapping[str, Any]]:
    return {str(h.get("hostname")): h for h in data.system.get("hosts", [])}


def counted_op(data: RunData, r: Rec) -> bool:
    """Whether the op's bytes cross the durable tier's device inside the record's own op window:
    sync one-tier writes with fsync or O_DIRECT, restores from the durable tier, and a resume run's
    resumes (each reads its checkpoint cold: O_DIRECT, or evicted before a library's buffered
    load)."""
    if r["op"] == "resume":
        return True
    if r["op"] == "read":
        return r.get("tier") == DURABLE
    return data.pipeline.blocking == DURABLE and bool(r.get("fsync") or r.get("direct"))


# ------------------------------------------------------------------------------ what is shown
def recomputed_summary(ruleset: RuleSet, data: RunData, plan: Any) -> dict[str, object]:
    """summary.json as the records and the plan of the run's own workload and scale give it (and,
    from summary format 3, run.json's times and system.json's hosts; from 5, what other processes
    moved on the checkpoint device): what the runner writes, and what the checker, ``compare``
    and the leaderboard show, whatever the bundle's summary claims.  The summary format is the
    one the rule set's summary schema pins.  Made once per rules and plan for a run's data (the
    checker's SUMMARY-EXACT and its report ask for it); shared, not to be changed."""
    return data.once(("recomputed summary", ruleset.version, id(ruleset.data), plan.digest),
                  lambda: _recomputed_summary(ruleset, data, plan))


def _recomputed_summary(ruleset: RuleSet, data: RunData, plan: Any) -> dict[str, object]:
    facts = DlioFacts.of(data.run, data.system) if summary_format(ruleset) >= 3 else None
    out = completed(data.summarized(ruleset), plan.total_bytes,
                    plan.restore_bytes(str(data.config["checkpoint"]["restore"])), facts)
    if summary_format(ruleset) >= 5:
        window = cpu_window_s(ruleset.data["attribution"]) * 1e9
        out["foreign"] = foreign_summary(data.records, lambda r: counted_op(data, r), window)
    return out



def summary_exact(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """summary.json is exactly what the checker recomputes: no key it does not recompute, the
    plan's bytes, the read validity and the DLIO-named block (METRICS-RECOMPUTE covers the
    statistics themselves)."""
    d, plan = run_data(ctx), ctx.plan
    assert plan is not None  # needs: [plan]
    want = recomputed_summary(ruleset, d, plan)
    extra = sorted(set(d.summary) - set(want))
    if extra:
        yield Outcome(
            False,
            "only keys the checker recomputes",
            f"summary.{extra[0]}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""),
        )
    shown = {k: want[k] for k in (*EXACT_KEYS, "dlio_compat", "foreign", *DLIO_KEYS) if k in want}
    diffs = list(compare_values("", shown, d.summary))
    for path, exp, got in diffs[:5]:
        yield Outcome(False, f"summary.{path} = {exp}", got)
    if not extra and not diffs:
        yield Outcome(True)


# ------------------------------------------------------------------------------ the records
def records_mode(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Every record carries the I/O mode the configuration asked for (the engine records what it
    did per op), and every restore's residency was measured over every byte it read."""
    d = run_data(ctx)
    io, fsync = d.config["io"], bool(d.config["checkpoint"]["fsync"])
    want_direct, want_dontcache = bool(io["direct"]), bool(io["dontcache"]) and not bool(io["direct"])
    if is_object_url(d.config["checkpoint"].get("folder")):  # rules 1.6: objects have no page cache to skip
        want_direct = want_dontcache = False
    blocking_durable = Pipeline.of(d.config).blocking == DURABLE
    for r in d.records:
        want = (fsync, want_direct, want_dontcache)
        if r.get("writer", ENGINE) != ENGINE:  # rules 1.11: a library's own buffered I/O, fsynced
            want = (True if r["op"] == "write" else fsync, False, False)
        direct = r.get("direct")
        if r["op"] == "read" and r.get("tier") != DURABLE:
            direct = want[1] if direct is False else direct  # a fast tier may refuse O_DIRECT
        if r["op"] == "write" and not blocking_durable:
            direct = want[1]  # the stall's own stage is not the durable write: see stages
        got = (bool(r.get("fsync")) if r["op"] == "write" else fsync, direct, r.get("dontcache"))
        if got != want:
            yield Outcome(
                False,
                f"fsync={want[0]}, direct={want[1]}, dontcache={want[2]} as configured",
                f"fsync={got[0]}, direct={got[1]}, dontcache={got[2]}",
                where=at(r),
            )
            return
        for st in r.get("stages", ()):
            if st.get("tier") == DURABLE and "direct" in st and st["direct"] is not want[1]:
                yield Outcome(
                    False, f"durable stage direct={want[1]}", f"direct={st['direct']}", where=at(r)
                )
                return
        if r["op"] == "read" and int(r.get("cached_check_bytes", -1)) != int(r["bytes"]):
            yield Outcome(
                False,
                f"residency measured over all {r['bytes']} B read",
                f"over {r.get('cached_check_bytes')} B",
                where=at(r),
            )
            return


def start_skew(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """The ranks of one host leave each op's barrier together (same clock): a rank that claims it
    started late shortens its own duration."""
    d, b = run_data(ctx), evidence_bounds(ruleset)["start_skew"]
    # Rules 1.4: a write whose barrier the ranks' own background persists overlap (the previous
    # checkpoint not yet durable on some rank) gets the larger allowance ``busy_abs_s``: those
    # threads compete with the ranks for the host's cores as they leave the barrier.
    # Rules 1.8: the absolute part is the host's own calibration's (mlckpt.rules.checks.timing).
    busy_abs = float(ruleset.data.get("start_skew_busy", {}).get("abs_s", b["abs_s"]))
    durable = {(int(r["rank"]), int(r["index"])): int(r["t1_ns"]) for r in d.records if r["op"] == "write"}
    yield from calibration_outcomes(ruleset, d, sorted(d.hosts()), ("skew_ns",))
    for (op, idx), recs in sorted(d.grouped().items()):
        for host, hr in sorted(d.hosts(recs).items()):
            t0 = [int(r["t0_ns"]) for r in hr]
            dur = max(op_end(r) - int(r["t0_ns"]) for r in hr)
            busy = op == "write" and any(durable.get((int(r["rank"]), idx - 1), 0) > int(r["t0_ns"])
                                         for r in hr)
            base = abs_bound_ns(ruleset, d, host, "skew_ns", b["abs_s"])
            bound = (max(busy_abs * 1e9, base) if busy else base) + b["rel"] * max(dur, 0)
            if max(t0) - min(t0) > bound:
                late = max(hr, key=lambda r: int(r["t0_ns"]))
                yield Outcome(
                    False,
                    f"ranks of a host leave the barrier within {bound / 1e6:.1f} ms",
                    f"rank {late['rank']} {(max(t0) - min(t0)) / 1e6:.1f} ms after the first",
                    where=f"{op} {idx} on {host}",
                )


def _signature(r: Rec) -> tuple[int, ...]:
    """A record's timings, relative to itself."""
    t0 = int(r["t0_ns"])
    if r["op"] != "write":
        return (int(r["t1_ns"]) - t0,)
    return (int(r["t1_ns"]) - t0, int(r.get("staged_ns", t0)) - t0,
            *[int(s["t1_ns"]) - int(s["t0_ns"]) for s in r.get("stages", ())])


def timing_copies(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """Nanosecond timings never repeat in honest runs: a record whose timings and start offset
    equal another's, or an op whose per-rank durations equal another op's (or a rank's across
    ops equal another rank's), was copied."""
    d = run_data(ctx)
    ops = d.grouped()
    seen: dict[tuple[object, ...], Rec] = {}
    for (op, idx), recs in sorted(ops.items()):
        starts = {h: min(int(r["t0_ns"]) for r in hr) for h, hr in d.hosts(recs).items()}
        for r, sig in zip(recs, map(_signature, recs), strict=True):
            o = seen.setdefault((op, sig, int(r["t0_ns"]) - starts[str(r["host"])]), r)
            if o is not r:
                yield Outcome(
                    False,
                    "timings of its own",
                    f"the same timings as {o['op']} {o['index']} rank {o['rank']}",
                    where=f"{op} {idx} rank {r['rank']}",
                )
                return
    vectors: dict[tuple[object, ...], str] = {}
    by_rank: dict[tuple[str, int], list[int]] = {}
    for (op, idx), recs in sorted(ops.items()):  # each op's records in rank order
        durs = tuple([int(r["t1_ns"]) - int(r["t0_ns"]) for r in recs])
        for r, dur in zip(recs, durs, strict=True):
            by_rank.setdefault((op, int(r["rank"])), []).append(dur)
        if len(durs) >= 2:
            if (op, durs) in vectors:
                yield Outcome(
                    False,
                    "per-rank durations of its own",
                    f"those of {vectors[(op, durs)]}",
                    where=f"{op} {idx}",
                )
                return
            vectors[(op, durs)] = f"{op} {idx}"
    for (op, rank), own in sorted(by_rank.items()):
        if len(own) >= 2:
            key = ("rank", op, tuple(own))
            if key in vectors:
                yield Outcome(
                    False,
                    "per-op durations of its own",
                    f"those of {vectors[key]}",
                    where=f"{op}s of rank {rank}",
                )
                return
            vectors[key] = f"rank {rank}"


def async_evidence(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """On each rank, the training interval a write reports fits between its stall and the next
    checkpoint's barrier; the back-pressure a write reports covers the wait for the previous
    checkpoint to become durable."""
    d = run_data(ctx)
    # Rules 1.4: the back-pressure clock starts a moment after the op's own t0 (and a persist
    # that ends in that moment is not waited for at all): under load the gap reached 2.6 ms.
    slack = int(float(ruleset.data.get("async_evidence", {}).get("backpressure_slack_ms", 0)) * 1e6)
    for rank, recs in sorted(writes_by_rank(d).items()):
        for a, nxt in itertools.pairwise(recs):
            over = int(a["staged_ns"]) + int(a["compute_ns"]) - int(nxt["t0_ns"])
            if over > 0:
                yield Outcome(
                    False,
                    "training ends before the next checkpoint's barrier",
                    f"{over / 1e6:.1f} ms after it",
                    where=at(a),
                )
                break
            wait = int(a["t1_ns"]) - int(nxt["t0_ns"])
            if wait > slack and int(nxt["backpressure_ns"]) < wait - slack:
                yield Outcome(
                    False,
                    f"back-pressure of at least {wait / 1e6:.1f} ms (write {a['index']} "
                    "was durable only then)",
                    f"{int(nxt['backpressure_ns']) / 1e6:.1f} ms",
                    where=f"write {nxt['index']} rank {rank}",
                )
                break


def training_waits(records: Sequence[Rec]) -> list[tuple[int, int, int]]:
    """(write index, wait, trained) for each write followed by another: how long after the last
    rank's training the next checkpoint's barrier began, in ns, on the host that waited least
    (each host on its own clock), and the shortest training interval any rank recorded."""
    by_index: dict[int, dict[str, list[Rec]]] = {}
    for r in records:
        if r.get("op") == "write":
            by_index.setdefault(int(r["index"]), {}).setdefault(str(r["host"]), []).append(r)
    out = []
    for k, hosts in sorted(by_index.items()):
        nxt = by_index.get(k + 1)
        if nxt is None:
            continue
        waits = [min(int(r["t0_ns"]) for r in nxt[h]) - max(int(r["staged_ns"]) + int(r["compute_ns"])
                                                              for r in mine)
                 for h, mine in hosts.items() if h in nxt]
        if waits:
            trained = min(int(r["compute_ns"]) for mine in hosts.values() for r in mine)
            out.append((k, min(waits), trained))
    return out


def training_interval(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """The training interval a write records is the one it trained: the next checkpoint's barrier
    follows the last rank's training closely on at least one host (that host's ranks arrived last
    and waited for nobody).  A forger who shortens every rank's interval, to list the result under
    a shorter one, leaves the rest of it as a wait that no host explains.  Hosts' monotonic clocks
    differ, so each host is judged on its own ranks (:func:`training_waits`).  A witnessed run (or
    one whose witness was lost) also waits for the witness to hear each op's start, up to
    witness.timeout_s."""
    d = run_data(ctx)
    bound = ruleset.data["training"]
    floor_ns, rel = float(bound["gap_floor_s"]) * 1e9, float(bound["gap_rel"])
    if d.run.get("witness"):  # each op's start is reported before its barrier: up to the timeout
        timeout = (d.config.get("witness") or {}).get("timeout_s") or bound["witness_timeout_default_s"]
        floor_ns += float(timeout) * 1e9
    waits = training_waits(d.records)
    if not waits:
        yield NotChecked("fewer than two writes: no training interval is followed by a barrier")
        return
    for k, wait, trained in waits:
        allowed = floor_ns + rel * trained
        if wait > allowed:
            yield Outcome(False, f"the next checkpoint's barrier within {allowed / 1e9:.2f} s of the last "
                          f"rank's training on some host (a {trained / 1e9:.3f} s interval recorded)",
                          f"{wait / 1e9:.3f} s later on every host: an interval recorded shorter "
                          "than trained", where=f"write {k}")


# ------------------------------------------------------------------------------ fingerprints
def fingerprints(records: Sequence[Rec]) -> tuple[str, ...]:
    """Content fingerprints of a run's measurements, for duplicates across a tree: the timings
    of every record (what a resubmission under a new id, system or organisation keeps), and the
    absolute monotonic starts (unique to one run on its hosts)."""
    timings = sorted((str(r["op"]), int(r["index"]), int(r["rank"]), _signature(r)) for r in records)
    starts = sorted(int(r["t0_ns"]) for r in records)
    out = []
    for kind, value in (("timings", timings), ("starts", starts)):
        if value:
            out.append(kind + ":" + hashlib.sha256(json.dumps(value).encode()).hexdigest())
    return tuple(out)


CHECKS = checks_table(
    summary_exact,
    records_mode,
    start_skew,
    timing_copies,
    async_evidence,
    training_interval,
)
