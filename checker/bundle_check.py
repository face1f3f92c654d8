"""The per-bundle pipeline.  Each stage records facts; a stage that makes later ones meaningless
stops the pipeline; at the end the rules judge the facts.

1. layout     the leaf is a folder or a packed bundle (unpacked with ``bundle.safe_unpack``),
              the files every bundle has are present
2. integrity  ``bundle.verify_bundle`` against the trusted keys: signature, signer registered for
              the organisation the bundle sits under, file set, digests, paths.  Nothing is parsed
              before this passes.
3. version    the rules version the bundle declares (or ``--rules``) must be known
4. schema     strict, bounded parsing (:mod:`mlckpt.strict`) and JSON Schema of every file
5. facts      signed predicate vs run.json, folder names vs the run, system description
6. rules      the runner's own rules module: config, host and result stages on a Context built
              from the bundle (recomputation and plausibility are result-stage rules), then the
              recomputed verdict against the recorded one and the division folder
   witness    (rules 1.4) the witness's transcript opened: its signature, its schema, whether
              its key is a trusted witness's (checker/witness_check.py)
7. submission the ``submission`` stage rules over the collected facts (mlckpt/rules/checks/submission.py)

Any unexpected exception is a checker fault: an ``INTERNAL`` finding for that bundle only.
Hostile input never gets there: every parse and schema problem is a finding.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from checker import records_read
from checker.bundle_rules import finish, stage_facts, stage_rules
from checker.bundle_state import State, Stop
from checker.results import BundleResult, Task, fault_finding
from checker.rulesets import (
    MAX_SCHEMA_ERRORS,
    error_key,
    known_rules_versions,
    only,
    schema_message,
    structural_rule_ids,
)
from checker.tree import Leaf
from checker.witness_check import stage_witness
from mlckpt import bundle
from mlckpt import strict as loading
from mlckpt.errors import BundleIntegrityError, ConfigError, IntegrityKind, MlckptError
from mlckpt.rules import (
    Context,
    load_rules,
)
from mlckpt.rules.engine import run_kind
from mlckpt.schemas import errors as schema_errors
from mlckpt.strict import ParseError
from mlckpt.workload.model import workload_from_config

REQUIRED_FILES = ("run.json", "config.yaml", "records.jsonl", "summary.json", "system.json",
                  bundle.SIGNATURE_FILE)




MAX_SCHEMA_PROBLEMS = records_read.MAX_MESSAGES  # reported per file


EXPECTED = {
    "signature": "a valid Ed25519 signature over the bundle's statement",
    "key": "a signing key registered for this organisation",
    "files": "exactly the files the statement signs, with their digests",
    "paths": "relative paths to regular files only",
}


def check_bundle(task: Task) -> BundleResult:
    """Check one bundle; never raises (a fault of the checker becomes an INTERNAL finding)."""
    st = State(task)
    try:
        try:
            for name, step in PIPELINE:
                st.stage = name
                step(st)
                if st.over_budget():
                    break
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
    return BundleResult(leaf.path, leaf.org, leaf.system, leaf.workload, leaf.division,
                        verdict="internal-error", findings=[fault_finding(leaf.path, stage, exc)])


def stage_layout(state: State) -> None:
    """Locate the bundle folder (unpacking an archive into a temporary folder)."""
    leaf = state.leaf
    leaf_path = Path(state.task.root) / leaf.path
    if leaf.symlink:
        state.problem("paths", ".", "a bundle folder or .tar.gz", "a symlink (never followed)",
                   tree_path=leaf.path)
        raise Stop
    if leaf.archive:
        state.tmp = tempfile.mkdtemp(prefix="mlckpt-check-")
        dest = Path(state.tmp) / "bundle"
        try:
            bundle.safe_unpack(leaf_path, dest)  # the one set of archive limits (mlckpt.bundle)
        except BundleIntegrityError as exc:
            for p in exc.problems:
                path, msg = p
                kind = IntegrityKind.PATHS if p.kind == IntegrityKind.PATHS else IntegrityKind.FILES
                state.problem(kind, f"(archive) {path}" if path != "(archive)" else "(archive)",
                           EXPECTED[kind], msg, tree_path=leaf.path)
            raise Stop from None
        except MlckptError as exc:
            state.problem("files", "(archive)", "a readable .tar.gz", str(exc), tree_path=leaf.path)
            raise Stop from None
        state.folder = bundle.find_bundle_root(dest)
    else:
        state.folder = leaf_path
    missing = [name for name in REQUIRED_FILES if not os.path.lexists(state.folder / name)]
    for name in missing:
        state.problem("layout", name, f"the bundle files {', '.join(REQUIRED_FILES)}", "missing")
    if not missing:
        state.passed("layout")


def stage_integrity(state: State) -> None:
    leaf, trusted = state.leaf, state.task.trusted
    assert state.folder is not None
    try:
        # The organisation is compared below (not via org=) so that a key of another
        # organisation still gets the whole bundle verified and reported.
        vb = bundle.verify_bundle(state.folder, trusted)
    except BundleIntegrityError as exc:
        kinds = set()
        for p in exc.problems:
            path, msg, kind = p[0], p[1], p.kind  # typed where mlckpt.bundle raised it
            kinds.add(kind)
            state.problem(kind, path, EXPECTED[kind] if kind != "key" else
                       f"a signing key registered for {leaf.org!r}", msg)
        if not kinds & {"signature", "key"}:
            # The signature held (verify_bundle judges files only after it): who signed?
            state.passed("signature", "files", "paths")
            _check_signer_org(state, _signed_key(state.folder))
        raise Stop from None
    except MlckptError as exc:  # the folder vanished
        state.problem("files", ".", "a readable bundle folder", str(exc))
        raise Stop from None
    except OSError as exc:  # unreadable (permissions): say so, it is not a checker defect
        state.problem("files", ".", "a readable bundle folder", f"cannot read: {exc.strerror or exc}")
        raise Stop from None
    state.passed("signature", "files", "paths")
    if not _check_signer_org(state, (vb.keyid, vb.key_label)):
        raise Stop
    state.verified = vb
    if state.facts["layout"]:
        raise Stop  # a required file is missing (and unsigned): nothing to parse


def _signed_key(folder: Path) -> tuple[str, str] | None:
    """(keyid, label) of the key that signed a bundle whose signature held."""
    try:
        env = loading.parse_json(loading.read_capped(folder / bundle.SIGNATURE_FILE, 16 << 20))
        keyid = str(env["signatures"][0]["keyid"])
        label = f"ed25519:{env['signatures'][0]['public_key']} (fingerprint {keyid[:16]})"
        return keyid, label
    except (ParseError, KeyError, IndexError, TypeError):
        return None


def _check_signer_org(state: State, signed: tuple[str, str] | None) -> bool:
    """The signer's key must be registered for the organisation the bundle sits under."""
    leaf, trusted = state.leaf, state.task.trusted
    keyid, label = signed if signed else (None, None)
    signer = trusted.org_for(keyid) if keyid else None
    if keyid is not None and signer == leaf.org:
        state.passed("key")
        return True
    has_keys = bool(trusted.keys_for(leaf.org))
    state.problem("key", bundle.SIGNATURE_FILE, f"a signing key registered for {leaf.org!r}",
               f"key {label} registered for {signer!r}" +
               ("" if has_keys else f" ({leaf.org!r} has no registered keys)"))
    return False


