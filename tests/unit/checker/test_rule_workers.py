"""The rules of one bundle on forked workers (checker/rule_workers.py): exactly what one process
gives, in the rules' order, whichever process ran which rule; the first exception in the rules'
order raised; a worker that dies leaves its rules to this process; small bundles never fork."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checker import forked, rule_workers
from mlckpt.rules import Context, Evaluation, NotChecked, Outcome, RuleSet, load_rules
from mlckpt.rules.engine import Rule
from mlckpt.rules.rundata import RunData

PARENT = os.getpid()
RULES = 40


def ruleset(tmp: Path, *, raises: tuple[int, ...] = (), dies: tuple[int, ...] = ()) -> RuleSet:
    """40 rules, every one judged by ``check``: rule i fails i % 3 times (its own messages), says
    "not checked" when i % 5 == 0, sleeps a little (so the workers interleave), writes the pid
    that ran it to ``tmp``; rules in ``raises`` raise KeyError(i); rules in ``dies`` end a worker
    (never this process) before they are judged."""
    base = load_rules("1.12")

    def check(ctx: Context, rs: RuleSet, rule: Rule) -> Iterator[Outcome | NotChecked]:
        i = int(rule.id.split("-")[1])
        if i in dies and os.getpid() != PARENT:
            os._exit(9)
        (tmp / f"{i}.{os.getpid()}").touch()
        time.sleep(0.002 * (i % 4))
        if i in raises:
            raise KeyError(i)
        if i % 5 == 0:
            yield NotChecked(f"rule {i} needs nothing here")
            yield NotChecked(f"rule {i} needs nothing here")  # said once per rule
        for k in range(i % 3):
            yield Outcome(False, expected=f"{i}.{k}", actual=i * k, where=f"op {k}")
        yield Outcome(True)

    rules = tuple(Rule(f"R-{i}", "invalid" if i % 2 else "open", ("closed", "open"), ("result",),
                       "metrics_recompute" if i == 7 else "fake", f"rule {i}") for i in range(RULES))
    return dataclasses.replace(base, rules=rules, checks={"fake": check, "metrics_recompute": check})


def context() -> Context:
    records = [{"op": "write", "index": 1, "rank": r, "host": f"h{r % 2}"} for r in range(4)]
    data = RunData({}, {"division": "open"}, {}, records)
    return Context({"division": "open"}, None, run=data)  # type: ignore[arg-type]


def ran_by(tmp: Path) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for p in tmp.iterdir():
        i, pid = map(int, p.name.split("."))
        out.setdefault(pid, set()).add(i)
    return out


@pytest.mark.parametrize("workers", [2, 3])
def test_the_workers_give_exactly_what_one_process_gives(tmp_path: Path, workers: int) -> None:
    serial_dir, par_dir = tmp_path / "serial", tmp_path / "par"
    serial_dir.mkdir()
    par_dir.mkdir()
    want = ruleset(serial_dir).evaluate(context(), ["result"])
    got = rule_workers.evaluate(ruleset(par_dir), context(), ["result"], workers, records=10**6)
    assert got == want
    assert len(want.findings) == sum(i % 3 for i in range(RULES)) and len(want.not_checked) == RULES // 5
    assert [f.rule for f in got.findings] == sorted((f.rule for f in got.findings),
                                                    key=lambda r: int(r.split("-")[1]))
    by = ran_by(par_dir)
    assert sum(len(v) for v in by.values()) == RULES  # every rule judged once
    assert len(by) == workers and all(by.values()), by  # and every worker judged some
    assert 7 in by[PARENT]  # the summary's check stays in the process that keeps the summary


def test_the_first_exception_in_the_rules_order_is_raised(tmp_path: Path) -> None:
    with pytest.raises(KeyError) as got:
        rule_workers.evaluate(ruleset(tmp_path, raises=(33, 21)), context(), ["result"], 2, records=10**6)
    assert got.value.args == (21,)


def test_a_worker_that_dies_leaves_its_rules_to_this_process(tmp_path: Path) -> None:
    serial_dir = tmp_path / "serial"
    serial_dir.mkdir()
    want = ruleset(serial_dir).evaluate(context(), ["result"])
    par_dir = tmp_path / "par"
    par_dir.mkdir()
    got = rule_workers.evaluate(ruleset(par_dir, dies=(3, 4, 5, 6)), context(), ["result"], 2, records=10**6)
    assert got == want
    assert {3, 4, 5, 6} <= ran_by(par_dir)[PARENT]


def test_a_small_bundle_or_one_worker_never_forks(tmp_path: Path) -> None:
    for workers, records in ((2, forked.MIN_RECORDS - 1), (1, 10**6)):
        got = rule_workers.evaluate(ruleset(tmp_path), context(), ["result"], workers, records=records)
        assert isinstance(got, Evaluation) and set(ran_by(tmp_path)) == {PARENT}


def test_no_process_to_be_had_means_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "serial").mkdir()
    want = ruleset(tmp_path / "serial").evaluate(context(), ["result"])
    (tmp_path / "par").mkdir()
    tmp_path = tmp_path / "par"

    def refuse() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    got = rule_workers.evaluate(ruleset(tmp_path), context(), ["result"], 2, records=10**6)
    assert got == want and set(ran_by(tmp_path)) == {PARENT}


def test_what_a_child_raises_is_raised_here() -> None:
    class Unpicklable(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

        def __reduce__(self) -> Any:
            raise TypeError("no")

    def boom() -> None:
        raise Unpicklable(1, 2)

    with pytest.raises(RuntimeError) as got:
        forked.Forked(boom).result()
    assert str(got.value) == "Unpicklable: 1/2"
    assert "in a forked checker process" in "".join(got.value.__notes__)
    with pytest.raises(KeyError) as kerr:
        forked.Forked(lambda: {}["k"]).result()
    assert kerr.value.args == ("k",)
    assert forked.Forked(lambda: [1, {"a": -0.0}]).result() == (True, [1, {"a": -0.0}])
