"""Effects: the tree checked in-process, then every passing bundle read again from the very bytes
the checker verified."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checker import MAX_RECORDS
from checker.leaderboard.model import DIVISIONS, Entry, Excluded, entry_from_docs
from checker.leaderboard.split import join_splits
from checker.leaderboard.tables import Leaderboard, build
from mlckpt.errors import MlckptError, UsageError

if TYPE_CHECKING:
    from mlckpt import bundle

READ_FILES = ("run.json", "config.yaml", "summary.json", "system.json")


@dataclass(frozen=True)
class BundleDocs:
    run: dict[str, Any]
    config: dict[str, Any]
    summary: dict[str, Any]
    system: dict[str, Any]
    statement_sha256: str
    keyid: str
    org: str | None
    witness: dict[str, object] | None = None  # checker.witness_check.compare_side (compare shows it)
    goodput: float = math.nan  # at the rules version's reference job (rules 1.18 on), from the records


def is_archive(path: Path) -> bool:
    return path.name.endswith(".tar.gz")


def read_bundle(path: Path, trusted: bundle.TrustedKeys | None = None,
                witnesses: bundle.TrustedKeys | None = None, *, witness: bool = False) -> BundleDocs:
    """Verify the bundle at ``path`` (folder or .tar.gz) and parse the files the tables use, each
    checked against its signed digest, strictly (:mod:`mlckpt.strict`) and against its JSON
    Schema.  Raises BundleIntegrityError (exit 3) or UsageError (not a bundle, malformed)."""
    from checker.rulesets import known_rules_versions
    from checker.witness_check import compare_side
    from mlckpt import bundle
    from mlckpt import strict as loading
    from mlckpt.schemas import first_error

    with bundle.open_bundle(path) as folder:
        if not os.path.lexists(folder / bundle.SIGNATURE_FILE):
            raise UsageError(f"{path}: not a bundle (no {bundle.SIGNATURE_FILE})")
        vb = bundle.verify_bundle(folder, trusted)
        docs: dict[str, Any] = {}
        for name in READ_FILES:
            try:
                doc = bundle.parse_document(name, bundle.read_document(folder, name, vb))
            except loading.ParseError as exc:
                raise UsageError(f"{path}: {name}: {exc}") from None
            if not isinstance(doc, dict):
                raise UsageError(f"{path}: {name}: not an object")
            docs[name] = doc
        version = docs["run.json"].get("rules_version")
        if version not in known_rules_versions():
            raise UsageError(f"{path}: run.json: unknown rules version {version!r}")
        for name, schema in zip(READ_FILES, ("run", "config", "summary", "system"), strict=True):
            problem = first_error(docs[name], schema, str(version))
            if problem:
                raise UsageError(f"{path}: {name}: {problem}")
        records = _records(folder, vb, str(version), path)
        # compare's view of the witness; the leaderboard has the checker's report instead
        seen = compare_side(folder, vb, docs["run.json"], records, witnesses) if witness else None
    summary = _recomputed(path, docs, records, str(version))
    return BundleDocs(docs["run.json"], docs["config.yaml"], summary, docs["system.json"],
                      vb.statement_sha256, vb.keyid, vb.org, seen, _goodput(docs, records, str(version)))


def _goodput(docs: dict[str, Any], records: list[dict[str, Any]], version: str) -> float:
    """A checkpoint result's goodput at its rules version's reference job (nan: none declared, a
    serving run, or no durable-tier restore to count)."""
    from mlckpt.plan.goodput import at_reference
    from mlckpt.rules import load_rules
    from mlckpt.workload.resume_run import ResumeRun
    from mlckpt.workload.serving_run import ServingRun

    config = docs["config.yaml"]
    if ServingRun.of(config) is not None or ResumeRun.of(config) is not None:
        return math.nan
    g = at_reference(records, config, docs["run.json"].get("framework"),
                     load_rules(version).data.get("goodput"))
    return g.goodput if g is not None else math.nan


def _records(folder: Path, vb: bundle.VerifiedBundle, version: str, path: Path) -> list[dict[str, Any]]:
    """records.jsonl, strictly, every line against the record schema."""
    from mlckpt import bundle
    from mlckpt import strict as loading
    from mlckpt.schemas import first_error

    out = []
    try:
        for lineno, rec in loading.iter_jsonl(bundle.read_document(folder, "records.jsonl", vb)):
            problem = first_error(rec, "record", version)
            if problem:
                raise UsageError(f"{path}: records.jsonl line {lineno}: {problem}")
            out.append(rec)
    except loading.ParseError as exc:
        raise UsageError(f"{path}: records.jsonl: {exc}") from None
    return out


def _recomputed(path: Path, docs: dict[str, Any], records: list[dict[str, Any]],
                version: str) -> dict[str, object]:
    """The summary the records and the plan of the bundle's own workload and scale give: what the
    tables and ``compare`` show, never what summary.json claims."""
    from checker.bundle_rules import MAX_PLAN_FILES, plan_files_estimate
    from mlckpt.rules import RunData, load_rules, recomputed_summary, resume_recomputed, serving_recomputed
    from mlckpt.workload.layout import make_plan
    from mlckpt.workload.model import workload_from_config
    from mlckpt.workload.resume_run import ResumeRun
    from mlckpt.workload.serving_run import ServingRun

    config = docs["config.yaml"]
    try:
        serving, resume = ServingRun.of(config), ResumeRun.of(config)
        if serving is not None or resume is not None:
            data = RunData(docs["run.json"], config, {}, records, docs["system.json"])
            doc = (serving_recomputed(load_rules(version), data, serving) if serving is not None else
                   resume_recomputed(load_rules(version), data, resume) if resume is not None else None)
            if doc is None:
                raise ValueError("records with non-positive durations")
            return doc
        workload = workload_from_config(config["workload"])
        if plan_files_estimate(workload, int(config["ranks"])) > MAX_PLAN_FILES:
            raise ValueError(f"a plan of more than {MAX_PLAN_FILES} files")
        plan = make_plan(workload, int(config["ranks"]), float(config["scale"]))
        return recomputed_summary(load_rules(version), RunData(docs["run.json"], config, {}, records,
                                                               docs["system.json"]), plan)
    except (MlckptError, KeyError, TypeError, ValueError, ZeroDivisionError, ArithmeticError) as exc:
        raise UsageError(f"{path}: cannot recompute the summary from records.jsonl: {exc}") from None


def collect(root: Path, trusted: bundle.TrustedKeys, *, jobs: int = 1,
            witnesses: bundle.TrustedKeys | None = None,
            witnessed_only: bool = False, published: Sequence[Entry] = (), budget_s: float = 60.0,
            max_records: int = MAX_RECORDS) -> Leaderboard:
    """Check the tree in-process and build the leaderboard from the bundles that pass (only those
    a trusted witness witnessed, with ``witnessed_only``), with ``published`` results (unverified
    entries, :func:`checker.imported.published_entries`) beside them."""
    from checker.tree_check import check_tree

    report = check_tree(root, trusted, jobs=jobs, witnesses=witnesses, budget_s=budget_s,
                        max_records=max_records)
    entries: list[Entry] = []
    excluded: list[Excluded] = []
    versions: set[str] = set()
    for b in report["bundles"]:
        if b["verdict"] not in DIVISIONS:
            rules = sorted({f["rule"] for f in b["findings"] if f["severity"] in ("invalid", "internal")})
            if b.get("integrity") == "failed":
                trust = _integrity_rules(b.get("rules_version"))
                rules = sorted({f["rule"] for f in b["findings"]} & trust) or rules
            excluded.append(Excluded(b["path"], b["verdict"], tuple(rules)))
            continue
        try:
            docs = read_bundle(Path(root) / b["path"], trusted)
            if docs.statement_sha256 != b.get("statement_sha256"):
                raise UsageError("the bundle changed after the checker passed it")
            entry = entry_from_docs(b["path"], b["org"], b["system"], docs.run, docs.config,
                                    docs.summary, docs.system, division=b["division"], goodput=docs.goodput)
        except (MlckptError, KeyError, TypeError, ValueError) as exc:
            excluded.append(Excluded(b["path"], "unreadable", (), str(exc).splitlines()[0][:200]))
            continue
        w = b.get("witness") or {}
        if w.get("counted"):
            entry = replace(entry, witnessed_by=str(w["by"]), witnessed_gib_s=(
                float(w.get("write_bandwidth_witnessed_mean_gib_s", math.nan)),
                float(w.get("read_bandwidth_witnessed_mean_gib_s", math.nan))))
        elif witnessed_only:
            excluded.append(Excluded(b["path"], "not witnessed", (),
                                     "--witnessed-only: no trusted witness counted it"))
            continue
        entries.append(entry)
        versions.add(entry.rules_version)
    entries, lone = join_splits(entries)  # split invocations: one row per split result
    return build([*entries, *published], [*excluded, *lone], versions)


def _integrity_rules(version: str | None) -> frozenset[str]:
    """The rules of the bundle's own rule set whose failure means its bytes cannot be trusted."""
    from checker.rulesets import fallback_rules
    from mlckpt.rules import load_rules

    return (load_rules(version) if version else fallback_rules()).integrity_rules


