"""Steps 5 to 7 of a bundle's check: the facts (signed predicate against run.json, folder names,
the system description), the rules over the bundle's own data, and the submission rules and the
result."""

from __future__ import annotations

import dataclasses
from typing import Any

from checker import rule_workers
from checker.bundle_state import State, Stop
from checker.results import BundleResult, clean_text, jsonable
from checker.rulesets import (
    as_finding,
    fallback_rules,
    finding_dict,
    only,
    structural_rule_ids,
    submission_findings,
    without,
)
from checker.split import split_doc
from checker.witness_check import transcript_of, witness_doc
from mlckpt.errors import ConfigError
from mlckpt.rules import (
    TRANSCRIPT,
    Context,
    HostSpec,
    RunData,
    SubmissionFacts,
    Verdicts,
    fingerprints,
    recomputed_summary,
    resume_recomputed,
    serving_recomputed,
    verdict,
)
from mlckpt.strict import mapping_at
from mlckpt.workload.layout import Plan, make_plan
from mlckpt.workload.model import Workload, workload_from_config
from mlckpt.workload.pipeline import Pipeline
from mlckpt.workload.resume_run import ResumeRun
from mlckpt.workload.serving_run import ServingRun

MAX_PLAN_FILES = 1_000_000  # files the plan of one bundle may describe (1T closed: ~3,000)
METRIC_KEYS = ("write_bandwidth_mean_gib_s", "write_bandwidth_median_gib_s", "write_bandwidth_min_gib_s",
               "write_bandwidth_max_gib_s", "write_duration_mean_s", "read_bandwidth_mean_gib_s",
               "read_bandwidth_median_gib_s", "read_bandwidth_min_gib_s", "read_bandwidth_max_gib_s",
               "read_duration_mean_s", "num_writes", "num_reads", "checkpoint_bytes", "restore_bytes",
               "read_valid", "write_stall_mean_s", "write_time_to_durable_mean_s", "foreign", "framework")
SERVING_METRIC_KEYS = ("strategy", "replicas", "tp", "num_loads", "ready_s_median", "ready_s_min",
                       "ready_s_max", "storage_bytes", "placed_bytes", "effective_gb_s", "storage_gb_s",
                       "read_cold")
RESUME_METRIC_KEYS = ("tp", "pp", "dp", "from_ranks", "from_tp", "from_pp", "num_resumes", "ready_s_median",
                      "ready_s_min", "ready_s_max", "metadata_s_median", "planning_s_median",
                      "read_s_median", "placing_s_median", "state_bytes", "read_bytes", "amplification",
                      "rate_gb_s", "read_cold")
PREDICATE_KEYS = ("run_id", "workload", "division", "rules_version", "started", "ended", "mlckpt_version",
                  "ranks", "scaled", "verdict")


def stage_facts(state: State) -> None:
    assert state.verified is not None
    leaf, run, system = state.leaf, state.docs["run.json"], state.docs["system.json"]
    pred = state.verified.predicate
    for key in PREDICATE_KEYS:
        if key in pred and (key not in run or pred[key] != run[key] or type(pred[key]) is not type(run[key])):
            state.problem("predicate", "run.json", f"{key}={pred[key]!r} as signed in the statement",
                       f"{key}={run.get(key)!r}")
    state.passed("predicate")

    # RUNNER-RELEASED: made by a runner whose code digest the committee lists.
    if state.task.released is not None:
        digest = pred.get("runner_code_sha256")
        if digest in state.task.released:
            state.passed("runner")
        else:
            state.problem("runner", "bundle.dsse.json",
                          "a runner_code_sha256 listed in released-runners.yaml",
                       f"{clean_text(str(digest), 80)} (not a released runner)")

    # Folder names against the run they hold.
    if run["workload"] != leaf.workload:
        state.problem("layout", "run.json", f"workload {leaf.workload!r} (the folder it sits in)",
                   f"workload {run['workload']!r}")
    if leaf.run_dir not in (run["name"], run["run_id"]):
        state.problem("layout", "run.json", f"run name or run_id {leaf.run_dir!r} (the folder name)",
                   f"name {run['name']!r}, run_id {run['run_id']!r}")
    desc = system.get("description")
    names = (("system.json", (desc or {}).get("system_name")), ("run.json", run.get("system_name")))
    for source, name in names:
        if name is not None and name != leaf.system:
            state.problem("layout", source, f"system_name {leaf.system!r} (the folder it sits in)",
                       f"system_name {name!r}")

    # The system description: the tree's systems/<system>.yaml, the bundle's copy, host facts.
    info = state.task.system
    if info.doc is None:
        state.problem("system_description", info.path, "a valid system description",
                   info.problem or "unusable", tree_path=info.path)
    elif desc is None:  # run without system=: nothing ties it to the folder it was filed under
        state.problem("system_description", "system.json",
                   f"the description of {leaf.system!r} it was run with (mlckpt run system=FILE)",
                   "none: the run named no system description")
    elif desc != info.doc:
        diff = _first_difference(info.doc, desc)
        state.problem("system_description", "system.json",
                   f"the description in {info.path}", f"a different embedded description ({diff})")
    described = {h.get("hostname") for h in system["hosts"]}
    for h in run["hosts"]:
        if h["host"] not in described:
            state.problem("system_description", "system.json",
                       f"host facts for {h['host']!r} (a host of run.json)", "none")
    state.passed("layout", "system_description")


