"""Check functions of the ``config`` stage (and the pure pre-I/O checks of the pipeline): the
configuration, the workload and the closed division's fixed values.  Pure."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath

from mlckpt.command_line import override_key
from mlckpt.rules.engine import Context, NotChecked, Outcome, Rule, RuleSet, checks_table
from mlckpt.units import GiB, fmt_bytes
from mlckpt.workload.pipeline import Pipeline


def ranks_multiple_of_mp(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    mp = ctx.workload.parallelism.model_parallel
    ranks = ctx.ranks
    ok = isinstance(ranks, int) and ranks > 0 and ranks % mp == 0
    actual: object = ranks
    if not ok and isinstance(ranks, int):
        lower, upper = (ranks // mp) * mp, (ranks // mp + 1) * mp
        nearest = [n for n in (lower, upper) if n > 0]
        actual = f"{ranks} (nearest valid: {' or '.join(map(str, nearest))})"
    return Outcome(ok, mp, actual)


def zero3_without_pipeline(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    p = ctx.workload.parallelism
    return Outcome(not (p.zero_stage >= 3 and p.pipeline > 1), 1, p.pipeline)


def layers_cover_stages(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    w = ctx.workload
    return Outcome(w.model.num_layers >= w.parallelism.pipeline, w.parallelism.pipeline,
                   w.model.num_layers)


def scale_in_range(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    scale = ctx.get("scale")
    ok = isinstance(scale, int | float) and not isinstance(scale, bool) and 0 < scale <= 1
    return Outcome(ok, "(0, 1]", scale)


def counts_valid(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    w, r = ctx.get("checkpoint.num_writes"), ctx.get("checkpoint.num_reads")
    source = ctx.get("checkpoint.restore_from")
    # Restores cycle through the written checkpoints, so num_reads may exceed num_writes.  A
    # read-only invocation (rules 1.3) writes none and restores another invocation's.
    if source:
        ok = isinstance(r, int) and w == 0 and r >= 1
        return Outcome(ok, "num_writes=0 and num_reads >= 1 with restore_from",
                       f"num_writes={w}, num_reads={r}")
    ok = isinstance(w, int) and isinstance(r, int) and w >= 1 and r >= 0
    return Outcome(ok, "num_writes >= 1 and num_reads >= 0 (num_writes=0 needs restore_from)",
                   f"num_writes={w}, num_reads={r}")


def closed_canonical_workload(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    name = ctx.workload.name
    canon = ruleset.canonical_workloads.get(name)
    if canon is None:
        return Outcome(False, "one of " + ", ".join(ruleset.canonical_workloads), name)
    w = ctx.workload
    got = {"closed_ranks": w.closed_ranks,
           "model": {k: getattr(w.model, k) for k in canon["model"]},
           "parallelism": {k: getattr(w.parallelism, k) for k in canon["parallelism"]}}
    for key, want in _flatten(canon).items():
        have = _flatten(got).get(key)
        if have != want:
            return Outcome(False, f"workload.{key}={want}", f"workload.{key}={have}")
    return Outcome(True)


def canonical_name(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    """Rules 1.10, every division: a workload named as a canonical one has that workload's model
    (its parallelism and rank count may change in the open division; its architecture may not, or
    the result would be listed under another model's name)."""
    canon = ruleset.canonical_workloads.get(ctx.workload.name)
    if canon is None:
        return Outcome(True)
    got = {"model": {k: getattr(ctx.workload.model, k) for k in canon["model"]}}
    for key, want in _flatten({"model": canon["model"]}).items():
        have = _flatten(got).get(key)
        if have != want:
            return Outcome(False, f"workload.{key}={want} for {ctx.workload.name}",
                           f"workload.{key}={have} (a changed model takes a name of its own: "
                           f"workload.name=...)")
    return Outcome(True)


def closed_rank_count(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    canon = ruleset.canonical_workloads.get(ctx.workload.name)
    if canon is None:
        return NotChecked("not a canonical workload (see CLOSED-WORKLOAD)")
    return Outcome(ctx.ranks == canon["closed_ranks"], canon["closed_ranks"], ctx.ranks)


def closed_counts(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    want = (ruleset.closed["num_writes"], ruleset.closed["num_reads"])
    have = (ctx.get("checkpoint.num_writes"), ctx.get("checkpoint.num_reads"))
    return Outcome(have == want, f"{want[0]} writes and {want[1]} reads",
                   f"{have[0]} writes and {have[1]} reads")


def closed_fixed_params(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    for key, want in ruleset.closed["fixed_values"].items():
        have = ctx.get(key)
        yield Outcome(have == want, f"{key}={want}", f"{key}={have}")


def _allowed(key: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.endswith(".*") and (key == p[:-2] or key.startswith(p[:-1])):
            return True
        if key == p:
            return True
    return False


def closed_allowed_overrides(ctx: Context, ruleset: RuleSet, rule: Rule) -> Iterator[Outcome]:
    # Counts and fixed values have rules of their own; don't report them twice.
    own_rules = {"checkpoint.num_writes", "checkpoint.num_reads", *ruleset.closed["fixed_values"]}
    for ov in ctx.overrides:
        key = override_key(ov)
        if key in own_rules or key.startswith("workload.") or key.startswith("hydra."):
            continue  # workload.* edits are CLOSED-WORKLOAD's to report, with the canonical value
        yield Outcome(_allowed(key, ruleset.closed["allowed_overrides"]),
                      "allowed overrides", f"'{key}'")


def accelerator_memory(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    acc = ctx.get("accelerator")
    assert ctx.plan is not None  # needs: [plan]
    need = ctx.plan.total_bytes
    if acc is None:
        if not ctx.complete:
            return NotChecked("accelerator not declared (give accelerator=NAME)")
        return Outcome(False, f"{fmt_bytes(need)} (declare accelerator=NAME)", "no accelerator")
    per = ruleset.accelerators.get(str(acc).lower())
    if per is None:
        return Outcome(False, "an accelerator from the rules table: " + ", ".join(ruleset.accelerators),
                       f"unknown accelerator {acc!r}")
    have = per * GiB * ctx.plan.ranks
    return Outcome(have >= need, fmt_bytes(need),
                   f"{ctx.plan.ranks} × {per} GiB ({acc}) = {fmt_bytes(have)}")


def async_residency(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome:
    pipe = Pipeline.of(ctx.config)
    return Outcome(pipe.mode != "async" or ctx.get("residency") == "full",
                   "residency=full with checkpoint.mode=async", f"residency={ctx.get('residency')}")


def _nested(a: str, b: str) -> bool:
    """Whether one folder is the other or inside it (relative paths: against the same directory)."""
    pa, pb = (PurePosixPath(posixpath.normpath(posixpath.join("/.cwd", x))) for x in (a, b))
    return pa == pb or pa.is_relative_to(pb) or pb.is_relative_to(pa)


def tiers_distinct(ctx: Context, ruleset: RuleSet, rule: Rule) -> Outcome | NotChecked:
    pipe = Pipeline.of(ctx.config)
    if not pipe.tiered:
        return Outcome(True)  # nothing to keep apart
    durable = str(ctx.get("checkpoint.folder"))
    return Outcome(not _nested(str(pipe.fast), durable),
                   f"a fast tier apart from checkpoint.folder={durable}",
                   f"checkpoint.tiers.fast={pipe.fast}")


def _flatten(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out



CHECKS = checks_table(
    ranks_multiple_of_mp,
    zero3_without_pipeline,
    layers_cover_stages,
    scale_in_range,
    counts_valid,
    closed_canonical_workload,
    canonical_name,
    closed_rank_count,
    closed_counts,
    closed_fixed_params,
    closed_allowed_overrides,
    accelerator_memory,
    async_residency,
    tiers_distinct,
)
