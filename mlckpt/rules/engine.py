"""The rules engine shared by the runner's gates and the checker.  Pure; imports no checks.

A rule set is data (``rules/<version>/rules.yaml``) plus named check functions (``checks/``,
composed by ``registry``); rule text is never evaluated.  ``evaluate(ctx, stage)`` runs every rule
of that stage that applies to the context's division and returns findings (failed rules) and
the rules it could not evaluate for lack of input (e.g. ``mlckpt plan`` without ``hosts=``).

Verdicts: any ``invalid`` finding → ``invalid``; else any ``disturbed`` finding (rules 1.8: the
environment, not the storage or the submitter, spoilt the measurement) → ``disturbed``; else any
``open`` finding or an open-division run → ``open``; else ``closed``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlckpt import strict
from mlckpt.errors import ConfigError, RuleError
from mlckpt.resources import rules_dir
from mlckpt.workload.layout import Plan, auto_rank_shift
from mlckpt.workload.model import Workload

SEVERITIES = ("invalid", "disturbed", "open", "warning")
STAGES = ("config", "host", "result", "submission")
# The kinds of run a rule judges (rules.yaml ``kinds``, from rules 1.13): a checkpoint run (writes
# and restores), a serving run (replicas loading a model's weights) or, from 1.21, a resume run (a job
# resuming from a checkpoint written at another layout).  A rule that names none judges checkpoint
# runs, as every rule before 1.13 did.
KINDS = ("checkpoint", "serving", "resume")
DEFAULT_RULES_VERSION = "1.22"
# A rule's exit class (rules.yaml ``exit``): a failed ``integrity`` rule means the bytes cannot
# be trusted at all (mlckpt-check exits 3); a failed ``rules`` rule makes a result invalid or open.
EXIT_CLASSES = ("rules", "integrity")
# What a check may need (rules.yaml ``needs``), and the reason the engine gives, without calling
# the check, when the context lacks it.
NEEDS = {
    "plan": "no plan",
    "hosts": "host mapping unknown (give hosts= or ranks_per_host=)",
    # measured by the runner's gates on each host before any I/O, recorded nowhere
    "host_measurements": "no data in a bundle (the runner's gate refused the run otherwise)",
    "run": "no run data",
    "submission": "no submission facts (not run by the checker)",
}


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    divisions: tuple[str, ...]
    stages: tuple[str, ...]
    check: str
    message: str
    params: Mapping[str, Any] = field(default_factory=dict)
    exit_class: str = "rules"
    needs: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ("checkpoint",)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    message: str
    expected: object = None
    actual: object = None
    where: str | None = None  # the place (a host, a file) its message begins with, as Outcome.where

    def to_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "severity": self.severity, "message": self.message,
                "expected": self.expected, "actual": self.actual}


@dataclass(frozen=True)
class Outcome:
    """One evaluation of a rule: ``ok`` or not, with the values its message names.  ``where``
    (a host, a file) prefixes the message when a rule fails in one place of several."""

    ok: bool
    expected: object = None
    actual: object = None
    where: str | None = None


@dataclass(frozen=True)
class NotChecked:
    reason: str


@dataclass(frozen=True)
class HostSpec:
    """A host as the rules see it: its ranks and (when known) measured resources."""

    name: str
    ranks: tuple[int, ...]
    mem_available_bytes: int | None = None
    disk_free_bytes: int | None = None
    folder_problem: str | None = None  # None = folder usable
    # The fast tier (checkpoint.tiers.fast), when configured: free space, problem, filesystem type.
    fast_free_bytes: int | None = None
    fast_problem: str | None = None
    fast_fs: str | None = None
    # What the runner's probe found on the checkpoint filesystem (None: not probed).
    direct_ok: bool | None = None
    dontcache_ok: bool | None = None
    # Whether the checkpoint folder and output.root share a filesystem (None: not measured).
    results_same_fs: bool | None = None
    # Its wall clock minus rank 0's host's, both read on leaving one barrier (None: not measured).
    clock_offset_s: float | None = None
    # Object storage (rules 1.6): why this host cannot use the store (None: usable, or a folder run).
    store_problem: str | None = None
    # GPU-resident state (rules 1.7): why this host cannot hold it (None: usable, or host memory).
    gpu_problem: str | None = None
    # The checkpoint folder's filesystem type (rules 1.9: a memory-backed one cannot be read cold).
    folder_fs: str | None = None


@dataclass(frozen=True)
class Context:
    """Everything a check may look at.  ``complete`` is True for the runner and the checker:
    there a missing declaration (e.g. no accelerator in closed) is a failure, not 'unchecked'."""

    config: Mapping[str, Any]
    workload: Workload
    overrides: tuple[str, ...] = ()
    plan: Plan | None = None
    hosts: tuple[HostSpec, ...] | None = None
    complete: bool = False
    measured: bool = False  # hosts carry the runner's own measurements (its gates, on each host)
    # the result stage's RunData, the submission stage's SubmissionFacts: each stage's checks
    # narrow it (mlckpt/rules/rundata.py, checks/submission.py), which import this module
    run: object = None
    submission: object = None

    @property
    def division(self) -> str:
        return str(self.config.get("division", "closed"))

    @property
    def ranks(self) -> Any:
        return self.config.get("ranks")

    @property
    def kind(self) -> str:
        """What the run does: ``serving`` with a serving strategy (rules 1.13), ``resume`` with
        ``resume.from_ranks`` (rules 1.21), else ``checkpoint``."""
        return run_kind(self.config)

    def get(self, dotted: str) -> Any:
        node: object = self.config
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node


@dataclass(frozen=True)
class Evaluation:
    findings: tuple[Finding, ...]
    not_checked: tuple[tuple[str, str], ...]  # (rule id, reason)

    def verdict(self, division: str) -> str:
        return verdict(self.findings, division)

    @staticmethod
    def joined(parts: Iterable[Evaluation]) -> Evaluation:
        """The parts one after another (each rule's, in the rules' order: the rule set's)."""
        findings: list[Finding] = []
        skipped: list[tuple[str, str]] = []
        for part in parts:
            findings += part.findings
            skipped += part.not_checked
        return Evaluation(tuple(findings), tuple(skipped))


CheckResult = Outcome | NotChecked | Iterable[Outcome | NotChecked]
CheckFn = Callable[[Context, "RuleSet", Rule], CheckResult]


def checks_table(*fns: CheckFn) -> dict[str, CheckFn]:
    """A check module's table: each function under its own name (the name rules.yaml uses)."""
    return {fn.__name__: fn for fn in fns}


@dataclass(frozen=True)
class RuleSet:
    version: str
    rules: tuple[Rule, ...]
    data: Mapping[str, Any]
    folder: Path
    checks: Mapping[str, CheckFn]  # check name -> function (composed by mlckpt.rules.registry)

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    @property
    def canonical_workloads(self) -> Mapping[str, Any]:
        return self.data["canonical_workloads"]

    @property
    def accelerators(self) -> Mapping[str, float]:
        return self.data["accelerator_memory_gib"]

    @property
    def closed(self) -> Mapping[str, Any]:
        return self.data["closed"]

    def evaluate(self, ctx: Context, stages: Sequence[str]) -> Evaluation:
        return Evaluation.joined(self.evaluate_rule(rule, ctx, stages) for rule in self.rules)

    def evaluate_rule(self, rule: Rule, ctx: Context, stages: Sequence[str]) -> Evaluation:
        """One rule's part of :meth:`evaluate` (which is these parts in the rules' order)."""
        findings: list[Finding] = []
        skipped: list[tuple[str, str]] = []
        if ctx.division not in rule.divisions or not set(stages) & set(rule.stages) \
                or ctx.kind not in rule.kinds:
            return Evaluation((), ())
        missing = next((n for n in rule.needs if not _has(ctx, n)), None)
        if missing is not None:
            return Evaluation((), ((rule.id, NEEDS[missing]),))
        result = self.checks[rule.check](ctx, self, rule)
        items = [result] if isinstance(result, Outcome | NotChecked) else list(result)
        for item in items:
            if isinstance(item, NotChecked):
                if (rule.id, item.reason) not in skipped:  # once per rule, not per host
                    skipped.append((rule.id, item.reason))
            elif not item.ok:
                findings.append(make_finding(rule, item))
        return Evaluation(tuple(findings), tuple(skipped))

    @property
    def integrity_rules(self) -> frozenset[str]:
        """The rules whose failure means the bytes cannot be trusted (exit class integrity)."""
        return frozenset(r.id for r in self.rules if r.exit_class == "integrity")

    def require_structure(self, ctx: Context) -> None:
        """Raise RuleError for the first failed structural rule: no plan exists without them.  A
        config rule that needs what the context has not yet (the plan) is judged with the others."""
        for rule in self.rules:
            if rule.severity == "invalid" and rule.stages == ("config",) and ctx.kind in rule.kinds and all(
                    _has(ctx, n) for n in rule.needs):
                for item in _as_list(self.checks[rule.check](ctx, self, rule)):
                    if isinstance(item, Outcome) and not item.ok:
                        raise RuleError(rule.id, make_finding(rule, item).message)


def run_kind(config: Mapping[str, object]) -> str:
    serving, resume = config.get("serving"), config.get("resume")
    if isinstance(serving, Mapping) and serving.get("strategy"):
        return "serving"
    return "resume" if isinstance(resume, Mapping) and resume.get("from_ranks") else "checkpoint"


def _has(ctx: Context, need: str) -> bool:
    if need == "host_measurements":
        return ctx.measured and ctx.hosts is not None
    return getattr(ctx, need) is not None


def _as_list(result: CheckResult) -> list[Outcome | NotChecked]:
    return [result] if isinstance(result, Outcome | NotChecked) else list(result)


def make_finding(rule: Rule, o: Outcome) -> Finding:
    message = rule.message.format(expected=_show(o.expected), actual=_show(o.actual))
    if o.where:
        message = f"{o.where}: {message}"
    return Finding(rule.id, rule.severity, message, o.expected, o.actual, o.where or None)


def _show(v: object) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)