def stage_rules_version(state: State) -> None:
    assert state.verified is not None
    declared = state.verified.predicate.get("rules_version")
    version = state.task.forced_rules or declared
    known = known_rules_versions()
    if version not in known:
        state.problem("rules_version", bundle.SIGNATURE_FILE, "one of " + ", ".join(known), repr(version))
        raise Stop
    state.passed("rules_version")
    state.rules = load_rules(str(version))


def stage_schema(state: State) -> None:
    assert state.folder is not None and state.rules is not None and state.verified is not None
    version = state.rules.version
    bad, failed = False, set()
    for name, schema in bundle.DOCUMENTS:
        try:
            doc = bundle.parse_document(name, bundle.read_document(state.folder, name, state.verified))
        except ParseError as exc:
            state.problem("schema", name, "strict JSON/YAML within the checker's limits", str(exc))
            bad = True
            failed.add(name)
            continue
        errors = sorted(itertools.islice(schema_errors(doc, schema, version), MAX_SCHEMA_ERRORS),
                        key=error_key)
        _schema_problems(state, name, schema, [schema_message(e) for e in errors])
        bad = bad or bool(errors)
        failed |= {name} if errors else set()
        state.docs[name] = doc
    bad = _records(state, version, "config.yaml" not in failed) or bad
    if bad:
        _structural_anyway(state)
        raise Stop
    state.passed("schema")


