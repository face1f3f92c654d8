"""The per-bundle pipeline.  Each stage records facts; a stage that makes later ones meaningless
stops the pipeline; at the end the rules judge the facts.

1. layout     the leaf is a folder or a packed bundle (unpacked with ``bundle.safe_unpack``),
              the files every bundle has are present
2. integrity  ``bundle.verify_bundle`` against the trusted keys: signature, signer registered for
              the organisation the bundle sits under, file set, digests, paths.  Nothing is parsed
              before this passes.
3. version    the rules version the bundle declares (or ``--rules``) must be known
4. schema     strict, bounded parsing (:mod:`checker.loading`) and JSON Schema of every file
5. facts      signed predicate vs run.json, folder names vs the run, system description
6. rules      the runner's own rules module: config, host and result stages on a Context built
              from the bundle (recomputation and plausibility are result-stage rules), then the
              recomputed verdict against the recorded one and the division folder
7. submission the ``submission`` stage rules over the collected facts (mlckpt/rules/checks/submission.py)

Any unexpected exception is a checker fault: an ``INTERNAL`` finding for that bundle only.
Hostile input never gets there: every parse and schema problem is a finding.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker import loading
from checker.loading import ParseError
from checker.results import INTERNAL, BundleResult, Task, clean_text, jsonable
from checker.rulesets import (
    MAX_SCHEMA_ERRORS,
    _as_finding,
    _err_key,
    fallback_rules,
    finding_dict,
    known_rules_versions,
    only,
    schema_message,
    structural_rule_ids,
    submission_findings,
    without,
)
from checker.tree import Leaf
from mlckpt import bundle
from mlckpt.errors import BundleIntegrityError, ConfigError, IntegrityKind, MlckptError
from mlckpt.pipeline import Pipeline
from mlckpt.rules import (
    Context,
    Finding,
    HostSpec,
    RuleSet,
    load_rules,
    verdict,
)
from mlckpt.rules.checks.result import RunData
from mlckpt.rules.checks.submission import INTEGRITY_RULES, Problem, SubmissionFacts, Verdicts
from mlckpt.schemas import validator
from mlckpt.sizing import Plan, make_plan
from mlckpt.workload import Workload, workload_from_config

REQUIRED_FILES = ("run.json", "config.yaml", "records.jsonl", "summary.json", "system.json",
                  bundle.SIGNATURE_FILE)


# Bundle file -> (schema name, parser).
DOCUMENTS = (("run.json", "run"), ("config.yaml", "config"), ("summary.json", "summary"),
             ("system.json", "system"))


MAX_SCHEMA_PROBLEMS = 10  # reported per file




MAX_PLAN_FILES = 1_000_000  # files the plan of one bundle may describe (1T closed: ~3,000)


# safe_unpack bounds for packed bundles: the parse caps plus room for logs.
ARCHIVE_MAX_TOTAL = 1 << 30


ARCHIVE_MAX_MEMBER = 600 << 20


ARCHIVE_MAX_MEMBERS = 1000


METRIC_KEYS = ("write_bandwidth_mean_gib_s", "write_bandwidth_median_gib_s", "write_bandwidth_min_gib_s",
               "write_bandwidth_max_gib_s", "write_duration_mean_s", "read_bandwidth_mean_gib_s",
               "read_bandwidth_median_gib_s", "read_bandwidth_min_gib_s", "read_bandwidth_max_gib_s",
               "read_duration_mean_s", "num_writes", "num_reads", "checkpoint_bytes", "restore_bytes",
               "read_valid", "write_stall_mean_s", "write_time_to_durable_mean_s")


# Checks of host facts the runner measures before any I/O but does not record (free space, the
# checkpoint folder's state): not checkable from a bundle.
NO_BUNDLE_DATA_CHECKS = frozenset({"disk_space", "folder_usable", "tier_space", "tier_usable"})


EXPECTED = {
    "signature": "a valid Ed25519 signature over the bundle's statement",
    "key": "a signing key registered for this organisation",
    "files": "exactly the files the statement signs, with their digests",
    "paths": "relative paths to regular files only",
}


class Stop(Exception):
    """The current stage makes the later ones meaningless."""


@dataclass
class State:
    task: Task
    folder: Path | None = None
    facts: dict[str, list[Problem] | None] = field(default_factory=lambda: {
        f.name: None for f in dataclasses.fields(SubmissionFacts) if f.name != "verdicts"})
    where_paths: dict[str, str] = field(default_factory=dict)  # finding prefix -> report path
    verified: bundle.VerifiedBundle | None = None
    rules: RuleSet | None = None
    docs: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    rule_findings: tuple[Finding, ...] = ()
    not_checked: list[tuple[str, str]] = field(default_factory=list)
    verdicts: Verdicts | None = None
    stage: str = "layout"
    tmp: str | None = None  # where an archive was unpacked

    @property
    def leaf(self) -> Leaf:
        return self.task.leaf

    def problem(self, kind: str, where: str, expected: Any, actual: Any, *, tree_path: str | None = None
                ) -> None:
        items = self.facts[kind]
        if items is None:
            items = self.facts[kind] = []
        items.append(Problem(where, expected, actual))
        self.where_paths[where] = tree_path if tree_path is not None else f"{self.leaf.path}/{where}"

    def passed(self, *kinds: str) -> None:
        for kind in kinds:
            if self.facts[kind] is None:
                self.facts[kind] = []


def check_bundle(task: Task) -> BundleResult:
    """Check one bundle; never raises (a fault of the checker becomes an INTERNAL finding)."""
    st = State(task)
    try:
        try:
            for name, step in PIPELINE:
                st.stage = name
                step(st)
        except Stop:
            pass
        st.stage = "submission"
        return finish(st)
    except Exception as exc:  # a checker fault, by construction never the submitter's
        return internal_result(task.leaf, st.stage, exc)
    finally:
        if st.tmp is not None:
            shutil.rmtree(st.tmp, ignore_errors=True)




def internal_result(leaf: Leaf, stage: str, exc: BaseException) -> BundleResult:
    if os.environ.get("MLCKPT_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
    message = (f"checker fault in stage {stage}: {type(exc).__name__}: {clean_text(str(exc), 300)} "
               "(a defect of mlckpt-check, not of this submission; MLCKPT_DEBUG=1 shows the traceback)")
    return BundleResult(leaf.path, leaf.org, leaf.system, leaf.workload, leaf.division,
                        verdict="internal-error",
                        findings=[{"rule": INTERNAL, "severity": "internal", "path": leaf.path,
                                   "message": message, "expected": None, "actual": None}])


def stage_layout(st: State) -> None:
    """Locate the bundle folder (unpacking an archive into a temporary folder)."""
    leaf = st.leaf
    leaf_path = Path(st.task.root) / leaf.path
    if leaf.symlink:
        st.problem("paths", ".", "a bundle folder or .tar.gz", "a symlink (never followed)",
                   tree_path=leaf.path)
        raise Stop
    if leaf.archive:
        st.tmp = tempfile.mkdtemp(prefix="mlckpt-check-")
        dest = Path(st.tmp) / "bundle"
        try:
            bundle.safe_unpack(leaf_path, dest, max_members=ARCHIVE_MAX_MEMBERS,
                               max_total_bytes=ARCHIVE_MAX_TOTAL, max_member_bytes=ARCHIVE_MAX_MEMBER)
        except BundleIntegrityError as exc:
            for p in exc.problems:
                path, msg = p
                kind = IntegrityKind.PATHS if p.kind == IntegrityKind.PATHS else IntegrityKind.FILES
                st.problem(kind, f"(archive) {path}" if path != "(archive)" else "(archive)",
                           EXPECTED[kind], msg, tree_path=leaf.path)
            raise Stop from None
        except MlckptError as exc:
            st.problem("files", "(archive)", "a readable .tar.gz", str(exc), tree_path=leaf.path)
            raise Stop from None
        st.folder = bundle.find_bundle_root(dest)
    else:
        st.folder = leaf_path
    missing = [name for name in REQUIRED_FILES if not os.path.lexists(st.folder / name)]
    for name in missing:
        st.problem("layout", name, f"the bundle files {', '.join(REQUIRED_FILES)}", "missing")
    if not missing:
        st.passed("layout")


def stage_integrity(st: State) -> None:
    leaf, trusted = st.leaf, st.task.trusted
    assert st.folder is not None
    try:
        # The organisation is compared below (not via org=) so that a key of another
        # organisation still gets the whole bundle verified and reported.
        vb = bundle.verify_bundle(st.folder, trusted)
    except BundleIntegrityError as exc:
        kinds = set()
        for p in exc.problems:
            path, msg, kind = p[0], p[1], p.kind  # typed where mlckpt.bundle raised it
            kinds.add(kind)
            st.problem(kind, path, EXPECTED[kind] if kind != "key" else
                       f"a signing key registered for {leaf.org!r}", msg)
        if not kinds & {"signature", "key"}:
            # The signature held (verify_bundle judges files only after it): who signed?
            st.passed("signature", "files", "paths")
            _check_signer_org(st, _signed_keyid(st.folder))
        raise Stop from None
    except MlckptError as exc:  # the folder vanished
        st.problem("files", ".", "a readable bundle folder", str(exc))
        raise Stop from None
    except OSError as exc:  # unreadable (permissions): say so, it is not a checker defect
        st.problem("files", ".", "a readable bundle folder", f"cannot read: {exc.strerror or exc}")
        raise Stop from None
    st.passed("signature", "files", "paths")
    if not _check_signer_org(st, vb.keyid):
        raise Stop
    st.verified = vb
    if st.facts["layout"]:
        raise Stop  # a required file is missing (and unsigned): nothing to parse


def _signed_keyid(folder: Path) -> str | None:
    try:
        env = loading.parse_json(loading.read_capped(folder / bundle.SIGNATURE_FILE, 16 << 20))
        return str(env["signatures"][0]["keyid"])
    except (ParseError, KeyError, IndexError, TypeError):
        return None


def _check_signer_org(st: State, keyid: str | None) -> bool:
    """The signer's key must be registered for the organisation the bundle sits under."""
    leaf, trusted = st.leaf, st.task.trusted
    signer = trusted.org_for(keyid) if keyid else None
    if keyid is not None and signer == leaf.org:
        st.passed("key")
        return True
    has_keys = bool(trusted.keys_for(leaf.org))
    st.problem("key", bundle.SIGNATURE_FILE, f"a signing key registered for {leaf.org!r}",
               f"key {keyid} registered for {signer!r}" +
               ("" if has_keys else f" ({leaf.org!r} has no registered keys)"))
    return False