def _first_difference(a: object, b: object, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or a[k] != b[k]:
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    return f"{path or '(top level)'}: {clean_text(repr(a), 80)} vs {clean_text(repr(b), 80)}"


def plan_files_estimate(workload: Workload, ranks: int) -> int:
    per_rank = 2
    if workload.parallelism.zero_stage in (1, 2) and workload.parallelism.pipeline > 1:
        per_rank += -(-workload.model.num_layers // workload.parallelism.pipeline) + 3
    return ranks * per_rank + workload.model.num_layers


def _transcript(state: State, run: dict[str, object]) -> dict[str, object] | None:
    """A witnessed run's transcript, for the result rules that read it (WITNESS-HOST): None when
    the run claims no witness or the transcript does not open (the WITNESS-* rules say why)."""
    claim = run.get("witness")
    if not isinstance(claim, dict) or claim.get("status") != "witnessed" or state.verified is None \
            or state.folder is None or TRANSCRIPT not in state.verified.files:
        return None
    return transcript_of(state)[0]


def stage_rules(state: State) -> None:
    """The config, host and result rules over the bundle's own data (the runner's own rules)."""
    ruleset = state.rules
    assert ruleset is not None
    config, run, summary, system = (state.docs[n] for n in ("config.yaml", "run.json", "summary.json",
                                                         "system.json"))
    try:
        workload = workload_from_config(config["workload"])
    except ConfigError as exc:  # pragma: no cover - the schema makes this unreachable
        state.problem("schema", "config.yaml", "a valid workload", str(exc))
        raise Stop from None
    hosts = _bundle_hosts(state, run, system, config["ranks"])
    ctx = Context(config, workload, tuple(run["overrides"]), None, hosts, True)
    plan = _bundle_plan(state, ctx, hosts is not None)
    # The tree's description stands in for one the bundle does not embed (bandwidth bounds).
    if system.get("description") is None and state.task.system.doc is not None:
        system = {**system, "description": state.task.system.doc}
    data = RunData(run, config, summary, state.records, system, witness=_transcript(state, run))
    ctx = dataclasses.replace(ctx, plan=plan, run=data)
    state.plan_digest = plan.digest if plan is not None else None
    skip = _unrecomputable(state, config)
    ev = rule_workers.evaluate(without(ruleset, skip), ctx, ["config", "host", "result"],
                               state.task.rule_workers, len(state.records))
    serving, resume = ServingRun.of(config), ResumeRun.of(config)
    if serving is not None:  # what the report shows: recomputed, never the claim
        state.recomputed = serving_recomputed(ruleset, data, serving)
    elif resume is not None:
        state.recomputed = resume_recomputed(ruleset, data, resume)
    elif plan is not None and not skip:
        state.recomputed = recomputed_summary(ruleset, data, plan)  # the rules' own summarize, reused
    state.rule_findings = ev.findings
    state.not_checked += ev.not_checked
    division = str(config["division"])
    recomputed = verdict(ev.findings, division)
    # What stands between this bundle and the closed verdict.
    reasons = sorted({f.rule for f in ev.findings if f.severity == recomputed})
    if recomputed == "open" and division == "open":
        reasons.append("division=open")
    state.verdicts = Verdicts(state.leaf.division, recomputed, run["verdict"], tuple(reasons))
    state.where_paths["run.json"] = f"{state.leaf.path}/run.json"


def _bundle_hosts(state: State, run: dict[str, Any], system: dict[str, Any], ranks: int
                  ) -> tuple[HostSpec, ...] | None:
    """run.json's placement, with the memory each host measured (system.json); None (and the
    host rules not checked) unless every rank is placed exactly once."""
    placed = sorted(r for h in run["hosts"] for r in h["ranks"])
    if len(placed) != ranks or placed != list(range(ranks)):  # RESULT-CONSISTENT reports it
        state.not_checked.append(("HOST-MEMORY", "run.json does not place every rank exactly once"))
        return None
    mem: dict[str, int | None] = {}
    folder_fs: dict[str, str | None] = {}
    for h in system["hosts"]:
        mem.setdefault(h["hostname"], h.get("memory_available_bytes"))
        folder_fs.setdefault(h["hostname"], (h.get("filesystem") or {}).get("fs_type"))
    fast_fs = (run.get("pipeline") or {}).get("fast_fs") or {}  # a tmpfs fast tier takes memory
    return tuple(HostSpec(h["host"], tuple(h["ranks"]), mem.get(h["host"]), fast_fs=fast_fs.get(h["host"]),
                          folder_fs=folder_fs.get(h["host"])) for h in run["hosts"])


def _bundle_plan(state: State, ctx: Context, placement_ok: bool) -> Plan | None:
    """The plan, unless a structural rule fails (then there is none) or it is beyond our bounds."""
    assert state.rules is not None
    if not placement_ok:
        # No plan either: config.yaml's rank count is not the run's (and could be anything up to
        # the schema's 10 M); the plan-dependent rules are not checked.
        state.not_checked.append(("BYTES-PLAN", "run.json does not place every rank exactly once"))
        return None
    if only(state.rules, structural_rule_ids(state.rules)).evaluate(ctx, ["config"]).findings:
        return None
    ranks = int(ctx.config["ranks"])
    est = plan_files_estimate(ctx.workload, ranks)
    if est > MAX_PLAN_FILES:
        state.problem("schema", "config.yaml", f"a plan of at most {MAX_PLAN_FILES} files (checker limit)",
                   f"about {est} files ({ranks} ranks, {ctx.workload.model.num_layers} layers)")
        raise Stop
    try:
        return make_plan(ctx.workload, ranks, float(ctx.config["scale"]))
    except ValueError:
        if ctx.kind != "serving":
            raise
        # A serving run is judged by its own plan (SERVING-PLAN, SERVING-SCOPE); RANKS-MULTIPLE and
        # its kin judge checkpoint runs only, so a layout no checkpoint plan fits reaches here.
        state.not_checked.append(("BYTES-PLAN",
                                  "no checkpoint plan fits this serving run's ranks and workload "
                               "parallelism (its loads are held to their own plan: SERVING-PLAN)"))
        return None


RECOMPUTING = ("METRICS-RECOMPUTE", "SUMMARY-EXACT")  # the rules that recompute the summary


def _not_recomputed(state: State, why: str) -> list[str]:
    assert state.rules is not None
    ids = [r for r in RECOMPUTING if r in {x.id for x in state.rules.rules}]
    state.not_checked += [(r, why) for r in ids]
    return ids


def _unrecomputable(state: State, config: dict[str, object]) -> list[str]:
    """Rules whose recomputation is impossible on these records (another rule reports why)."""
    if any(r["t1_ns"] <= r["t0_ns"] for r in state.records) or any(
            s["t1_ns"] <= s["t0_ns"] for r in state.records for s in r.get("stages", ())):
        # Recomputing metrics divides by durations; RESULT-TIMES and ASYNC-TIMELINE report them.
        why = "records with non-positive durations (see RESULT-TIMES)"
        return _not_recomputed(state, why)
    stages = list(Pipeline.of(config).stages)
    if any([s.get("tier") for s in r.get("stages",
                                         ())] != stages for r in state.records if r["op"] == "write"):
        # Per-stage metrics need the same stages on every rank; PIPELINE-DECLARED reports them.
        why = "write records without the configured stages (see PIPELINE-DECLARED)"
        return _not_recomputed(state, why)
    return []


def finish(state: State) -> BundleResult:
    leaf = state.leaf
    ruleset = state.rules or fallback_rules(state.task.forced_rules)
    if state.verified is not None and state.facts["duplicates"] is None:
        state.facts["duplicates"] = []  # judged across the tree afterwards (add_duplicates)
    if state.verified is not None and state.facts["content"] is None and state.records:
        state.facts["content"] = []  # likewise
    if state.verified is not None and state.facts["split"] is None:
        state.facts["split"] = []  # likewise (checker.split.add_splits)
    if state.verified is not None and state.facts["split_evidence"] is None:
        state.facts["split_evidence"] = []  # likewise
    # each kind of problem is a SubmissionFacts field of its name (checker/bundle_state.py)
    problems: dict[str, Any] = {k: (tuple(v) if v is not None else None) for k, v in state.facts.items()}
    facts = dataclasses.replace(SubmissionFacts(verdicts=state.verdicts, witness=state.witness), **problems)
    config = state.docs.get("config.yaml") if state.verdicts is not None else None
    division = str(config["division"]) if isinstance(config, dict) else leaf.division
    sub, sub_not_checked = submission_findings(ruleset, facts, division)
    findings = [finding_dict(f, leaf.path, state.where_paths) for f in (*state.rule_findings, *sub)]
    run = mapping_at(state.docs, "run.json")
    vb = state.verified
    result = BundleResult(leaf.path, leaf.org, leaf.system, leaf.workload, leaf.division,
                          run_id=str(vb.predicate.get("run_id")) if vb else None,
                          rules_version=ruleset.version if state.rules else None,
                          keyid=vb.keyid if vb else None,
                          statement_sha256=vb.statement_sha256 if vb else None,
                          declared_division=division)
    result.findings = findings
    if state.verified is not None and state.records:
        result.fingerprints = fingerprints(state.records)
    if state.facts["schema"] == [] and isinstance(state.docs.get("config.yaml"), dict) and run:
        result.invocation = split_doc(run, state.docs["config.yaml"], state.records,
                                      state.docs.get("system.json"))
    result.integrity = ("failed" if any(f["rule"] in ruleset.integrity_rules for f in findings)
                        else "ok" if vb else "not checked")
    seen = set()
    for rule_id, reason in (*state.not_checked, *sub_not_checked):
        if (rule_id, reason) not in seen:
            seen.add((rule_id, reason))
            result.not_checked.append({"rule": rule_id, "reason": reason})
    result.verdict = verdict([as_finding(f) for f in findings], division)
    summary = state.docs.get("summary.json")
    if state.facts["schema"] == [] and isinstance(summary, dict):  # schema-valid: safe to quote
        # The recomputed figures where the records allow it (the claimed ones otherwise: a bundle
        # whose records cannot be recomputed is invalid anyway, and says so).
        shown = state.recomputed if state.recomputed is not None else summary
        metrics = {k: shown[k] for k in METRIC_KEYS if k in shown}
        if shown.get("kind") == "serving":
            metrics["serving"] = {k.removesuffix("_median"): shown[k] for k in SERVING_METRIC_KEYS}
        if shown.get("kind") == "resume":
            metrics["resume"] = {k.removesuffix("_median"): shown[k] for k in RESUME_METRIC_KEYS}
        metrics.update({k: run[k] for k in ("ranks", "scale", "scaled") if k in run})
        result.metrics = jsonable(metrics)
    if state.witness is not None and state.witness.claim:
        held = not any(str(f["rule"]).startswith("WITNESS-") for f in findings)
        result.witness = witness_doc(state.witness, held, state.rules)
    return result


# The steps, in order (``PIPELINE`` is read when each bundle is checked).
