"""The rules engine shared by the runner's gates and the checker.  Pure.

A rule set is data (``rules/<version>/rules.yaml``) plus the named check functions below; rule text
is never evaluated.  ``evaluate(ctx, stage)`` runs every rule of that stage that applies to the
context's division and returns findings (failed rules) and the rules it could not evaluate for
lack of input (e.g. ``mlckpt plan`` without ``hosts=``).

Verdicts: any ``invalid`` finding → ``invalid``; else any ``open`` finding or an open-division
run → ``open``; else ``closed``.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from mlckpt.errors import ConfigError, RuleError
from mlckpt.pipeline import MEMORY_FILESYSTEMS, Pipeline
from mlckpt.resources import rules_dir
from mlckpt.sizing import Plan, auto_rank_shift
from mlckpt.units import GiB, fmt_bytes
from mlckpt.workload import Workload

SEVERITIES = ("invalid", "open", "warning")
STAGES = ("config", "host", "result", "submission")
DEFAULT_RULES_VERSION = "1.0"


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    divisions: tuple[str, ...]
    stages: tuple[str, ...]
    check: str
    message: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    message: str
    expected: Any = None
    actual: Any = None
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"rule": self.rule, "severity": self.severity, "message": self.message,
             "expected": self.expected, "actual": self.actual}
        if self.path is not None:
            d["path"] = self.path
        return d


@dataclass(frozen=True)
class Outcome:
    """One evaluation of a rule: ``ok`` or not, with the values its message names.  ``where``
    (a host, a file) prefixes the message when a rule fails in one place of several."""

    ok: bool
    expected: Any = None
    actual: Any = None
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
    run: Any = None  # mlckpt.result_checks.RunData for the result stage
    submission: Any = None  # mlckpt.submission_checks.SubmissionFacts for the submission stage

    @property
    def division(self) -> str:
        return str(self.config.get("division", "closed"))

    @property
    def ranks(self) -> Any:
        return self.config.get("ranks")

    def get(self, dotted: str) -> Any:
        node: Any = self.config
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


CheckResult = Outcome | NotChecked | Iterable[Outcome | NotChecked]
CheckFn = Callable[[Context, "RuleSet", Rule], CheckResult]
CHECKS: dict[str, CheckFn] = {}


def check(fn: CheckFn) -> CheckFn:
    """Register a check function under its own name (the name rules.yaml uses)."""
    CHECKS[fn.__name__] = fn
    return fn


@dataclass(frozen=True)
class RuleSet:
    version: str
    rules: tuple[Rule, ...]
    data: Mapping[str, Any]
    folder: Path

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
        findings: list[Finding] = []
        skipped: list[tuple[str, str]] = []
        for rule in self.rules:
            if ctx.division not in rule.divisions or not set(stages) & set(rule.stages):
                continue
            result = CHECKS[rule.check](ctx, self, rule)
            items = [result] if isinstance(result, Outcome | NotChecked) else list(result)
            for item in items:
                if isinstance(item, NotChecked):
                    if (rule.id, item.reason) not in skipped:  # once per rule, not per host
                        skipped.append((rule.id, item.reason))
                elif not item.ok:
                    findings.append(make_finding(rule, item))
        return Evaluation(tuple(findings), tuple(skipped))

    def require_structure(self, ctx: Context) -> None:
        """Raise RuleError for the first failed structural rule: no plan exists without them."""
        for rule in self.rules:
            if rule.severity == "invalid" and rule.stages == ("config",):
                for item in _as_list(CHECKS[rule.check](ctx, self, rule)):
                    if isinstance(item, Outcome) and not item.ok:
                        raise RuleError(rule.id, make_finding(rule, item).message)


def _as_list(result: CheckResult) -> list[Outcome | NotChecked]:
    return [result] if isinstance(result, Outcome | NotChecked) else list(result)


def make_finding(rule: Rule, o: Outcome, path: str | None = None) -> Finding:
    message = rule.message.format(expected=_show(o.expected), actual=_show(o.actual))
    if o.where:
        message = f"{o.where}: {message}"
    return Finding(rule.id, rule.severity, message, o.expected, o.actual, path)


def _show(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)


def verdict(findings: Iterable[Finding], division: str | None) -> str:
    sev = {f.severity for f in findings}
    if "invalid" in sev:
        return "invalid"
    if "open" in sev or division == "open":
        return "open"
    return "closed"


@cache
def load_rules(version: str = DEFAULT_RULES_VERSION) -> RuleSet:
    import mlckpt.result_checks  # noqa: F401 - registers the result-stage checks
    from mlckpt import submission_checks  # noqa: F401 - registers the submission-stage checks

    folder = rules_dir() / version
    path = folder / "rules.yaml"
    if not path.is_file():
        known = sorted(p.name for p in rules_dir().iterdir() if (p / "rules.yaml").is_file())
        raise ConfigError(f"rules_version: unknown rules version {version!r}; known: "
                          f"{', '.join(known)}", key="rules_version")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    rules = []
    for raw in data["rules"]:
        rule = Rule(id=raw["id"], severity=raw["severity"], divisions=tuple(raw["divisions"]),
                    stages=tuple(raw["stages"]), check=raw["check"], message=raw["message"],
                    params=raw.get("params", {}))
        # A rules file naming an unknown check or severity is a defect of the rules data itself.
        if rule.check not in CHECKS:
            raise ValueError(f"{path}: rule {rule.id} names unknown check {rule.check!r}")
        if rule.severity not in SEVERITIES or not set(rule.stages) <= set(STAGES):
            raise ValueError(f"{path}: rule {rule.id} has a bad severity or stage")
        rules.append(rule)
    if data.get("version") != version:
        raise ValueError(f"{path}: declares version {data.get('version')!r}, folder is {version!r}")
    return RuleSet(version, tuple(rules), data, folder)


# --------------------------------------------------------------------------------------------
# Host mapping (pure): block placement, as `mpiexec -ppn` does.

def host_blocks(ranks: int, hosts: int | None, ranks_per_host: int | None) -> list[list[int]] | None:
    if hosts is None and ranks_per_host is None:
        return None
    if ranks_per_host is None:
        ranks_per_host = math.ceil(ranks / hosts)  # type: ignore[operator]
    count = hosts if hosts is not None else math.ceil(ranks / ranks_per_host)
    blocks = [list(range(h * ranks_per_host, min(ranks, (h + 1) * ranks_per_host)))
              for h in range(count)]
    return blocks


# --------------------------------------------------------------------------------------------
# Check functions.  Each takes (context, rule set, rule) and returns Outcome(s) or NotChecked.

@check
def ranks_multiple_of_mp(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    mp = ctx.workload.parallelism.model_parallel
    ranks = ctx.ranks
    ok = isinstance(ranks, int) and ranks > 0 and ranks % mp == 0
    actual: Any = ranks
    if not ok and isinstance(ranks, int):
        lower, upper = (ranks // mp) * mp, (ranks // mp + 1) * mp
        nearest = [n for n in (lower, upper) if n > 0]
        actual = f"{ranks} (nearest valid: {' or '.join(map(str, nearest))})"
    return Outcome(ok, mp, actual)


@check
def zero3_without_pipeline(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    p = ctx.workload.parallelism
    return Outcome(not (p.zero_stage >= 3 and p.pipeline > 1), 1, p.pipeline)


@check
def layers_cover_stages(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    w = ctx.workload
    return Outcome(w.model.num_layers >= w.parallelism.pipeline, w.parallelism.pipeline,
                   w.model.num_layers)


@check
def scale_in_range(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    scale = ctx.get("scale")
    ok = isinstance(scale, int | float) and not isinstance(scale, bool) and 0 < scale <= 1
    return Outcome(ok, "(0, 1]", scale)


@check
def counts_valid(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    w, r = ctx.get("checkpoint.num_writes"), ctx.get("checkpoint.num_reads")
    # Restores cycle through the written checkpoints, so num_reads may exceed num_writes.
    ok = isinstance(w, int) and isinstance(r, int) and w >= 1 and r >= 0
    return Outcome(ok, "num_writes >= 1 and num_reads >= 0",
                   f"num_writes={w}, num_reads={r}")


@check
def closed_canonical_workload(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    name = ctx.workload.name
    canon = rs.canonical_workloads.get(name)
    if canon is None:
        return Outcome(False, "one of " + ", ".join(rs.canonical_workloads), name)
    w = ctx.workload
    got = {"closed_ranks": w.closed_ranks,
           "model": {k: getattr(w.model, k) for k in canon["model"]},
           "parallelism": {k: getattr(w.parallelism, k) for k in canon["parallelism"]}}
    for key, want in _flatten(canon).items():
        have = _flatten(got).get(key)
        if have != want:
            return Outcome(False, f"workload.{key}={want}", f"workload.{key}={have}")
    return Outcome(True)


@check
def closed_rank_count(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome | NotChecked:
    canon = rs.canonical_workloads.get(ctx.workload.name)
    if canon is None:
        return NotChecked("not a canonical workload (see CLOSED-WORKLOAD)")
    return Outcome(ctx.ranks == canon["closed_ranks"], canon["closed_ranks"], ctx.ranks)


@check
def closed_counts(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    want = (rs.closed["num_writes"], rs.closed["num_reads"])
    have = (ctx.get("checkpoint.num_writes"), ctx.get("checkpoint.num_reads"))
    return Outcome(have == want, f"{want[0]} writes and {want[1]} reads",
                   f"{have[0]} writes and {have[1]} reads")


@check
def closed_fixed_params(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome]:
    for key, want in rs.closed["fixed_values"].items():
        have = ctx.get(key)
        yield Outcome(have == want, f"{key}={want}", f"{key}={have}")


def override_key(override: str) -> str:
    """'++io.threads=8' → 'io.threads'; '~cache' → 'cache'."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key.split("@", 1)[0]


