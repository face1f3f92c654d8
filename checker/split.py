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
    SubmissionFacts,
    clock_problems,
    host_clocks,
    load_rules,
    pair_problems,
    proof_matches,
    verdict,
)


def pair_doc(run: Mapping[str, Any], config: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
             system: Any) -> dict[str, Any]:
    """What pairing needs of a schema-valid bundle (kept on its result, never reported)."""
    keep = ("run_id", "name", "verdict", "restored_from", "started", "ended", "content_commitment")
    half = bool(run.get("restored_from")) or is_write_half(config)  # only a pair's halves need clocks
    return {"run": {k: run.get(k) for k in keep}, "config": dict(config),
            "clocks": host_clocks(records, system) if half else {}}


def _when(stamp: Any) -> datetime.datetime | None:
    """A run.json time; None when it is not one, or has no zone (no gap can be told from it)."""
    try:
        when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def gap_s(write: Mapping[str, Any], read: Mapping[str, Any]) -> float | None:
    """Seconds from the write invocation's end to the read invocation's start (run.json times)."""
    end, start = _when(write.get("ended")), _when(read.get("started"))
    return None if end is None or start is None else (start - end).total_seconds()


Writes = Mapping[tuple[str, str, str, str, str], BundleResult]

# An unpaired write half's one status, worded the same in the checker's report and on the
# leaderboard: a valid bundle, but not a result on its own.
UNPAIRED = "unpaired"
UNPAIRED_WRITE = ("unpaired write half: not a result on its own; ranked once the read-only invocation "
                  "that restores it (checkpoint.restore_from) passes beside it")


def is_write_half(config: Mapping[str, Any]) -> bool:
    """A write invocation kept for a read-only one: no reads, checkpoints kept."""
    ck = config.get("checkpoint") or {}
    return int(ck.get("num_reads") or 0) == 0 and bool(ck.get("keep")) and not ck.get("restore_from")


def _evidence(r: BundleResult, w: BundleResult, rs: Any) -> list[Problem]:
    """SPLIT-EVIDENCE's problems of a read half beside its (intact, same-statement) write half."""
    assert r.pair is not None and w.pair is not None
    if not any(rule.check == "split_evidence" for rule in rs.rules):
        return []  # rules before 1.10
    out = []
    proof = (r.pair["run"].get("restored_from") or {}).get("content_proof")
    commitment = w.pair["run"].get("content_commitment")
    if not proof_matches(proof, commitment):
        out.append(Problem("run.json", f"restored_from.content_proof opening {w.path}'s content_commitment "
                           "(only its content key yields it)",
                           "no commitment there" if not commitment else f"{str(proof)[:16]}… does not"))
    bounds = rs.data["evidence"]["clocks"]
    out += [Problem("records.jsonl", expected, got) for expected, got in clock_problems(
        w.pair["clocks"], r.pair["clocks"], float(bounds["offset_s"]), float(bounds["slew"]))]
    return out


def _problems(r: BundleResult, writes: Writes, rs: Any) -> tuple[list[Problem], list[Problem], float | None]:
    """SPLIT-PAIR's problems, SPLIT-EVIDENCE's, and the gap between the halves."""
    assert r.pair is not None
    source = r.pair["run"]["restored_from"]
    where = "run.json"
    w = writes.get((r.division, r.org, r.system, r.workload, str(source.get("run_id"))))
    named = f"{source.get('name')} (run_id {source.get('run_id')})"
    if w is None or w.pair is None:
        return [Problem(where, f"its write invocation {named} in {r.division}/{r.org}/results/{r.system}/"
                        f"{r.workload}/", "not in the tree")], [], None
    if w.integrity != "ok":
        return [Problem(where, f"an intact write invocation {named}",
                        f"{w.path} failed its integrity check")], [], None
    if w.statement_sha256 != source.get("statement_sha256"):
        signed = source.get("statement_sha256")
        return [Problem(where, f"the write invocation it restored (statement {signed})",
                        f"{w.path}, another bundle under that run id")], [], None
    out = [Problem(where, f"a write invocation it can restore ({w.path})", p)
           for p in pair_problems(w.pair["run"], w.pair["config"], r.pair["config"])]
    gap = gap_s(w.pair["run"], r.pair["run"])
    if gap is None or gap < 0:
        out.append(Problem(where, f"restores that began after {w.path} ended",
                           "no gap" if gap is None else f"began {-gap:.1f} s before it ended"))
    return out, _evidence(r, w, rs), gap


def add_pairs(results: Sequence[BundleResult], forced_rules: str | None = None) -> None:
    """SPLIT-PAIR (and, under MLPerf's rules, MLPERF-SPLIT-GAP; from rules 1.10 SPLIT-EVIDENCE) for
    every read-only invocation, with the gap between its halves in its metrics."""
    writes = {(r.division, r.org, r.system, r.workload, str(r.pair["run"]["run_id"])): r
              for r in results if r.pair is not None and not r.pair["run"].get("restored_from")}
    for r in results:
        if r.pair is None or not r.pair["run"].get("restored_from") or r.verdict == "internal-error":
            continue
        with confined(r, "split pairs"):
            rs = load_rules(r.rules_version) if r.rules_version else fallback_rules(forced_rules)
            problems, evidence, gap = _problems(r, writes, rs)
            if r.metrics is not None:
                r.metrics["split_gap_s"] = gap
            facts = SubmissionFacts(split=tuple(problems), split_evidence=tuple(evidence), split_gap_s=gap)
            found, _ = submission_findings(rs, facts, r.declared_division or r.division)
            paths = {"run.json": f"{r.path}/run.json", "records.jsonl": f"{r.path}/records.jsonl"}
            r.findings += [finding_dict(f, r.path, paths) for f in found]
            r.verdict = verdict([as_finding(f) for f in r.findings], r.declared_division or r.division)
    _mark_unpaired(results)


def _mark_unpaired(results: Sequence[BundleResult]) -> None:
    """``metrics.unpaired_write_half`` on each passing write half that no read-only invocation in
    the tree restores: the checker's report says so beside its PASS, the leaderboard excludes it
    with the same words."""
    restored = {(r.division, r.org, r.system, r.workload, str(r.pair["run"]["restored_from"].get("run_id")))
                for r in results if r.pair is not None and r.verdict in ("closed", "open")
                and isinstance(r.pair["run"].get("restored_from"), dict)}
    for r in results:
        if r.pair is None or r.metrics is None or r.verdict == "internal-error":
            continue
        with confined(r, "split pairs"):
            if is_write_half(r.pair["config"]):
                key = (r.division, r.org, r.system, r.workload, str(r.pair["run"]["run_id"]))
                r.metrics["unpaired_write_half"] = key not in restored
