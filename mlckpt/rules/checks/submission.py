"""Check functions for the ``submission`` stage: a bundle judged in its place in a submission tree.
Pure.

The checker (``checker/``) walks the tree, verifies each bundle, parses and schema-validates its
files, runs the config/host/result rules, and records what it found as :class:`SubmissionFacts`
in ``Context.submission``.  The functions below only read those facts: each rule reports every
:class:`Problem` collected for it, passes when the list is empty, and is *not checked* when the
checker never got that far (``None``: an earlier stage stopped the bundle's pipeline).

``mlckpt.rules.registry`` composes them with every other check, so rule text in ``rules.yaml``
names them and is never evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlckpt.rules.engine import CheckFn, Context, NotChecked, Outcome, Rule, RuleSet, checks_table

if TYPE_CHECKING:
    from mlckpt.rules.checks.witness import WitnessFacts


@dataclass(frozen=True)
class Problem:
    """One thing wrong, and where: ``where`` is a path (relative to the bundle for its files,
    relative to the tree root otherwise); it prefixes the rule's message."""

    where: str
    expected: object
    actual: object


Problems = tuple[Problem, ...]


@dataclass(frozen=True)
class Verdicts:
    """What the rules concluded about a bundle, next to what it claims and where it sits."""

    tree_division: str  # the closed/ or open/ folder the bundle sits under
    recomputed: str  # verdict of the config/host/result rules over the bundle's own data
    recorded: str | None  # run.json's verdict
    reasons: tuple[str, ...] = ()  # rule IDs behind a verdict other than closed
    where: str = "run.json"


@dataclass(frozen=True)
class SubmissionFacts:
    """Facts the checker collected about one bundle (or the tree).  ``None`` = not collected."""

    layout: Problems | None = None
    signature: Problems | None = None
    key: Problems | None = None
    files: Problems | None = None
    paths: Problems | None = None
    schema: Problems | None = None
    rules_version: Problems | None = None
    predicate: Problems | None = None
    system_description: Problems | None = None
    verdicts: Verdicts | None = None
    duplicates: Problems | None = None
    runner: Problems | None = None  # RUNNER-RELEASED; None also where the tree lists no runners
    content: Problems | None = None  # DUPLICATE-CONTENT
    split: Problems | None = None  # SPLIT-PAIR (read-only invocations; () passes any other run)
    split_gap_s: float | None = None  # a read-only invocation: from its write invocation's end to its start
    split_evidence: Problems | None = None  # SPLIT-EVIDENCE (rules 1.10): the content proof, the clocks
    witness: WitnessFacts | None = None  # rules 1.4; None: not reached


def _facts(ctx: Context) -> SubmissionFacts:
    """The checker's facts; every submission rule declares ``needs: [submission]``, so the engine
    never calls a check without them (a rule that forgot the need is a defect of the rules data)."""
    if not isinstance(ctx.submission, SubmissionFacts):
        raise TypeError("a submission-stage rule was evaluated without facts: declare needs: [submission]")
    return ctx.submission


def report_problems(ctx: Context, name: str) -> Iterator[Outcome | NotChecked]:
    problems: Sequence[Problem] | None = getattr(_facts(ctx), name)
    if problems is None:
        yield NotChecked("not reached: an earlier stage stopped this bundle")
        return
    if not problems:
        yield Outcome(True)
        return
    for p in problems:
        yield Outcome(False, p.expected, p.actual, where=p.where)


# The checks that report what the checker collected under one name of SubmissionFacts.
REPORTED = {
    "bundle_layout": "layout",
    "bundle_signature": "signature",
    "bundle_key": "key",
    "bundle_files": "files",
    "bundle_paths": "paths",
    "bundle_schema": "schema",
    "rules_version_known": "rules_version",
    "bundle_predicate": "predicate",
    "system_description": "system_description",
    "duplicate_run": "duplicates",
    "duplicate_content": "content",
}


def reporter(check: str, facts: str) -> CheckFn:
    """The check named ``check``: every problem in ``SubmissionFacts.<facts>``."""

    def report(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
        yield from report_problems(ctx, facts)

    report.__name__ = report.__qualname__ = check
    report.__doc__ = f"Every problem the checker collected as ``{facts}``; passes when there is none."
    return report


def runner_released(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    if _facts(ctx).runner is None:
        yield NotChecked("the tree has no released-runners.yaml (or an earlier stage stopped this bundle)")
        return
    yield from report_problems(ctx, "runner")


def _because(v: Verdicts) -> str:
    return f" ({', '.join(v.reasons)})" if v.reasons else ""


def division_placement(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """A bundle under closed/ must earn the closed verdict.  Under open/ any valid verdict is
    fine: a closed-eligible run may always be published in the open division."""
    v = _facts(ctx).verdicts
    if v is None:
        return NotChecked("rules not evaluated")
    if v.tree_division != "closed":
        return Outcome(True)
    return Outcome(v.recomputed == "closed", "verdict closed (the bundle sits under closed/)",
                   f"verdict {v.recomputed}{_because(v)}")


def result_verdict(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    """The verdict run.json records must be the one the same rules give on the same data."""
    v = _facts(ctx).verdicts
    if v is None:
        return NotChecked("rules not evaluated")
    return Outcome(v.recorded == v.recomputed, f"{v.recomputed}{_because(v)}", v.recorded,
                   where=v.where)


CHECKS = checks_table(
    *(reporter(check, facts) for check, facts in REPORTED.items()),
    runner_released,
    division_placement,
    result_verdict,
)
