"""Rules 1.21: resume runs, a job resuming from a checkpoint written at another layout
(mlckpt/workload/resume_run.py, mlckpt/run/phases/resumes.py).  Pure.

RESUME-SCOPE (config): what a resume run cannot be run with, refused before any I/O.
RESUME-DIRECT (config): a checkpoint on files is read with O_DIRECT, never through a page cache the
new ranks of a host share.
RESUME-CLOSED (config): no closed resume workload is defined: a resume run is an open result.
RESUME-RECORDED (result): run.json's resume block is the configuration's, and each resume's records
name the writer the configuration gives it (rules 1.22: DCP's and the engine's alternate).
RESUME-PLAN (result): each resume's records are what both plans give, rebuilt from the
configuration (``resume.held_to_plan``): a rank missing or added, bytes, ranges, reads, files or
tensors that the plans do not give are named by rank.  A resume through DCP is held to the pieces
its shard overlaps, each read whole as DCP reads it (``resume.held_to_whole_pieces``), their bytes
as stored within the rules' ``resume.stored_piece_overhead_bytes`` a piece.  What it cannot see:
records invented whole and coherently for ranks that never ran (the limit of every record without a
witness).
RESUME-COLD (result): each resume began with its old files out of the page cache.
RESUME-COUNTERS (result): each resume inside its hosts' kernel counters, and the bytes its ranks
claim to have read, read from the storage in that window (as SERVING-COUNTERS judges a load); a
DCP resume's buffered reads, the distinct stored pieces of each host's ranks (the ranks of a host
share its page cache).
RESUME-SUMMARY (result): summary.json is what the records recompute to.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from mlckpt.errors import ConfigError
from mlckpt.resume_metrics import by_resume, storage_bytes, summary
from mlckpt.rules.checks.serving import direct_on_files, each_read_counted, summary_exact
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.rules.rundata import RunData, run_data
from mlckpt.strict import mapping_at
from mlckpt.units import fmt_share
from mlckpt.workload.frameworks import ENGINE
from mlckpt.workload.resume import held_to_plan, held_to_whole_pieces
from mlckpt.workload.resume_run import ResumeRun, scope_problems
from mlckpt.written import Written


def resume_scope(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    writers = tuple(ruleset.data.get("resume", {}).get("writers") or (ENGINE,))
    bad = scope_problems(ctx.config, writers)
    return Outcome(not bad, "a resume run without them", "; ".join(bad))


def resume_direct(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    return direct_on_files(ctx, "a checkpoint")


def resume_closed(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    return Outcome(False, "division=open", f"division={ctx.division}")


def _run(ctx: Context) -> ResumeRun:
    run = ResumeRun.of(ctx.config)
    if run is None:  # the engine judges a resume rule on resume runs only
        raise TypeError("a resume rule was evaluated on another kind of run: declare kinds: [resume]")
    return run


def resume_recorded(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    d, run = run_data(ctx), _run(ctx)
    want, got = run.block(), mapping_at(d.run, "resume")
    diff = [f"{k}={got.get(k)!r}" for k in want if got.get(k) != want[k]]
    for index, recs in by_resume(d.records).items():
        # records format 13 names no writer: the engine made every resume
        named = sorted({str(r.get("writer", ENGINE)) for r in recs})
        if index < run.resumes and named != [run.writer_of(index)]:
            diff.append(f"resume {index} by {', '.join(named)} (the configuration: {run.writer_of(index)})")
    return Outcome(not diff, ", ".join(f"{k}={v!r}" for k, v in want.items()) + ", each resume by its writer",
                   ", ".join(diff))


def resume_plan_held(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    d, run = run_data(ctx), _run(ctx)
    try:
        plan = run.plan
    except ConfigError as exc:
        yield Outcome(False, "both plans for the configuration", exc.message)
        return
    resumes = by_resume(d.records)
    others = sum(1 for r in d.records if r.get("op") != "resume")
    if others:
        yield Outcome(False, "resume records only", f"{others} records of other ops")
    if sorted(resumes) != list(range(run.resumes)):
        yield Outcome(False, f"resumes 0..{run.resumes - 1} (resume.resumes={run.resumes})",
                      f"resumes {sorted(resumes)[:8]}")
    overhead = int(ruleset.data.get("resume", {}).get("stored_piece_overhead_bytes", 0))
    for index, recs in resumes.items():
        whole = index < run.resumes and run.writer_of(index) != ENGINE
        held = held_to_whole_pieces(run.whole_pieces, recs, overhead) if whole else held_to_plan(plan, recs)
        for problem in held[:10]:
            yield Outcome(False, "as planned", problem, where=f"resume {index}")
        for r in recs:
            parts = sum(int(r[f"{p}_ns"]) for p in ("metadata", "planning", "read", "placing"))
            if int(r["t1_ns"]) <= int(r["t0_ns"]) or parts > int(r["t1_ns"]) - int(r["t0_ns"]):
                yield Outcome(False, "its parts inside a positive duration",
                              f"rank {r['rank']}: parts {parts} ns in {int(r['t1_ns']) - int(r['t0_ns'])} ns",
                              where=f"resume {index}")


def resume_cold(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    d = run_data(ctx)
    bound = float(ruleset.data["cold_read"]["max_resident_fraction"])
    if d.run.get("storage", {}).get("kind") == "s3":
        return  # objects: no page cache of the host's holds them (resident_bytes is 0)
    for index, recs in by_resume(d.records).items():
        read = sum(int(r["read_bytes"]) for r in recs)
        resident = sum(int(r["resident_bytes"]) for r in recs)
        frac = resident / read if read else (1.0 if resident else 0.0)
        yield Outcome(frac <= bound, f"at most {bound:.0%} resident", f"{fmt_share(frac, bound, 1)} resident",
                      where=f"resume {index}")


def resume_counters(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d = run_data(ctx)
    slack = float(ruleset.data["serving"]["counters_slack_fraction"])  # rules 1.14's bound, shared
    yield from each_read_counted(d, by_resume(d.records), slack, "resume", partial(storage_bytes, _run(ctx)))


def summarized(ruleset: RuleSet, data: RunData, run: ResumeRun) -> dict[str, object]:
    """A resume run's summary.json from its records (the runner writes it, RESUME-SUMMARY
    recomputes it)."""
    written = Written.of(ruleset.version)
    return summary(run, data.records, hosts=len({str(h.get("host")) for h in data.run.get("hosts") or ()}),
                   max_resident_fraction=float(ruleset.data["cold_read"]["max_resident_fraction"]),
                   formats=(written.summary, written.records))


def recomputed(ruleset: RuleSet, data: RunData, run: ResumeRun) -> dict[str, object] | None:
    """:func:`summarized`, which the checker reports, never the claim; None where a record's
    duration is not positive (RESUME-PLAN says so)."""
    if any(int(r["t1_ns"]) <= int(r["t0_ns"]) for r in data.records if r.get("op") == "resume"):
        return None
    return summarized(ruleset, data, run)


def resume_summary_exact(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    d, run = run_data(ctx), _run(ctx)
    yield from summary_exact(recomputed(ruleset, d, run), d.summary, "RESUME-PLAN")


CHECKS = checks_table(resume_scope, resume_direct, resume_closed, resume_recorded, resume_plan_held,
                      resume_cold, resume_counters, resume_summary_exact)