def _allowed(key: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.endswith(".*") and (key == p[:-2] or key.startswith(p[:-1])):
            return True
        if key == p:
            return True
    return False


@check
def closed_allowed_overrides(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome]:
    # Counts and fixed values have rules of their own; don't report them twice.
    own_rules = {"checkpoint.num_writes", "checkpoint.num_reads", *rs.closed["fixed_values"]}
    for ov in ctx.overrides:
        key = override_key(ov)
        if key in own_rules or key.startswith("workload.") or key.startswith("hydra."):
            continue  # workload.* edits are CLOSED-WORKLOAD's to report, with the canonical value
        yield Outcome(_allowed(key, rs.closed["allowed_overrides"]),
                      "allowed overrides", f"'{key}'")


@check
def closed_ranks_per_host(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    minimum = rs.closed["min_ranks_per_host"]
    if ctx.hosts is None:
        yield NotChecked("host mapping unknown (give hosts= or ranks_per_host=)")
        return
    for h in ctx.hosts:
        yield Outcome(len(h.ranks) >= minimum, minimum, f"host {h.name} has {len(h.ranks)}")


@check
def accelerator_memory(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome | NotChecked:
    acc = ctx.get("accelerator")
    if ctx.plan is None:
        return NotChecked("no plan")
    need = ctx.plan.total_bytes
    if acc is None:
        if not ctx.complete:
            return NotChecked("accelerator not declared (give accelerator=NAME)")
        return Outcome(False, f"{fmt_bytes(need)} (declare accelerator=NAME)", "no accelerator")
    per = rs.accelerators.get(str(acc).lower())
    if per is None:
        return Outcome(False, "an accelerator from the rules table: " + ", ".join(rs.accelerators),
                       f"unknown accelerator {acc!r}")
    have = per * GiB * ctx.plan.ranks
    return Outcome(have >= need, fmt_bytes(need),
                   f"{ctx.plan.ranks} × {per} GiB ({acc}) = {fmt_bytes(have)}")


@check
def host_memory(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    if ctx.plan is None:
        yield NotChecked("no plan")
        return
    if ctx.hosts is None:
        yield NotChecked("host mapping unknown (give hosts= or ranks_per_host=)")
        return
    for h in ctx.hosts:
        if h.mem_available_bytes is None:
            yield NotChecked("host memory unknown (give host_memory_gib=)")
            continue
        need = host_memory_need(ctx, h)
        yield Outcome(h.mem_available_bytes >= need, fmt_bytes(need),
                      f"{fmt_bytes(h.mem_available_bytes)} available", where=f"host {h.name}")


def host_memory_need(ctx: Context, host: HostSpec) -> int:
    """Memory the ranks of ``host`` need: each rank's state (full residency: its shard or what it
    restores, whichever is larger; stream: the ring), plus async staging (a copy of its shard) and
    the drain's ring when tiered, plus the fast tier itself when it lives in this memory (tmpfs)."""
    plan = ctx.plan
    assert plan is not None
    restore = str(ctx.get("checkpoint.restore") or "own")
    stream = ctx.get("residency") == "stream"
    cap = int(ctx.get("stream_buffer_bytes") or 0)
    shift = rank_shift(ctx)
    pipe = Pipeline.of(ctx.config)
    ring = pipe.drain_ring_bytes(int(ctx.get("io.threads") or 1), int(ctx.get("io.block_size") or 0))
    need = 0
    for r in host.ranks:
        state = plan.resident_bytes(r, restore, shift)  # type: ignore[arg-type]
        need += min(cap, state) if stream else state
        need += pipe.staging_bytes(plan.own_resident_bytes(r)) + ring
    if pipe.tiered and host.fast_fs in MEMORY_FILESYSTEMS:
        need += pipe.fast_peak_checkpoints(int(ctx.get("checkpoint.num_writes") or 1)) \
            * host_checkpoint_bytes(plan, host)
    return need


def host_checkpoint_bytes(plan: Plan, host: HostSpec) -> int:
    """Bytes the ranks of ``host`` write per checkpoint, in whole pages (what a node-local tier holds)."""
    return sum(plan.own_resident_bytes(r) for r in host.ranks)


@check
def disk_space(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    if ctx.plan is None or ctx.hosts is None:
        yield NotChecked("no host measurements")
        return
    need = ctx.plan.total_bytes * int(ctx.get("checkpoint.num_writes") or 0)
    for h in ctx.hosts:
        if h.disk_free_bytes is None:
            yield NotChecked("free space not measured")
            continue
        yield Outcome(h.disk_free_bytes >= need, fmt_bytes(need),
                      f"{fmt_bytes(h.disk_free_bytes)} free", where=f"host {h.name}")


@check
def folder_usable(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    if ctx.hosts is None:
        yield NotChecked("no host measurements")
        return
    for h in ctx.hosts:
        yield Outcome(h.folder_problem is None, "writable, no foreign files", h.folder_problem,
                      where=f"host {h.name}")


@check
def async_residency(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome:
    pipe = Pipeline.of(ctx.config)
    return Outcome(pipe.mode != "async" or ctx.get("residency") == "full",
                   "residency=full with checkpoint.mode=async", f"residency={ctx.get('residency')}")


def _nested(a: str, b: str) -> bool:
    """Whether one folder is the other or inside it (relative paths: against the same directory)."""
    pa, pb = (PurePosixPath(posixpath.normpath(posixpath.join("/.cwd", x))) for x in (a, b))
    return pa == pb or pa.is_relative_to(pb) or pb.is_relative_to(pa)


@check
def tiers_distinct(ctx: Context, rs: RuleSet, rule: Rule) -> Outcome | NotChecked:
    pipe = Pipeline.of(ctx.config)
    if not pipe.tiered:
        return Outcome(True)  # nothing to keep apart
    durable = str(ctx.get("checkpoint.folder"))
    return Outcome(not _nested(str(pipe.fast), durable),
                   f"a fast tier apart from checkpoint.folder={durable}",
                   f"checkpoint.tiers.fast={pipe.fast}")


@check
def tier_space(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    pipe = Pipeline.of(ctx.config)
    if not pipe.tiered:
        yield Outcome(True)  # one tier: nothing to check
        return
    if ctx.plan is None or ctx.hosts is None:
        yield NotChecked("no host measurements")
        return
    peak = pipe.fast_peak_checkpoints(int(ctx.get("checkpoint.num_writes") or 1))
    for h in ctx.hosts:
        if h.fast_free_bytes is None:
            yield NotChecked("fast-tier free space not measured")
            continue
        need = peak * host_checkpoint_bytes(ctx.plan, h)
        held = f"{peak} checkpoint{'s' if peak > 1 else ''}"
        yield Outcome(h.fast_free_bytes >= need, f"{fmt_bytes(need)} ({held})",
                      f"{fmt_bytes(h.fast_free_bytes)} free", where=f"host {h.name}")


@check
def tier_usable(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
    if not Pipeline.of(ctx.config).tiered:
        yield Outcome(True)  # one tier: nothing to check
        return
    if ctx.hosts is None:
        yield NotChecked("no host measurements")
        return
    for h in ctx.hosts:
        yield Outcome(h.fast_problem is None, "writable, no foreign files", h.fast_problem,
                      where=f"host {h.name}")


def rank_shift(ctx: Context) -> int:
    """The effective restore rank shift: ``checkpoint.rank_shift``, with ``auto`` resolved from
    the host mapping (no hosts known: 0)."""
    value = ctx.get("checkpoint.rank_shift")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return auto_rank_shift([len(h.ranks) for h in ctx.hosts]) if ctx.hosts else 0


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out
