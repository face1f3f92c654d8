"""What one bundle's check takes and gives (picklable: they cross the process pool), and the safe
display of untrusted text."""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
import unicodedata
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from checker import MAX_RECORDS
from checker.tree import Leaf
from mlckpt import bundle

INTERNAL = "INTERNAL"


@dataclass(frozen=True)
class SystemInfo:
    """``systems/<system>.yaml`` as the parent process found it."""

    path: str  # relative to the tree root
    doc: Mapping[str, object] | None  # parsed and schema-valid, else None
    problem: str | None  # why it is unusable ("missing", a parse or schema error)


@dataclass(frozen=True)
class Task:
    root: str
    leaf: Leaf
    trusted: bundle.TrustedKeys
    forced_rules: str | None
    system: SystemInfo
    released: frozenset[str] | None = None  # runner code digests the tree's released-runners.yaml lists
    witnesses: bundle.TrustedKeys | None = None  # --trusted-witnesses (None: witnesses not judged)
    budget_s: float = 60.0  # --bundle-budget: the most one bundle's check may take
    max_records: int = MAX_RECORDS  # --max-records: the most records of one bundle it holds
    rule_workers: int = 1  # processes its rules may use (the jobs a smaller tree leaves to each bundle)


@dataclass
class BundleResult:
    path: str
    org: str
    system: str
    workload: str
    division: str
    run_id: str | None = None
    rules_version: str | None = None
    verdict: str = "invalid"
    integrity: str = "not checked"  # ok | failed | not checked
    findings: list[dict[str, object]] = field(default_factory=list)
    not_checked: list[dict[str, str]] = field(default_factory=list)
    metrics: dict[str, object] | None = None
    keyid: str | None = None
    statement_sha256: str | None = None
    declared_division: str | None = None
    fingerprints: tuple[str, ...] = ()  # of the measurements (DUPLICATE-CONTENT); not reported
    invocation: dict[str, Any] | None = None  # what SPLIT-PAIR needs (checker.split.split_doc); not reported
    witness: dict[str, object] | None = None  # a run that says it was witnessed (checker.witness_check)

    @property
    def valid(self) -> bool:
        return self.verdict in ("closed", "open")

    def to_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d.pop("declared_division")
        d.pop("fingerprints")
        d.pop("invocation")
        return d


def clean_text(text: str, limit: int = 2000) -> str:
    """One printable line: control characters and unpaired surrogates escaped, length capped."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _escape(c: str) -> str:
    if unicodedata.category(c) == "Cs":
        return c  # handled by the encode step
    return c.encode("unicode_escape").decode("ascii")


def jsonable(value: object, depth: int = 0) -> Any:
    """``value`` as plain, finite, bounded JSON data."""
    if value is None or isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, str):
        return clean_text(value, 500)
    if depth > 3:
        return clean_text(str(value), 200)
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value[:20]]
    if isinstance(value, Mapping):
        return {clean_text(str(k), 100): jsonable(v, depth + 1) for k, v in list(value.items())[:20]}
    return clean_text(str(value), 500)


@contextmanager
def confined(result: BundleResult, stage: str) -> Iterator[None]:
    """A tree-level stage's work on one bundle: a fault there (a defect of the checker) becomes
    that bundle's INTERNAL finding; the other bundles are still judged and the report written."""
    try:
        yield
    except Exception as exc:  # any defect, confined to this bundle
        result.verdict = "internal-error"
        result.findings.append(fault_finding(result.path, stage, exc))


def fault_finding(path: str, stage: str, exc: BaseException) -> dict[str, Any]:
    """A checker fault as the INTERNAL finding of the bundle it met."""
    if os.environ.get("MLCKPT_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
    message = (f"checker fault in stage {stage}: {type(exc).__name__}: {clean_text(str(exc), 300)} "
               "(a defect of mlckpt-check, not of this submission; MLCKPT_DEBUG=1 shows the traceback)")
    return {"rule": INTERNAL, "severity": "internal", "path": path, "message": message,
            "expected": None, "actual": None}
