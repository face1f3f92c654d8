"""Checks of MLPerf Storage's own checkpointing rules (rule set ``mlps-v3.0``, selected with
``rules=mlperf-storage-v3.0``), where mlckpt's checks do not already say the same thing.  Each
rule's message cites its section of MLPerf Storage's Rules.md; the data (accelerator lists,
counts, bounds) is under ``mlperf:`` in the rule set's rules.yaml.  Pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.rules.engine import CheckFn, Context, NotChecked, Outcome, Rule, RuleSet
from mlckpt.rules.rundata import run_data
from mlckpt.units import GiB, fmt_bytes


def _mlperf(ruleset: RuleSet) -> Mapping[str, Any]:
    return ruleset.data["mlperf"]


def mlperf_processes(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """§4.6.1, with §4.3.5's subset mode as corrected upstream: fewer processes than the closed
    count is a subset run, which only llama3_8b at 8 processes may be (and that is its full run)."""
    canon = ruleset.canonical_workloads.get(ctx.workload.name)
    if canon is None:
        return NotChecked("not a canonical workload (see CLOSED-WORKLOAD)")
    want = int(canon["closed_ranks"])
    if ctx.ranks == want:
        return Outcome(True)
    subset = _mlperf(ruleset)["subset"]
    why = (f"{ctx.ranks} processes: a subset run, which §4.3.5 admits for {subset['workload']} at "
           f"{subset['ranks']} processes only (mlcommons/storage#841)" if ctx.ranks < want
           else f"{ctx.ranks} processes")
    return Outcome(False, f"{want} processes", why)


def mlperf_accelerator(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """§4.3.4 Table 3: the closed division's accelerators; the others are what-if only."""
    acc = ctx.get("accelerator")
    closed = [str(a) for a in _mlperf(ruleset)["closed_accelerators"]]
    if acc is None:
        if not ctx.complete:
            return NotChecked("accelerator not declared (give accelerator=NAME)")
        return Outcome(False, " or ".join(closed), "no accelerator declared")
    acc = str(acc).lower()
    if acc in closed:
        return Outcome(True)
    whatif = [str(a) for a in _mlperf(ruleset)["whatif_accelerators"]]
    return Outcome(False, " or ".join(closed),
                   f"{acc} (what-if only)" if acc in whatif else f"{acc} (not in Table 3)")