def stage_rules_version(st: State) -> None:
    assert st.verified is not None
    declared = st.verified.predicate.get("rules_version")
    version = st.task.forced_rules or declared
    known = known_rules_versions()
    if version not in known:
        st.problem("rules_version", bundle.SIGNATURE_FILE, "one of " + ", ".join(known), repr(version))
        raise Stop
    st.passed("rules_version")
    st.rules = load_rules(str(version))


def stage_schema(st: State) -> None:
    assert st.folder is not None and st.rules is not None
    version = st.rules.version
    bad = False
    for name, schema in DOCUMENTS:
        try:
            data = loading.read_capped(st.folder / name, loading.CAPS[name])
            doc = loading.parse_yaml(data) if name.endswith(".yaml") else loading.parse_json(data)
        except ParseError as exc:
            st.problem("schema", name, "strict JSON/YAML within the checker's limits", str(exc))
            bad = True
            continue
        errors = sorted(itertools.islice(validator(schema, version).iter_errors(doc), MAX_SCHEMA_ERRORS),
                        key=_err_key)
        _schema_problems(st, name, schema, [schema_message(e) for e in errors])
        bad = bad or bool(errors)
        st.docs[name] = doc
    bad = _records(st, version) or bad
    if bad:
        _structural_anyway(st)
        raise Stop
    st.passed("schema")


