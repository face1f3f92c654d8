"""SPLIT-PAIR across the bundles of a tree: each read-only invocation beside the write invocation
whose checkpoints it restored (mlckpt.rules.checks.split)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from checker.results import BundleResult, confined
from checker.rulesets import as_finding, fallback_rules, finding_dict, submission_findings
from mlckpt.rules import (
    Problem,
    RuleSet,
    SubmissionFacts,
    clock_problems,
    host_clocks,
    load_rules,
    proof_matches,
    split_problems,
    verdict,
)


def split_doc(run: Mapping[str, object], config: Mapping[str, object],
              records: Sequence[Mapping[str, object]], system: object) -> dict[str, object]:
    """What joining a split result needs of a schema-valid bundle (kept on its result, never reported)."""
    keep = ("run_id", "name", "verdict", "restored_from", "started", "ended", "content_commitment")
    # only the invocations of a split result need their clocks
    of_split = bool(run.get("restored_from")) or is_write_invocation(config)
    return {"run": {k: run.get(k) for k in keep}, "config": dict(config),
            "clocks": host_clocks(records, system) if of_split else {}}


def _when(stamp: object) -> datetime.datetime | None:
    """A run.json time; None when it is not one, or has no zone (no gap can be told from it)."""
    try:
        when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def gap_s(write: Mapping[str, object], read: Mapping[str, object]) -> float | None:
    """Seconds from the write invocation's end to the read invocation's start (run.json times)."""
    end, start = _when(write.get("ended")), _when(read.get("started"))
    return None if end is None or start is None else (start - end).total_seconds()


Writes = Mapping[tuple[str, str, str, str, str], BundleResult]

# A write invocation alone (its read-only invocation is not in the tree): one status, worded the
# same in the checker's report and on the leaderboard: a valid bundle, but not a result on its own.
# "unpaired" is the status's persisted value (leaderboard format 6).
LONE = "unpaired"
LONE_WRITE = ("a write invocation alone: not a result on its own; ranked once the read-only invocation "
              "that restores it (checkpoint.restore_from) passes beside it")


def is_write_invocation(config: Mapping[str, Any]) -> bool:
    """A write invocation kept for a read-only one: no reads, checkpoints kept."""
    ck = config.get("checkpoint") or {}
    return int(ck.get("num_reads") or 0) == 0 and bool(ck.get("keep")) and not ck.get("restore_from")


def _evidence(result: BundleResult, w: BundleResult, ruleset: RuleSet) -> list[Problem]:
    """SPLIT-EVIDENCE's problems of a read invocation beside its (intact, same-statement) write invocation."""
    assert result.invocation is not None and w.invocation is not None
    if not any(rule.check == "split_evidence" for rule in ruleset.rules):
        return []  # rules before 1.10
    out = []
    proof = (result.invocation["run"].get("restored_from") or {}).get("content_proof")
    commitment = w.invocation["run"].get("content_commitment")
    if not proof_matches(proof, commitment):
        out.append(Problem("run.json", f"restored_from.content_proof opening {w.path}'s content_commitment "
                           "(only its content key yields it)",
                           "no commitment there" if not commitment else f"{str(proof)[:16]}… does not"))
    bounds = ruleset.data["evidence"]["clocks"]
    out += [Problem("records.jsonl", expected, got) for expected, got in clock_problems(
        w.invocation["clocks"], result.invocation["clocks"], float(bounds["offset_s"]),
        float(bounds["slew"]))]
    return out


def _problems(result: BundleResult, writes: Writes,
              ruleset: RuleSet) -> tuple[list[Problem], list[Problem], float | None]:
    """SPLIT-PAIR's problems, SPLIT-EVIDENCE's, and the gap between the invocations."""
    assert result.invocation is not None
    source = result.invocation["run"]["restored_from"]
    where = "run.json"
    w = writes.get((result.division, result.org, result.system, result.workload, str(source.get("run_id"))))
    named = f"{source.get('name')} (run_id {source.get('run_id')})"
    if w is None or w.invocation is None:
        folder = f"{result.division}/{result.org}/results/{result.system}/{result.workload}/"
        return [Problem(where, f"its write invocation {named} in {folder}", "not in the tree")], [], None
    if w.integrity != "ok":
        return [Problem(where, f"an intact write invocation {named}",
                        f"{w.path} failed its integrity check")], [], None
    if w.statement_sha256 != source.get("statement_sha256"):
        signed = source.get("statement_sha256")
        return [Problem(where, f"the write invocation it restored (statement {signed})",
                        f"{w.path}, another bundle under that run id")], [], None
    out = [Problem(where, f"a write invocation it can restore ({w.path})", p)
           for p in split_problems(w.invocation["run"], w.invocation["config"], result.invocation["config"])]
    gap = gap_s(w.invocation["run"], result.invocation["run"])
    if gap is None or gap < 0:
        out.append(Problem(where, f"restores that began after {w.path} ended",
                           "no gap" if gap is None else f"began {-gap:.1f} s before it ended"))
    return out, _evidence(result, w, ruleset), gap


def add_splits(results: Sequence[BundleResult], forced_rules: str | None = None) -> None:
    """SPLIT-PAIR (and, under MLPerf's rules, MLPERF-SPLIT-GAP; from rules 1.10 SPLIT-EVIDENCE) for
    every read-only invocation, with the gap between its invocations in its metrics."""
    writes = {(r.division, r.org, r.system, r.workload, str(r.invocation["run"]["run_id"])): r
              for r in results if r.invocation is not None and not r.invocation["run"].get("restored_from")}
    for r in results:
        if r.invocation is None or not r.invocation["run"].get("restored_from") \
                or r.verdict == "internal-error":
            continue
        with confined(r, "split results"):
            ruleset = load_rules(r.rules_version) if r.rules_version else fallback_rules(forced_rules)
            problems, evidence, gap = _problems(r, writes, ruleset)
            if r.metrics is not None:
                r.metrics["split_gap_s"] = gap
            facts = SubmissionFacts(split=tuple(problems), split_evidence=tuple(evidence), split_gap_s=gap)
            found, _ = submission_findings(ruleset, facts, r.declared_division or r.division)
            paths = {"run.json": f"{r.path}/run.json", "records.jsonl": f"{r.path}/records.jsonl"}
            r.findings += [finding_dict(f, r.path, paths) for f in found]
            r.verdict = verdict([as_finding(f) for f in r.findings], r.declared_division or r.division)
    _mark_lone_writes(results)


def _mark_lone_writes(results: Sequence[BundleResult]) -> None:
    """``metrics.unpaired_write_half`` (the report's persisted key) on each passing write invocation
    that no read-only invocation in the tree restores: the checker's report says so beside its PASS,
    the leaderboard excludes it with the same words."""
    restored = {(r.division, r.org, r.system, r.workload,
                 str(r.invocation["run"]["restored_from"].get("run_id")))
                for r in results if r.invocation is not None and r.verdict in ("closed", "open")
                and isinstance(r.invocation["run"].get("restored_from"), dict)}
    for r in results:
        if r.invocation is None or r.metrics is None or r.verdict == "internal-error":
            continue
        with confined(r, "split results"):
            if is_write_invocation(r.invocation["config"]):
                key = (r.division, r.org, r.system, r.workload, str(r.invocation["run"]["run_id"]))
                r.metrics["unpaired_write_half"] = key not in restored