def mlperf_counts(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """§4.7.1: each phase 10 or 0 checkpoints, and not both 0 in one invocation."""
    allowed = [int(n) for n in _mlperf(ruleset)["checkpoints_per_phase"]]
    w, r = int(ctx.get("checkpoint.num_writes") or 0), int(ctx.get("checkpoint.num_reads") or 0)
    ok = w in allowed and r in allowed and (w, r) != (0, 0)
    return Outcome(ok, f"{' or '.join(map(str, allowed))} writes and reads per invocation, not both 0",
                   f"{w} writes and {r} reads")


def param_equals(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """A key the source rules fix, with the value in the rule's ``params``."""
    key, want = str(rule.params["key"]), rule.params["value"]
    have = ctx.get(key)
    same = have == want or (isinstance(have, int | float) and isinstance(want, int | float)
                            and float(have) == float(want))
    return Outcome(same, f"{key}={want}", f"{key}={have}")


def mlperf_memory_multiple(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    """§4.3.1: where a client's checkpoint data is under 3× its memory, the page cache must be
    cleared between the phases (mlckpt evicts and measures residency before every read)."""
    d = run_data(ctx)
    multiple = float(_mlperf(ruleset)["memory_multiple"])
    memory = {h.get("hostname"): int(h.get("memory_total_bytes") or 0) for h in d.system.get("hosts", [])}
    first = min(d.ops("write"), default=None)
    if first is None:
        yield NotChecked("no write in this invocation")
        return
    per_host: dict[str, int] = {}
    for r in d.ops("write")[first]:
        per_host[str(r["host"])] = per_host.get(str(r["host"]), 0) + int(r["bytes"])
    # What was done about it depends on the phase this invocation ran.
    cleared = ("mlckpt evicted the page cache and measured it before every read (COLD-READ)"
               if d.ops("read") else "this invocation reads nothing; a read invocation of its "
               "checkpoints (checkpoint.restore_from) evicts the page cache and measures it before "
               "every read (COLD-READ)")
    for host, data in sorted(per_host.items()):
        mem = memory.get(host)
        if not mem:
            yield NotChecked(f"host {host}: memory not recorded")
            continue
        yield Outcome(data >= multiple * mem, f"at least {multiple:g} × {fmt_bytes(mem)} of memory",
                      f"{fmt_bytes(data)} per checkpoint here; {cleared}", where=f"host {host}")


def _phase_bounds(ctx: Context) -> tuple[float, float, float, float] | None:
    """(first write start, last write end, first read start, last read end), wall seconds."""
    d = run_data(ctx)
    def span(op: str) -> tuple[float, float] | None:
        recs = [r for r in d.records if r.get("op") == op]
        if not recs:
            return None
        return (min(float(r["wall_start"]) for r in recs),
                max(float(r["wall_start"]) + (int(r["t1_ns"]) - int(r["t0_ns"])) / 1e9 for r in recs))
    w, r = span("write"), span("read")
    return None if w is None or r is None else (*w, *r)


def mlperf_phase_gap(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """§4.7.1: at most 30 s from the end of the write phase to the start of the read phase."""
    bounds = _phase_bounds(ctx)
    if bounds is None:
        return NotChecked("one phase only in this invocation")
    limit = float(_mlperf(ruleset)["max_phase_gap_s"])
    gap = bounds[2] - bounds[1]
    return Outcome(gap <= limit, f"at most {limit:g} s", f"{gap:.1f} s")


def mlperf_split_gap(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """§4.7.1 for split invocations: the read invocation starts within 30 s of the write
    invocation's end (run.json times; the checker joins the two, see SPLIT-PAIR)."""
    facts = ctx.submission
    gap = getattr(facts, "split_gap_s", None)
    if gap is None:
        return NotChecked("not a read-only invocation joined to its write invocation")
    limit = float(_mlperf(ruleset)["max_phase_gap_s"])
    return Outcome(gap <= limit, f"at most {limit:g} s", f"{gap:.1f} s")


def mlperf_model(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """§4.3.3, in every division as MLPerf's checker applies it: one of the four llama3 models."""
    models = [str(m) for m in _mlperf(ruleset)["models"]]
    return Outcome(ctx.workload.name in models, " or ".join(models), ctx.workload.name)


def mlperf_aggregate_memory(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """§4.3.4 as MLPerf's checker computes it, in every division: processes × its fixed
    per-accelerator memory (80 GiB, an H100's, whatever accelerator is declared) must hold the
    checkpoint as written (at its scale)."""
    assert ctx.plan is not None  # needs: [plan]
    per = float(_mlperf(ruleset)["checker_accelerator_gib"])
    have, need = per * GiB * ctx.plan.ranks, ctx.plan.total_bytes
    return Outcome(have >= need, f"at least {fmt_bytes(need)} (the checkpoint)",
                   f"{ctx.plan.ranks} × {per:g} GiB = {fmt_bytes(int(have))}")


def mlperf_paths(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """§4.4.1, in every division: the checkpoint folder and the results folder are set and differ."""
    folder, results = str(ctx.get("checkpoint.folder") or ""), str(ctx.get("output.root") or "")
    same = os.path.normpath(folder) == os.path.normpath(results)
    return Outcome(bool(folder) and bool(results) and not same,
                   "checkpoint.folder and output.root set and different", f"both {folder}" if same
                   else f"checkpoint.folder={folder or '(unset)'}, output.root={results or '(unset)'}")


CHECKS: dict[str, CheckFn] = {
    "mlperf_processes": mlperf_processes,
    "mlperf_accelerator": mlperf_accelerator,
    "mlperf_counts": mlperf_counts,
    "param_equals": param_equals,
    "mlperf_memory_multiple": mlperf_memory_multiple,
    "mlperf_phase_gap": mlperf_phase_gap,
    "mlperf_split_gap": mlperf_split_gap,
    "mlperf_model": mlperf_model,
    "mlperf_aggregate_memory": mlperf_aggregate_memory,
    "mlperf_paths": mlperf_paths,
}