def _schema_problems(st: State, name: str, schema: str, messages: Sequence[str]) -> None:
    for msg in messages[:MAX_SCHEMA_PROBLEMS]:
        st.problem("schema", name, f"a document matching {schema}.schema.json", msg)
    if len(messages) > MAX_SCHEMA_PROBLEMS:
        st.problem("schema", name, f"a document matching {schema}.schema.json",
                   f"... and {len(messages) - MAX_SCHEMA_PROBLEMS} more schema errors")


def _records(st: State, version: str) -> bool:
    """Parse and validate records.jsonl line by line; True when anything was wrong."""
    assert st.folder is not None
    name = "records.jsonl"
    try:
        data = loading.read_capped(st.folder / name, loading.CAPS[name])
    except ParseError as exc:
        st.problem("schema", name, "JSON lines within the checker's limits", str(exc))
        return True
    v = validator("record", version)
    messages: list[str] = []
    try:
        for lineno, rec in loading.iter_jsonl(data):
            errs = list(v.iter_errors(rec)) if not v.is_valid(rec) else []
            if errs:
                messages += [f"line {lineno}: {schema_message(e)}" for e in sorted(errs, key=_err_key)]
                if len(messages) > MAX_SCHEMA_PROBLEMS:
                    break
                continue
            st.records.append(rec)
    except ParseError as exc:
        messages.append(str(exc))
    if not messages and not st.records:
        messages.append("no records")
    _schema_problems(st, name, "record", messages)
    return bool(messages)


