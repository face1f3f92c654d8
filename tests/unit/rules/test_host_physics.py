"""HOST-PHYSICS on records built here: no host moves checkpoint bytes, nor snapshots them into
memory, faster than its measured memory copy rate allows (rules 1.18: twice it; 1.2-1.17: three
times)."""

from __future__ import annotations

from typing import Any

import pytest

from mlckpt.plan.config import compose
from mlckpt.rules import RunData, load_rules
from mlckpt.rules.engine import Context, Outcome, RuleSet

GiB = 1 << 30
COPY_GIB_S = 10.0


def _failures(ruleset: RuleSet, snapshot_over_copy: float) -> list[Outcome]:
    """Two ranks of one host whose async snapshot of 1 GiB in all ran at ``snapshot_over_copy``
    times the host's measured copy rate (their durable persist far slower)."""
    config = compose(["division=open", "scale=0.0005", "ranks=2", "checkpoint.mode=async"])
    span_ns = int(GiB / (snapshot_over_copy * COPY_GIB_S * GiB) * 1e9)
    recs: list[dict[str, Any]] = []
    for rank in (0, 1):
        recs.append({"op": "write", "index": 1, "checkpoint": 1, "rank": rank, "host": "h", "t0_ns": 0,
                     "t1_ns": 10**9, "staged_ns": span_ns, "bytes": GiB // 2,
                     "stages": [{"tier": "memory", "t0_ns": 0, "t1_ns": span_ns, "bytes": GiB // 2},
                                {"tier": "durable", "t0_ns": span_ns, "t1_ns": 10**9, "bytes": GiB // 2}]})
    system = {"hosts": [{"hostname": "h", "memory_copy_gib_s": COPY_GIB_S}]}
    ctx = Context(config, None, (), None, run=RunData({}, config, {}, recs, system), complete=True)
    rule = ruleset.rule("HOST-PHYSICS")
    return [o for o in ruleset.checks[rule.check](ctx, ruleset, rule) if isinstance(o, Outcome) and not o.ok]


@pytest.mark.parametrize(("version", "multiple"), [("1.17", 3), ("1.18", 2)])
def test_a_snapshot_is_held_to_its_rules_multiple_of_the_copy_rate(version: str, multiple: int) -> None:
    ruleset = load_rules(version)
    assert _failures(ruleset, 0.65) == []  # what an honest snapshot reached here, 8 ranks on 2 cores
    assert _failures(ruleset, multiple * 0.99) == []
    [f] = _failures(ruleset, multiple * 1.01)
    assert f.expected == (f"at most {multiple * COPY_GIB_S:.1f} GiB/s ({multiple}× the host's measured "
                          "memory copy rate)")
    assert f.where == "write 1 (memory stage) on h"


def test_a_stall_shrunk_to_2_3_times_the_copy_rate_passed_before_1_18() -> None:
    assert _failures(load_rules("1.17"), 2.3) == []
    assert len(_failures(load_rules("1.18"), 2.3)) == 1
