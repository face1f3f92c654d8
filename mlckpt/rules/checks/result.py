"""Check functions for the ``result`` stage: a finished run judged from its own files.  Pure.

They see a :class:`~mlckpt.rules.rundata.RunData` (the parsed run.json, config.yaml, summary.json,
system.json and records.jsonl of one run folder) through ``Context.run``, and are composed with the
pre-I/O checks by ``mlckpt.rules.registry``, so runner and checker share one rule engine.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.metrics import hugepage_share_min
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table, rank_shift
from mlckpt.rules.rundata import DATA_SCHEME, RunData, run_data, written
from mlckpt.units import fmt_share
from mlckpt.workload.layout import FileSpec, Plan, restore_pattern
from mlckpt.workload.pipeline import FAST, MEMORY_FILESYSTEMS, Pipeline

REL_TOL = 1e-9


def result_consistent(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    cfg = d.config
    wanted = (("workload", cfg.get("workload", {}).get("name")), ("division", cfg.get("division")),
             ("ranks", cfg.get("ranks")), ("scale", cfg.get("scale")),
             ("rules_version", cfg.get("rules_version")))
    for key, want in wanted:
        yield Outcome(d.run.get(key) == want, f"run.json {key}={want!r}", f"{d.run.get(key)!r}")
    pipe, declared = Pipeline.of(cfg), d.run.get("pipeline") or {}
    for key, want in (("mode", pipe.mode), ("compute_interval_s", pipe.compute_interval_s),
                      ("fast", pipe.fast), ("fast_keep", pipe.fast_keep)):
        yield Outcome(declared.get(key) == want, f"run.json pipeline.{key}={want!r}",
                      f"{declared.get(key)!r}")
    hosts_ranks = sorted(r for h in d.run.get("hosts", []) for r in h.get("ranks", []))
    yield Outcome(hosts_ranks == list(range(int(cfg.get("ranks", 0)))),
                  f"every rank 0..{int(cfg.get('ranks', 0)) - 1} on exactly one host",
                  f"{len(hosts_ranks)} rank placements")


def result_counts(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    ranks = int(d.config["ranks"])
    for op, key in (("write", "num_writes"), ("read", "num_reads")):
        want = int(d.config["checkpoint"][key])
        ops = d.ops(op)
        yield Outcome(sorted(ops) == list(range(1, want + 1)), f"{want} {op} ops",
                      f"{op} ops {sorted(ops)[:10]}")
        for idx, recs in sorted(ops.items()):
            got = Counter(int(r["rank"]) for r in recs)
            ok = sorted(got) == list(range(ranks)) and all(c == 1 for c in got.values())
            yield Outcome(ok, f"one record per rank 0..{ranks - 1}",
                          f"{len(recs)} records for {len(got)} ranks", where=f"{op} {idx}")
    nw = written(d)
    for idx, recs in d.ops("read").items():
        want_ckpt = (idx - 1) % nw + 1
        ok = all(int(r["checkpoint"]) == want_ckpt for r in recs)
        yield Outcome(ok, f"restore {idx} reads checkpoint {want_ckpt}", "another checkpoint",
                      where=f"read {idx}")


def result_times(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    bad = [r for r in d.records if not int(r["t1_ns"]) > int(r["t0_ns"])]
    yield Outcome(not bad, "t1_ns > t0_ns in every record",
                  f"{len(bad)} records out of order" + (
                      f" (first: {bad[0]['op']} {bad[0]['index']} rank {bad[0]['rank']})" if bad else ""))
    # Ops run one after another on each rank: op k+1 starts after op k ended (same host clock).
    # A write "ends" for the next write when training resumed (its background work may go on:
    # ASYNC-TIMELINE orders that); the restores start once every write is durable.
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for r in d.records:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    order = {"write": 0, "read": 1}
    for rank, recs in by_rank.items():
        recs = sorted(recs, key=lambda r: (order.get(str(r["op"]), 2), int(r["index"])))
        for a, b in itertools.pairwise(recs):
            both_writes = a["op"] == b["op"] == "write" and "staged_ns" in a
            end = int(a["staged_ns"]) if both_writes else int(a["t1_ns"])
            if int(b["t0_ns"]) < end:
                yield Outcome(False, "each op of a rank starts after its previous op ended",
                              f"{b['op']} {b['index']} starts before {a['op']} {a['index']} ended",
                              where=f"rank {rank}")
                break
    started, ended = str(d.run.get("started", "")), str(d.run.get("ended", ""))
    yield Outcome(started <= ended, "started <= ended", f"started {started}, ended {ended}")


def op_files(plan: Plan, write: bool, rank: int, restore: str, shift: int) -> tuple[FileSpec, ...]:
    """The files a rank's write (its own) or restore (``checkpoint.restore`` under the run's rank
    shift) moves, by the plan."""
    if write:
        return plan.rank_plans[rank].files
    return tuple(rd.file for rd in plan.restore_reads(rank, restore_pattern(restore), shift))


def bytes_match_plan(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d, plan = run_data(ctx), ctx.plan
    if plan is None:
        yield NotChecked("no run data or plan")
        return
    shift = int(d.run.get("rank_shift", rank_shift(ctx)))
    restore = str(d.config["checkpoint"]["restore"])
    wants: dict[tuple[bool, int], tuple[int, int]] = {}  # a rank's writes are alike, and its restores

    def want(write: bool, rank: int) -> tuple[int, int]:
        files = op_files(plan, write, rank, restore, shift)
        return sum(f.bytes for f in files), len(files)

    for r in d.records:
        rank = int(r["rank"])
        if not 0 <= rank < plan.ranks:
            yield Outcome(False, f"rank in 0..{plan.ranks - 1}", f"rank {rank}")
            continue
        key = (r["op"] == "write", rank)
        want_b, want_f = wants.get(key) or wants.setdefault(key, want(*key))
        ok = int(r["bytes"]) == want_b and int(r["files"]) == want_f
        if not ok:
            yield Outcome(False, f"{want_b} B in {want_f} files", f"{r['bytes']} B in {r['files']} files",
                          where=f"{r['op']} {r['index']} rank {rank}")


def _num_equal(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if (isinstance(a, float) and math.isinf(a)) or (isinstance(b, float) and math.isinf(b)):
            return a == b
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


def compare_values(path: str, want: object, have: object) -> Iterator[tuple[str, object, object]]:
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            yield path, "an object", have
            return
        for k, v in want.items():
            yield from compare_values(f"{path}.{k}" if path else k, v, have.get(k, "<missing>"))
    elif isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            yield path, f"{len(want)} items", f"{len(have) if isinstance(have, list) else have!r}"
            return
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            yield from compare_values(f"{path}[{i}]", w, h)
    elif not _num_equal(want, have):
        yield path, want, have


def metrics_recompute(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    want = d.summarized(ruleset)
    diffs = list(compare_values("", want, d.summary))
    for path, exp, got in diffs[:5]:
        yield Outcome(False, f"summary.{path} = {exp}", got)
    if not diffs:
        yield Outcome(True)


def fsync_every_write(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    d = run_data(ctx)
    writes = [r for r in d.records if r["op"] == "write"]
    bad = [r for r in writes if r.get("fsync") is not True]
    return Outcome(not bad and bool(d.config["checkpoint"].get("fsync")),
                   "fsync on every write record", f"{len(bad)} of {len(writes)} write records without fsync")


def cold_reads(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    bound = float(ruleset.data["cold_read"]["max_resident_fraction"])
    multiple = float(ruleset.data["cold_read"]["memory_multiple"])
    # Alternative from the rules: per-host data at least `multiple` × host memory.
    mem = {h.get("hostname"): h.get("memory_total_bytes") or 0 for h in d.system.get("hosts", [])}
    fast_fs = (d.run.get("pipeline") or {}).get("fast_fs") or {}
    for idx, recs in sorted(d.ops("read").items()):
        # A restore from a memory-backed fast tier (tmpfs) reads memory by design: it is reported
        # apart (read_fast_*), never as storage, and the cache rule does not apply to it.
        recs = [r for r in recs
                if not (r.get("tier") == FAST and fast_fs.get(str(r["host"])) in MEMORY_FILESYSTEMS)]
        if not recs:
            continue
        checked = sum(int(r.get("cached_check_bytes", 0)) for r in recs)
        resident = sum(int(r.get("resident_bytes", 0)) for r in recs)
        frac = resident / checked if checked else (0.0 if not any(int(r["bytes"]) for r in recs) else 1.0)
        if frac <= bound:
            continue
        per_host: dict[str, int] = {}
        for r in recs:
            per_host[str(r["host"])] = per_host.get(str(r["host"]), 0) + int(r["bytes"])
        big = all(mem.get(h) and b >= multiple * mem[h] for h, b in per_host.items())
        yield Outcome(big, f"at most {bound:.0%} resident before a restore",
                      f"{fmt_share(frac, bound, 1)} resident", where=f"read {idx}")


def data_verified(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    for r in d.records:
        if r["op"] != "read":
            continue
        ok = int(r.get("mismatches", 1)) == 0 and int(r.get("verified_bytes", -1)) == int(r["bytes"])
        if not ok:
            yield Outcome(False, f"{r['bytes']} B verified, 0 mismatches",
                          f"{r.get('verified_bytes')} B verified, {r.get('mismatches')} mismatches",
                          where=f"read {r['index']} rank {r['rank']}")


def data_unique(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    d = run_data(ctx)
    scheme = d.run.get("data_scheme")
    return Outcome(scheme == DATA_SCHEME, f"data_scheme {DATA_SCHEME}", f"data_scheme {scheme!r}")


def bandwidth_plausible(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    storage = (d.system.get("description") or {}).get("storage") or {}
    declared = False
    for op, key in (("write", "max_write_gib_s"), ("read", "max_read_gib_s")):
        limit = storage.get(key)
        if not isinstance(limit, int | float):
            continue
        declared = True
        for o in d.summary.get("ops", []):
            if o.get("op") == op and float(o.get("bandwidth_gib_s", 0)) > float(limit) * 1.05:
                yield Outcome(False, f"{op} at most {limit} GiB/s (declared, +5%)",
                              f"{o['bandwidth_gib_s']:.2f} GiB/s", where=f"{op} {o.get('index')}")
    if not declared:
        yield NotChecked("the system description declares no maximum bandwidth")


# ---------------------------------------------------------------------- async and tiered checkpoints
def writes_by_rank(data: RunData) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for r in data.records:
        if r.get("op") == "write":
            out.setdefault(int(r["rank"]), []).append(r)
    for recs in out.values():
        recs.sort(key=lambda r: int(r["index"]))
    return out


def state_hugepages(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """STATE-HUGEPAGES (rules 1.4): the smallest huge-page share of a rank's state buffer."""
    share = hugepage_share_min(run_data(ctx).records)  # from the records: no summary needed
    if share is None:
        return NotChecked("no huge-page share in the records (records format 4, /proc/self/smaps)")
    bound = float(ruleset.data["memory"]["min_hugepage_fraction"])
    return Outcome(share >= bound, f"at least {bound:.0%} of every rank's state on huge pages",
                   f"{fmt_share(share, bound)} on one rank")


COMPLETE = "COMPLETE"  # marks a drafted description's value that only the vendor can give


def placeholders(doc: object, at: str = "") -> list[tuple[str, str]]:
    """The values a drafted system description still holds as placeholders (``COMPLETE: …``),
    each with its dotted key, in document order."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in placeholders(v, f"{at}.{k}" if at else str(k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in placeholders(v, f"{at}[{i}]")]
    return [(at, doc)] if isinstance(doc, str) and doc.startswith(COMPLETE) else []


def system_complete(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """SYSTEM-COMPLETE (rules 1.15): no drafted placeholder in the embedded system description."""
    description = run_data(ctx).system.get("description")
    if not isinstance(description, dict):
        return NotChecked("the run embeds no system description")
    left = placeholders(description)
    more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
    return Outcome(not left, f"no value marked {COMPLETE}",
                   f"{left[0][0]}: {left[0][1]!r}{more}" if left else "none")


CHECKS = checks_table(
    system_complete,
    state_hugepages,
    result_consistent,
    result_counts,
    result_times,
    bytes_match_plan,
    metrics_recompute,
    fsync_every_write,
    cold_reads,
    data_verified,
    data_unique,
    bandwidth_plausible,
)
