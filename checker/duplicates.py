"""DUPLICATE-RUN and DUPLICATE-CONTENT across the bundles of a tree."""

from __future__ import annotations

from collections.abc import Sequence

from checker.results import BundleResult, confined
from checker.rulesets import as_finding, fallback_rules, finding_dict, submission_findings
from mlckpt.rules import (
    Problem,
    SubmissionFacts,
    load_rules,
    verdict,
)


def add_duplicates(results: Sequence[BundleResult], forced_rules: str | None = None) -> None:
    """DUPLICATE-RUN: the same signed statement or run_id submitted more than once in the tree."""
    groups: dict[tuple[str, str], list[BundleResult]] = {}
    for r in results:
        if r.integrity != "ok":
            continue
        if r.statement_sha256:
            groups.setdefault(("statement", r.statement_sha256), []).append(r)
        if r.run_id:
            groups.setdefault(("run_id", r.run_id), []).append(r)
    problems: dict[int, list[Problem]] = {}
    for r in results:
        same_statement = [o for o in groups.get(("statement", r.statement_sha256 or ""), []) if o is not r]
        same_run = [o for o in groups.get(("run_id", r.run_id or ""), [])
                    if o is not r and o not in same_statement]
        for others, label in ((same_statement, f"signed statement (run_id {r.run_id})"),
                              (same_run, f"run_id {r.run_id}")):
            if others:
                problems.setdefault(id(r), []).append(Problem(
                    "run.json", "a run submitted once",
                    f"the same {label} as {', '.join(o.path for o in others)}"))
    content = _same_content(results)
    for r in results:
        if id(r) not in problems and id(r) not in content:
            continue
        with confined(r, "duplicates"):
            ruleset = load_rules(r.rules_version) if r.rules_version else fallback_rules(forced_rules)
            facts = SubmissionFacts(duplicates=tuple(problems.get(id(r), ())),
                                    content=tuple(content.get(id(r), ())))
            found, _ = submission_findings(ruleset, facts, r.declared_division or r.division)
            r.findings += [finding_dict(f, r.path, {"run.json": f"{r.path}/run.json"}) for f in found]
        if r.verdict != "internal-error":
            r.verdict = verdict([as_finding(f) for f in r.findings], r.declared_division or r.division)



def _same_content(results: Sequence[BundleResult]) -> dict[int, list[Problem]]:
    """DUPLICATE-CONTENT: bundles of different run ids whose measurements are the same (their
    record timings, or their absolute clock readings: mlckpt.rules.checks.evidence.fingerprints),
    whatever their system or organisation.  Every copy is reported, the first one too: which of
    them is the original the bundles cannot say."""
    groups: dict[str, list[BundleResult]] = {}
    for r in results:
        if r.integrity == "ok":
            for fp in r.fingerprints:
                groups.setdefault(fp, []).append(r)
    out: dict[int, list[Problem]] = {}
    for fp, members in groups.items():
        for r in members:
            others = [o for o in members if o is not r and o.run_id != r.run_id]
            if others and id(r) not in out:
                what = "record timings" if fp.startswith("timings:") else "clock readings"
                out[id(r)] = [Problem("records.jsonl", "measurements of its own",
                                      f"the same {what} as {', '.join(o.path for o in others)}")]
    return out
