"""Timing bounds that follow the machine (rules 1.8).  Pure.

Rules 1.2-1.7 bound a host's barrier skew and the gap between an op and its counters by constants
(``evidence:`` in rules.yaml) fitted on one quiet 2-core machine.  From 1.8 on (``timing:``), each
host's bound is ``margin`` × the largest sample of its own calibration (run.json ``calibration``,
recorded by mlckpt/run/phases/calibrate.py before the first op, with all its ranks running), between a
floor and ``cap_s``.  Rule sets without ``timing:`` keep their constants.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mlckpt.rules.engine import Outcome, RuleSet
from mlckpt.rules.rundata import RunData

KINDS = ("skew_ns", "head_ns", "tail_ns")
FLOORS = {"skew_ns": "skew_floor_s", "head_ns": "head_floor_s", "tail_ns": "tail_floor_s"}


def _timing(ruleset: RuleSet) -> Mapping[str, Any] | None:
    return ruleset.data.get("timing")


def _calibration(data: RunData, host: str) -> Mapping[str, Any] | None:
    return _host_calibration(data.run, host)


def _host_calibration(run: Mapping[str, Any], host: str) -> Mapping[str, Any] | None:
    for h in (run.get("calibration") or {}).get("hosts", ()):
        if isinstance(h, Mapping) and h.get("host") == host:
            return h
    return None


def start_allowance_s(ruleset: RuleSet, run: Mapping[str, Any]) -> float:
    """Under ``timing:``, how long after an op's start its ranks may begin on the busiest host: its
    calibrated head and skew bounds (0 without ``timing:``).  What another clock (a witness) sees
    of an op includes that wait."""
    if _timing(ruleset) is None:
        return 0.0
    d = RunData(run, {}, {}, [])
    cal = (run.get("calibration") or {}).get("hosts", ())
    hosts = [str(h.get("host")) for h in cal if isinstance(h, Mapping)]
    floor = _timing(ruleset).get("witness_floor_s")  # type: ignore[union-attr]  # rules 1.9: its own floor
    wf = None if floor is None else float(floor)
    return max((abs_bound_ns(ruleset, d, h, "skew_ns", 0, wf) + abs_bound_ns(ruleset, d, h, "head_ns", 0, wf)
                for h in hosts), default=0.0) / 1e9


def abs_bound_ns(ruleset: RuleSet, data: RunData, host: str, kind: str, constant_s: float,
                 floor_s: float | None = None) -> float:
    """The absolute part of a host's bound of ``kind`` (``skew_ns``, ``head_ns``, ``tail_ns``), in
    ns: the rule set's constant without ``timing:``; else ``margin`` × the host's largest sample,
    between the floor and ``cap_s`` (the floor alone for a host that has no samples: the rule
    that needs them says so, see :func:`calibration_outcomes`)."""
    t = _timing(ruleset)
    if t is None:
        return constant_s * 1e9
    cal = _calibration(data, host)
    samples = [int(x) for x in (cal or {}).get(kind, ())]
    measured = float(t["margin"]) * max(samples) if samples else 0.0
    floor = float(t[FLOORS[kind]]) if floor_s is None else floor_s
    return min(float(t["cap_s"]) * 1e9, max(floor * 1e9, measured))


def calibration_outcomes(ruleset: RuleSet, data: RunData, hosts: list[str],
                         kinds: tuple[str, ...]) -> Iterator[Outcome]:
    """Under ``timing:``, every host of the records has a calibration of at least ``min_rounds``
    samples of each kind the rule uses (a bundle that drops them would be judged by the floors,
    which only tightens its bounds, but a missing measurement is still a defect to name)."""
    t = _timing(ruleset)
    if t is None:
        return
    need = int(t["min_rounds"])
    for host in hosts:
        cal = _calibration(data, host)
        short = [k for k in kinds if len((cal or {}).get(k, ())) < need]
        if short:
            got = "no calibration" if cal is None else ", ".join(f"{len(cal.get(k, ()))} {k}" for k in short)
            yield Outcome(False, f"a timing calibration of at least {need} rounds", got, where=f"host {host}")