def _schema_problems(state: State, name: str, schema: str, messages: Sequence[str]) -> None:
    for msg in messages[:MAX_SCHEMA_PROBLEMS]:
        state.problem("schema", name, f"a document matching {schema}.schema.json", msg)
    if len(messages) > MAX_SCHEMA_PROBLEMS:
        state.problem("schema", name, f"a document matching {schema}.schema.json",
                   f"... and {len(messages) - MAX_SCHEMA_PROBLEMS} more schema errors")


def _records(state: State, version: str, config_valid: bool) -> bool:
    """Parse and validate records.jsonl line by line; True when anything was wrong. Whether the
    records are of config.yaml's kind of run is asked only of a schema-valid config.yaml: an
    invalid one (``serving.strategy: true``) is its own finding, not the records'."""
    assert state.folder is not None and state.verified is not None
    name = "records.jsonl"
    try:
        data = bundle.read_document(state.folder, name, state.verified)
    except ParseError as exc:
        state.problem("schema", name, "JSON lines within the checker's limits", str(exc))
        return True
    bound, basis = records_read.records_bound(state.docs.get("config.yaml"))
    lines = data.count(b"\n") + (not data.endswith(b"\n") and bool(data))
    if lines > state.task.max_records:  # the checker's own bound, whatever the configuration says
        state.problem("schema", name, f"at most {state.task.max_records:,} records (mlckpt-check "
                      "--max-records: the records of one bundle this checker holds in memory)",
                      f"{lines:,} lines")
        return True
    if lines > bound:  # refused before a line is parsed
        state.problem("schema", name, f"at most {bound:,} records ({basis}, plus 1,024: a bound on the "
                   "checker's work, not the count the rules hold the records to)", f"{lines:,} lines")
        return True
    got = records_read.read(data, version, state.over_budget, state.task.rule_workers)
    state.records = got.records
    if got.over_budget:
        state.over_budget()  # its finding, where the budget ran out in the other process
        return True
    messages = got.messages()
    if not messages and not state.records:
        messages.append("no records")
    if not messages and config_valid:
        messages = other_kind(state.records, state.docs.get("config.yaml"))
    _schema_problems(state, name, "record", messages)
    return bool(messages)


def other_kind(records: list[dict[str, object]], config: object) -> list[str]:
    """Records of another kind of run than config.yaml's (rules 1.13: a load in a checkpoint run,
    an op in a serving run; rules 1.21: a resume in another kind): the record schema takes each, and
    each kind's rules read only their own; one line for the first such record, as a schema problem."""
    if not isinstance(config, dict):
        return []  # the configuration's own schema problem says why
    kind = run_kind(config)
    own = {"serving": "load", "resume": "resume"}  # a checkpoint run's ops: write, read
    why = {"serving": "a serving strategy", "resume": "resume.from_ranks"}.get(kind, "no serving strategy "
                                                                                     "and no resume")
    for n, r in enumerate(records, 1):
        op = str(r["op"])
        if not (op == own[kind] if kind in own else op not in own.values()):
            return [f"record {n}: op {op!r} in a {kind} run (config.yaml gives {why})"]
    return []


_STRUCTURAL_KEYS = {"ranks", "scale", "checkpoint.num_writes", "checkpoint.num_reads"}


def _structural_anyway(state: State) -> None:
    """A config.yaml that fails its schema only at keys the structural rules own (ranks, scale,
    counts) is still judged by those rules, so the finding names the rule, not only the schema.
    The structural checks are type-guarded; the rest of the config is schema-valid."""
    config = state.docs.get("config.yaml")
    assert state.rules is not None
    if not isinstance(config, dict):
        return
    errors = list(itertools.islice(schema_errors(config, "config", state.rules.version), MAX_SCHEMA_ERRORS))
    paths = {".".join(map(str, e.absolute_path)) for e in errors}
    if not errors or not paths <= _STRUCTURAL_KEYS:
        return
    try:
        workload = workload_from_config(config["workload"])
    except (ConfigError, KeyError, TypeError):  # pragma: no cover - the workload is schema-valid
        return
    ctx = Context(config, workload, (), complete=True)
    ev = only(state.rules, structural_rule_ids(state.rules)).evaluate(ctx, ["config"])
    state.rule_findings = ev.findings


PIPELINE: tuple[tuple[str, Callable[[State], None]], ...] = (
    ("layout", stage_layout), ("integrity", stage_integrity), ("rules version", stage_rules_version),
    ("schema", stage_schema), ("facts", stage_facts), ("rules", stage_rules), ("witness", stage_witness))