def verdict(findings: Iterable[Finding], division: str | None) -> str:
    sev = {f.severity for f in findings}
    if "invalid" in sev:
        return "invalid"
    if "disturbed" in sev:
        return "disturbed"
    if "open" in sev or division == "open":
        return "open"
    return "closed"


def known_versions() -> list[str]:
    """Every rules version this installation holds (a folder under rules/ with a rules.yaml), in
    release order (1.9 before 1.10)."""
    return sorted((p.name for p in rules_dir().iterdir() if (p / "rules.yaml").is_file()), key=version_order)


def version_order(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders a version's numeric parts as numbers: 1.9 < 1.10 < mlps-v3.0."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in version.split("."))


def load_rule_set(version: str, checks: Mapping[str, CheckFn]) -> RuleSet:
    """``rules/<version>/rules.yaml`` with its check functions (see mlckpt.rules.registry)."""
    folder = rules_dir() / version
    path = folder / "rules.yaml"
    if not path.is_file():
        raise ConfigError(f"rules_version: unknown rules version {version!r}; known: "
                          f"{', '.join(known_versions())}", key="rules_version")
    data = strict.parse_yaml(path.read_bytes())  # released rule data, read like any input
    facts = _sidecar_facts(folder)
    rules = [_rule(raw, facts.get(raw["id"], {}), checks, path) for raw in data["rules"]]
    if data.get("version") != version:
        raise ValueError(f"{path}: declares version {data.get('version')!r}, folder is {version!r}")
    if "extends" in data:
        return _extended(version, data, tuple(rules), folder, checks, path)
    return RuleSet(version, tuple(rules), data, folder, checks)


def _extended(version: str, data: Mapping[str, Any], own: tuple[Rule, ...], folder: Path,
              checks: Mapping[str, CheckFn], path: Path) -> RuleSet:
    """A rule set written on top of another (``extends: BASE``): the base's rules less those it
    ``omit``s (it states its own version of them), each rule named under ``cite`` with the source
    section appended to its message, then its own rules; its data keys replace the base's."""
    base = load_rule_set(str(data["extends"]), checks)
    omit, cite = set(data.get("omit", ())), dict(data.get("cite", {}))
    known = {r.id for r in base.rules}
    if (omit | set(cite)) - known or (known - omit) & {r.id for r in own}:
        raise ValueError(f"{path}: omit/cite name unknown rules, or a rule id repeats the base's")
    kinds = {rule_id: tuple(ks) for rule_id, ks in dict(data.get("kinds", {})).items()}
    if set(kinds) - (known - omit) or any(not ks or set(ks) - set(KINDS) for ks in kinds.values()):
        raise ValueError(f"{path}: kinds names unknown rules or kinds")
    kept = tuple(replace(r, message=f"{r.message} ({cite[r.id]})" if r.id in cite else r.message,
                         kinds=kinds.get(r.id, r.kinds))
                 for r in base.rules if r.id not in omit)
    merged = {**base.data, **{k: v for k, v in data.items() if k not in ("omit", "cite", "kinds")}}
    return RuleSet(version, kept + own, merged, folder, checks)


# --------------------------------------------------------------------------------------------
# Host mapping (pure): block placement, as `mpiexec -ppn` does.

def _sidecar_facts(folder: Path) -> dict[str, Any]:
    """Facts about the rules of a version released before rules.yaml carried them (``exit``,
    ``needs``), kept beside its folder in ``<version>.facts.yaml`` so the folder stays as released."""
    sidecar = folder.parent / f"{folder.name}.facts.yaml"
    if not sidecar.is_file():
        return {}
    return dict(strict.parse_yaml(sidecar.read_bytes())["rules"])


def _rule(raw: Mapping[str, Any], extra: Mapping[str, Any], checks: Mapping[str, CheckFn],
          path: Path) -> Rule:
    facts = {**extra, **{k: raw[k] for k in ("exit", "needs") if k in raw}}
    rule = Rule(id=raw["id"], severity=raw["severity"], divisions=tuple(raw["divisions"]),
                stages=tuple(raw["stages"]), check=raw["check"], message=raw["message"],
                params=raw.get("params", {}), exit_class=facts.get("exit", "rules"),
                needs=tuple(facts.get("needs", ())), kinds=tuple(raw.get("kinds", ("checkpoint",))))
    # A rules file naming an unknown check, severity, exit class or need is a defect of the data.
    if rule.check not in checks:
        raise ValueError(f"{path}: rule {rule.id} names unknown check {rule.check!r}")
    if rule.severity not in SEVERITIES or not set(rule.stages) <= set(STAGES):
        raise ValueError(f"{path}: rule {rule.id} has a bad severity or stage")
    if rule.exit_class not in EXIT_CLASSES or not set(rule.needs) <= set(NEEDS):
        raise ValueError(f"{path}: rule {rule.id} has a bad exit class or need")
    if not rule.kinds or not set(rule.kinds) <= set(KINDS):
        raise ValueError(f"{path}: rule {rule.id} has a bad kind")
    return rule


def host_blocks(ranks: int, hosts: int | None, ranks_per_host: int | None) -> list[list[int]] | None:
    if hosts is None and ranks_per_host is None:
        return None
    if ranks_per_host is None:
        ranks_per_host = math.ceil(ranks / hosts)  # type: ignore[operator]
    count = hosts if hosts is not None else math.ceil(ranks / ranks_per_host)
    blocks = [list(range(h * ranks_per_host, min(ranks, (h + 1) * ranks_per_host)))
              for h in range(count)]
    return blocks



def rank_shift(ctx: Context) -> int:
    """The effective restore rank shift: ``checkpoint.rank_shift``, with ``auto`` resolved from
    the host mapping (no hosts known: 0)."""
    value = ctx.get("checkpoint.rank_shift")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return auto_rank_shift([len(h.ranks) for h in ctx.hosts]) if ctx.hosts else 0


