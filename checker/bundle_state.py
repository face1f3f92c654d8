"""One bundle's check in progress: the facts collected so far, and how a step stops the rest."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker.results import Task
from checker.tree import Leaf
from mlckpt import bundle
from mlckpt.rules import (
    Finding,
    Problem,
    RuleSet,
    SubmissionFacts,
    Verdicts,
    WitnessFacts,
)


class Stop(Exception):
    """The current stage makes the later ones meaningless."""


@dataclass
class State:
    task: Task
    folder: Path | None = None
    facts: dict[str, list[Problem] | None] = field(default_factory=lambda: {
        f.name: None for f in dataclasses.fields(SubmissionFacts) if f.name not in ("verdicts", "witness")})
    where_paths: dict[str, str] = field(default_factory=dict)  # finding prefix -> report path
    verified: bundle.VerifiedBundle | None = None
    rules: RuleSet | None = None
    docs: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    recomputed: dict[str, object] | None = None  # summary.json as the records and plan give it
    rule_findings: tuple[Finding, ...] = ()
    not_checked: list[tuple[str, str]] = field(default_factory=list)
    verdicts: Verdicts | None = None
    plan_digest: str | None = None  # the layout's digest, recomputed from config.yaml (a witness saw it)
    witness: WitnessFacts | None = None
    transcript: tuple[Any, ...] | None = None  # open_transcript's (document, signer, why not), once
    stage: str = "layout"
    tmp: str | None = None  # where an archive was unpacked
    started: float = field(default_factory=time.monotonic)
    out_of_time: bool = False  # the budget's finding is made (once, in whichever stage found it)

    @property
    def leaf(self) -> Leaf:
        return self.task.leaf

    def problem(self, kind: str, where: str, expected: object, actual: object, *, tree_path: str | None = None
                ) -> None:
        items = self.facts[kind]
        if items is None:
            items = self.facts[kind] = []
        items.append(Problem(where, expected, actual))
        self.where_paths[where] = tree_path if tree_path is not None else f"{self.leaf.path}/{where}"

    def over_budget(self) -> bool:
        """Past the task's time budget: the check stops here, with a schema finding saying so
        (one pathological bundle cannot hold a tree's check; the others are still judged)."""
        took = time.monotonic() - self.started
        if took <= self.task.budget_s:
            return False
        if self.out_of_time:
            return True
        self.out_of_time = True
        self.problem("schema", "bundle", f"a bundle the checker judges within its budget of "
                     f"{self.task.budget_s:g} s (mlckpt-check --bundle-budget)",
                     f"still in stage {self.stage} after {took:.1f} s", tree_path=self.leaf.path)
        return True

    def passed(self, *kinds: str) -> None:
        for kind in kinds:
            if self.facts[kind] is None:
                self.facts[kind] = []