_STRUCTURAL_KEYS = {"ranks", "scale", "checkpoint.num_writes", "checkpoint.num_reads"}


def _structural_anyway(st: State) -> None:
    """A config.yaml that fails its schema only at keys the structural rules own (ranks, scale,
    counts) is still judged by those rules, so the finding names the rule, not only the schema.
    The structural checks are type-guarded; the rest of the config is schema-valid."""
    config = st.docs.get("config.yaml")
    assert st.rules is not None
    if not isinstance(config, dict):
        return
    errors = list(itertools.islice(validator("config", st.rules.version).iter_errors(config),
                                   MAX_SCHEMA_ERRORS))
    paths = {".".join(map(str, e.absolute_path)) for e in errors}
    if not errors or not paths <= _STRUCTURAL_KEYS:
        return
    try:
        workload = workload_from_config(config["workload"])
    except (ConfigError, KeyError, TypeError):  # pragma: no cover - the workload is schema-valid
        return
    ctx = Context(config, workload, (), complete=True)
    ev = only(st.rules, structural_rule_ids(st.rules)).evaluate(ctx, ["config"])
    st.rule_findings = ev.findings


PREDICATE_KEYS = ("run_id", "workload", "division", "rules_version", "started", "ended", "mlckpt_version",
                  "ranks", "scaled", "verdict")


def stage_facts(st: State) -> None:
    assert st.verified is not None
    leaf, run, system = st.leaf, st.docs["run.json"], st.docs["system.json"]
    pred = st.verified.predicate
    for key in PREDICATE_KEYS:
        if key in pred and (key not in run or pred[key] != run[key] or type(pred[key]) is not type(run[key])):
            st.problem("predicate", "run.json", f"{key}={pred[key]!r} as signed in the statement",
                       f"{key}={run.get(key)!r}")
    st.passed("predicate")

    # Folder names against the run they hold.
    if run["workload"] != leaf.workload:
        st.problem("layout", "run.json", f"workload {leaf.workload!r} (the folder it sits in)",
                   f"workload {run['workload']!r}")
    if leaf.run_dir not in (run["name"], run["run_id"]):
        st.problem("layout", "run.json", f"run name or run_id {leaf.run_dir!r} (the folder name)",
                   f"name {run['name']!r}, run_id {run['run_id']!r}")
    desc = system.get("description")
    names = (("system.json", (desc or {}).get("system_name")), ("run.json", run.get("system_name")))
    for source, name in names:
        if name is not None and name != leaf.system:
            st.problem("layout", source, f"system_name {leaf.system!r} (the folder it sits in)",
                       f"system_name {name!r}")

    # The system description: the tree's systems/<system>.yaml, the bundle's copy, host facts.
    info = st.task.system
    if info.doc is None:
        st.problem("system_description", info.path, "a valid system description",
                   info.problem or "unusable", tree_path=info.path)
    elif desc is not None and desc != info.doc:
        diff = _first_difference(info.doc, desc)
        st.problem("system_description", "system.json",
                   f"the description in {info.path}", f"a different embedded description ({diff})")
    described = {h.get("hostname") for h in system["hosts"]}
    for h in run["hosts"]:
        if h["host"] not in described:
            st.problem("system_description", "system.json",
                       f"host facts for {h['host']!r} (a host of run.json)", "none")
    st.passed("layout", "system_description")


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or a[k] != b[k]:
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    return f"{path or '(top level)'}: {clean_text(repr(a), 80)} vs {clean_text(repr(b), 80)}"


