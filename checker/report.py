"""Findings → the JSON report, the human report and the exit status.

JSON report (``report_format`` 6, schema ``rules/<version>/schemas/report.schema.json``)::

    {"report_format": 6, "checker": {...}, "root": "...",
     "verdict": "valid" | "disturbed" | "invalid" | "integrity-failure" | "internal-error",
     "exit_status": 0 | 6 | 1 | 3 | 4, "rules_versions": ["1.0"],
     "bundles": [{"path", "org", "system", "workload", "division", "run_id", "rules_version",
                  "verdict": "closed" | "open" | "disturbed" | "invalid" | "internal-error",
                  "integrity": "ok" | "failed" | "not checked",
                  "findings": [...], "not_checked": [{"rule", "reason"}], "metrics": {...} | null,
                  "keyid", "statement_sha256"}],
     "tree_findings": [...],        # findings about the tree itself (misplaced entries, ...)
     "findings": [...],             # every finding, each with its path
     "summary": {"bundles", "valid", "disturbed", "invalid", "integrity_failures", "internal_errors",
                 "findings", "by_rule": {...}, "by_verdict": {...}}}

A finding is ``{"rule", "severity", "path", "message", "expected", "actual"}``; ``severity`` is a
rule's (``invalid``, ``disturbed``, ``open``, ``warning``) or ``internal`` for a checker fault.

Exit status, most serious first: 4 if any bundle met a checker fault (its result is
unknown); 3 if any bundle failed integrity (signature, key, files, paths); 1 if any bundle is
invalid or the tree breaks a rule; 6 if any bundle is disturbed (rules 1.8: other processes on its
host spoilt the measurement: no result, and no fault of the storage or the submitter); 0 when
every bundle is valid (closed or open).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from checker.results import INTERNAL, BundleResult
from checker.split import LONE_WRITE
from mlckpt import __version__, formats
from mlckpt.attribution import foreign_note
from mlckpt.errors import ExitStatus
from mlckpt.rules import version_order

REPORT_FORMAT = formats.REPORT.version
REPORT_SCHEMA = "1.13"  # the rules folder whose schemas/report.schema.json defines REPORT_FORMAT
VERDICT_OF_EXIT = {ExitStatus.OK: "valid", ExitStatus.FAILED: "invalid",
                   ExitStatus.INTEGRITY: "integrity-failure", ExitStatus.INTERNAL: "internal-error",
                   ExitStatus.DISTURBED: "disturbed"}


def exit_status(bundles: Sequence[BundleResult], tree_findings: Sequence[dict[str, object]]) -> ExitStatus:
    findings = [f for b in bundles for f in b.findings]
    if any(f["rule"] == INTERNAL for f in findings) or any(b.verdict == "internal-error" for b in bundles):
        return ExitStatus.INTERNAL
    if any(b.integrity == "failed" for b in bundles):
        return ExitStatus.INTEGRITY
    if any(not b.valid and b.verdict != "disturbed" for b in bundles) \
            or any(f["severity"] == "invalid" for f in tree_findings):
        return ExitStatus.FAILED
    if any(b.verdict == "disturbed" for b in bundles):
        return ExitStatus.DISTURBED
    return ExitStatus.OK


def build(root: str, bundles: Sequence[BundleResult],
          tree_findings: Sequence[dict[str, object]]) -> dict[str, object]:
    status = exit_status(bundles, tree_findings)
    everything = [*tree_findings, *(f for b in bundles for f in b.findings)]
    by_verdict = Counter(b.verdict for b in bundles)
    return {
        "report_format": REPORT_FORMAT,
        "checker": {"name": "mlckpt-check", "version": __version__},
        "root": root,
        "verdict": VERDICT_OF_EXIT[status],
        "exit_status": int(status),
        "rules_versions": sorted({b.rules_version for b in bundles if b.rules_version}, key=version_order),
        "bundles": [b.to_dict() for b in bundles],
        "tree_findings": list(tree_findings),
        "findings": everything,
        "summary": {
            "bundles": len(bundles),
            "valid": sum(b.valid for b in bundles),
            "disturbed": sum(b.verdict == "disturbed" for b in bundles),
            "invalid": sum(b.verdict == "invalid" for b in bundles),
            "integrity_failures": sum(b.integrity == "failed" for b in bundles),
            "internal_errors": by_verdict.get("internal-error", 0),
            "findings": len(everything),
            "by_rule": dict(sorted(Counter(f["rule"] for f in everything).items())),
            "by_verdict": dict(sorted(by_verdict.items())),
        },
    }


def _line(f: dict[str, object]) -> str:
    return f"  {f['rule']} [{f['severity']}] {f['message']}"


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _metrics(b: dict[str, Any]) -> str:
    """``: write X GiB/s, read Y GiB/s`` and, when training did not wait for the durable write
    (async or tiered checkpoints), the mean stall and time to durable.  A sync one-tier write
    ends when it is durable, so its stall *is* its time to durable (records format 2: ``staged_ns
    == t1_ns``); the two differ exactly when part of the write ran in the background."""
    m = b.get("metrics") or {}
    parts = []
    for op in ("write", "read"):
        v = m.get(f"{op}_bandwidth_mean_gib_s")
        if _num(v):
            parts.append(f"{op} {v:.2f} GiB/s")
    stall, durable = m.get("write_stall_mean_s"), m.get("write_time_to_durable_mean_s")
    if _num(stall) and _num(durable) and stall != durable:
        parts.append(f"stall {stall:.3f} s, time to durable {durable:.3f} s")
    foreign = foreign_note(m.get("foreign"))
    if foreign:
        parts.append(foreign)
    ref = (m.get("framework") or {}).get("reference") or {}
    ratios = [f"{op} {ref[f'{op}_ratio']:.2f}×" for op in ("write", "read") if _num(ref.get(f"{op}_ratio"))]
    if ratios:  # rules 1.11: the library's figures against the engine's of the same run
        parts.append(f"{m['framework']['writer']}: {', '.join(ratios)} the engine's")
    return f": {', '.join(parts)}" if parts else ""


def unbounded_note(short: list[dict[str, Any]]) -> str:
    """What the witness cannot bound closely: ops too short beside the time it leaves untimed."""
    ops = ", ".join(f"{o['op']} {o['index']} ({o['duration_s']:.3f} s, ±{o['unbounded_s'] * 1e3:.0f} ms)"
                    for o in short[:4]) + (f" and {len(short) - 4} more" if len(short) > 4 else "")
    return (f"the witness bounds {len(short)} op{'s' if len(short) != 1 else ''} only loosely, too short "
            f"beside what it cannot time: {ops}; longer ops (more bytes per rank) are bounded closer")


def render_text(report: dict[str, Any], *, quiet: bool = False) -> str:
    """PASS/FAIL/ERROR per bundle with its findings indented, then the tree's, then one summary."""
    out: list[str] = []
    for b in report["bundles"]:
        if b["verdict"] == "internal-error":
            head = f"ERROR {b['path']} (checker fault)"
        elif b["verdict"] in ("closed", "open"):
            if quiet and not b["findings"]:
                continue
            head = f"PASS {b['path']} ({b['verdict']}{_metrics(b)})"
            if (b.get("metrics") or {}).get("unpaired_write_half"):
                head += f"\n    note: {LONE_WRITE}"
        elif b["verdict"] == "disturbed":
            head = (f"DISTURBED {b['path']} (no result: its host was too busy to measure the storage "
                    "alone, as the findings show; not a fault of the storage: re-run on a quiet host)")
        else:
            head = f"FAIL {b['path']}"
        out.append(head)
        out += [_line(f) for f in b["findings"]]
        short = (b.get("witness") or {}).get("unbounded") or []
        if short and b["verdict"] in ("closed", "open"):
            out.append("    note: " + unbounded_note(short))
    if report["tree_findings"]:
        out.append("TREE (outside any bundle)")
        out += [_line(f) for f in report["tree_findings"]]
    s = report["summary"]
    n = s["bundles"]
    text = f"checked {n} bundle{'s' if n != 1 else ''}: {s['valid']} valid, {s['invalid']} invalid"
    if s.get("disturbed"):
        text += f", {s['disturbed']} disturbed"
    if s["internal_errors"]:
        text += f", {s['internal_errors']} checker fault{'s' if s['internal_errors'] != 1 else ''}"
    extras = [f"{s['findings']} finding{'s' if s['findings'] != 1 else ''}"]
    if s["integrity_failures"]:
        extras.append(f"{s['integrity_failures']} failed integrity")
    if report["tree_findings"]:
        extras.append(f"{len(report['tree_findings'])} outside bundles")
    out.append(f"{text} ({', '.join(extras)})")
    return "\n".join(out) + "\n"
