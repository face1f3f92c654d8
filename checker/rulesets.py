"""Rule sets as the checker uses them (by version, restricted to some rules), system descriptions
parsed once, and findings as report entries."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, cast

from checker.results import SystemInfo, clean_text, jsonable
from checker.tree import SystemFile
from mlckpt import strict as loading
from mlckpt.rules import (
    DEFAULT_RULES_VERSION,
    Context,
    Finding,
    RuleSet,
    SubmissionFacts,
    known_versions,
    load_rules,
)
from mlckpt.schemas import describe, dotted
from mlckpt.schemas import errors as schema_errors
from mlckpt.strict import ParseError
from mlckpt.workload.model import Workload

MAX_SCHEMA_ERRORS = 1000  # collected per document (then sorted by path): bounds the work


@cache
def known_rules_versions() -> tuple[str, ...]:
    return tuple(known_versions())


def fallback_rules(forced: str | None = None) -> RuleSet:
    """The rule set that words findings made before a bundle's own version is known."""
    if forced:
        return load_rules(forced)
    known = known_rules_versions()
    return load_rules(DEFAULT_RULES_VERSION if DEFAULT_RULES_VERSION in known else known[-1])


def without(ruleset: RuleSet, rule_ids: Iterable[str]) -> RuleSet:
    drop = set(rule_ids)
    return dataclasses.replace(ruleset, rules=tuple(r for r in ruleset.rules if r.id not in drop))


def only(ruleset: RuleSet, keep: Iterable[str]) -> RuleSet:
    ids = set(keep)
    return dataclasses.replace(ruleset, rules=tuple(r for r in ruleset.rules if r.id in ids))


def structural_rule_ids(ruleset: RuleSet) -> tuple[str, ...]:
    """Rules without which no plan exists (as RuleSet.require_structure defines them)."""
    return tuple(r.id for r in ruleset.rules if r.severity == "invalid" and r.stages == ("config",))


def submission_findings(ruleset: RuleSet, facts: SubmissionFacts, division: str) -> tuple[
        tuple[Finding, ...], tuple[tuple[str, str], ...]]:
    ctx = Context(config={"division": division}, workload=cast(Workload, None), submission=facts)
    ev = ruleset.evaluate(ctx, ["submission"])
    return ev.findings, ev.not_checked


def load_system_file(root: Path, sf: SystemFile | None, path: str, rules_version: str) -> SystemInfo:
    if sf is None:
        return SystemInfo(path, None, "missing")
    try:
        doc = loading.parse_yaml(loading.read_capped(root / sf.path, loading.CAPS["system-description"]))
    except ParseError as exc:
        return SystemInfo(sf.path, None, str(exc))
    errors = sorted(itertools.islice(schema_errors(doc, "system-description", rules_version),
                                     MAX_SCHEMA_ERRORS), key=error_key)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return SystemInfo(sf.path, None, f"{schema_message(errors[0])}{more}")
    if doc.get("system_name") != sf.system:
        return SystemInfo(sf.path, None, f"system_name {doc.get('system_name')!r} differs from the "
                                         f"file name {sf.system!r}")
    return SystemInfo(sf.path, doc, None)


def schema_message(err: Any) -> str:
    """mlckpt.schemas.describe(err) with a long offending value shortened ("[0, 0, ...] is too long")."""
    if err.validator == "additionalProperties":
        return clean_text(describe(err), 300)
    msg = err.message
    shown = repr(err.instance)
    if len(shown) > 60 and msg.startswith(shown):
        msg = f"{shown[:40]}...{shown[-10:]}{msg[len(shown):]}"
    return clean_text(f"{dotted(err)}: {msg}", 300)


def error_key(err: Any) -> tuple[str, str]:
    return (".".join(map(str, err.absolute_path)), err.message)


def as_finding(d: Mapping[str, Any]) -> Finding:
    return Finding(d["rule"], d["severity"], d["message"])


def finding_dict(f: Finding, bundle_path: str, where_paths: Mapping[str, str]) -> dict[str, object]:
    """A finding as the report lists it, under the path of the place it concerns (``where_paths``:
    a place's path in the tree) or else the bundle's."""
    path = where_paths.get(f.where, bundle_path) if f.where else bundle_path
    return {"rule": f.rule, "severity": f.severity, "path": clean_text(path, 1000),
            "message": clean_text(f.message), "expected": jsonable(f.expected),
            "actual": jsonable(f.actual)}