def plan_files_estimate(w: Workload, ranks: int) -> int:
    per_rank = 2
    if w.parallelism.zero_stage in (1, 2) and w.parallelism.pipeline > 1:
        per_rank += -(-w.model.num_layers // w.parallelism.pipeline) + 3
    return ranks * per_rank + w.model.num_layers


def stage_rules(st: State) -> None:
    rs = st.rules
    assert rs is not None
    config, run, summary, system = (st.docs[n] for n in ("config.yaml", "run.json", "summary.json",
                                                         "system.json"))
    try:
        workload = workload_from_config(config["workload"])
    except ConfigError as exc:  # pragma: no cover - the schema makes this unreachable
        st.problem("schema", "config.yaml", "a valid workload", str(exc))
        raise Stop from None
    ranks = config["ranks"]

    # Hosts: run.json's placement, with the memory each host measured (system.json).
    placed = sorted(r for h in run["hosts"] for r in h["ranks"])
    hosts: tuple[HostSpec, ...] | None = None
    placement_ok = len(placed) == ranks and placed == list(range(ranks))
    if placement_ok:  # else RESULT-CONSISTENT reports it; host rules are not checked
        mem: dict[str, int | None] = {}
        for h in system["hosts"]:
            mem.setdefault(h["hostname"], h.get("memory_available_bytes"))
        fast_fs = (run.get("pipeline") or {}).get("fast_fs") or {}  # a tmpfs fast tier takes memory
        hosts = tuple(HostSpec(h["host"], tuple(h["ranks"]), mem.get(h["host"]),
                               fast_fs=fast_fs.get(h["host"])) for h in run["hosts"])
    else:
        st.not_checked.append(("HOST-MEMORY", "run.json does not place every rank exactly once"))

    # The plan, unless a structural rule fails (then there is none) or it is beyond our bounds.
    overrides = tuple(run["overrides"])
    ctx = Context(config, workload, overrides, None, hosts, True)
    plan: Plan | None = None
    if not placement_ok:
        # No plan either: config.yaml's rank count is not the run's (and could be anything up to
        # the schema's 10 M); the plan-dependent rules are not checked.
        st.not_checked.append(("BYTES-PLAN", "run.json does not place every rank exactly once"))
    elif not only(rs, structural_rule_ids(rs)).evaluate(ctx, ["config"]).findings:
        est = plan_files_estimate(workload, ranks)
        if est > MAX_PLAN_FILES:
            st.problem("schema", "config.yaml", f"a plan of at most {MAX_PLAN_FILES} files (checker limit)",
                       f"about {est} files ({ranks} ranks, {workload.model.num_layers} layers)")
            raise Stop
        plan = make_plan(workload, ranks, float(config["scale"]))

    # The tree's description stands in for one the bundle does not embed (bandwidth bounds).
    if system.get("description") is None and st.task.system.doc is not None:
        system = {**system, "description": st.task.system.doc}
    data = RunData(run, config, summary, st.records, system)
    skip = []
    for r in rs.rules:  # host rules measured only by the runner's gates, recorded nowhere
        if r.check in NO_BUNDLE_DATA_CHECKS:
            skip.append(r.id)
            st.not_checked.append((r.id, "no data in a bundle (the runner's gate refused the run otherwise)"))
    if any(r["t1_ns"] <= r["t0_ns"] for r in st.records) or any(
            s["t1_ns"] <= s["t0_ns"] for r in st.records for s in r.get("stages", ())):
        # Recomputing metrics divides by durations; RESULT-TIMES and ASYNC-TIMELINE report them.
        skip.append("METRICS-RECOMPUTE")
        st.not_checked.append(("METRICS-RECOMPUTE", "records with non-positive durations (see RESULT-TIMES)"))
    stages = list(Pipeline.of(config).stages)
    if "METRICS-RECOMPUTE" not in skip and any(
            [s.get("tier") for s in r.get("stages", ())] != stages for r in st.records if r["op"] == "write"):
        # Per-stage metrics need the same stages on every rank; PIPELINE-DECLARED reports them.
        skip.append("METRICS-RECOMPUTE")
        st.not_checked.append(("METRICS-RECOMPUTE", "write records without the configured stages "
                               "(see PIPELINE-DECLARED)"))
    ctx = dataclasses.replace(ctx, plan=plan, run=data)
    ev = without(rs, skip).evaluate(ctx, ["config", "host", "result"])
    st.rule_findings = ev.findings
    st.not_checked += ev.not_checked

    division = str(config["division"])
    recomputed = verdict(ev.findings, division)
    # What stands between this bundle and the closed verdict.
    reasons = sorted({f.rule for f in ev.findings if f.severity == recomputed})
    if recomputed == "open" and division == "open":
        reasons.append("division=open")
    st.verdicts = Verdicts(st.leaf.division, recomputed, run["verdict"], tuple(reasons))
    st.where_paths["run.json"] = f"{st.leaf.path}/run.json"


def finish(st: State) -> BundleResult:
    leaf = st.leaf
    rs = st.rules or fallback_rules(st.task.forced_rules)
    if st.verified is not None and st.facts["duplicates"] is None:
        st.facts["duplicates"] = []  # judged across the tree afterwards (add_duplicates)
    facts = SubmissionFacts(
        **{k: (tuple(v) if v is not None else None) for k, v in st.facts.items()}, verdicts=st.verdicts)
    config = st.docs.get("config.yaml") if st.verdicts is not None else None
    division = str(config["division"]) if isinstance(config, dict) else leaf.division
    sub, sub_not_checked = submission_findings(rs, facts, division)
    findings = [finding_dict(f, leaf.path, st.where_paths) for f in (*st.rule_findings, *sub)]
    run = st.docs.get("run.json") if isinstance(st.docs.get("run.json"), dict) else {}
    vb = st.verified
    result = BundleResult(leaf.path, leaf.org, leaf.system, leaf.workload, leaf.division,
                          run_id=str(vb.predicate.get("run_id")) if vb else None,
                          rules_version=rs.version if st.rules else None,
                          keyid=vb.keyid if vb else None,
                          statement_sha256=vb.statement_sha256 if vb else None,
                          declared_division=division)
    result.findings = findings
    result.integrity = ("failed" if any(f["rule"] in INTEGRITY_RULES for f in findings)
                        else "ok" if vb else "not checked")
    seen = set()
    for rule_id, reason in (*st.not_checked, *sub_not_checked):
        if (rule_id, reason) not in seen:
            seen.add((rule_id, reason))
            result.not_checked.append({"rule": rule_id, "reason": reason})
    result.verdict = verdict([_as_finding(f) for f in findings], division)
    summary = st.docs.get("summary.json")
    if st.facts["schema"] == [] and isinstance(summary, dict):  # schema-valid: safe to quote
        metrics = {k: summary[k] for k in METRIC_KEYS if k in summary}
        metrics.update({k: run[k] for k in ("ranks", "scale", "scaled") if k in run})
        result.metrics = jsonable(metrics)
    return result


# The steps, in order (``PIPELINE`` is read when each bundle is checked).
PIPELINE: tuple[tuple[str, Callable[[State], None]], ...] = (
    ("layout", stage_layout), ("integrity", stage_integrity), ("rules version", stage_rules_version),
    ("schema", stage_schema), ("facts", stage_facts), ("rules", stage_rules))
