"""Rules 1.13 and 1.14: serving runs apart from checkpoint runs (each rule judges the kinds of run it names),
what a serving run cannot be run with, and the result rules on records made in memory
(mlckpt/rules/checks/serving.py; real runs and re-signed forgeries: tests/mpi/test_serving_run.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mlckpt.plan.config import compose, setup
from mlckpt.rules import Context, load_rules
from mlckpt.rules.engine import load_rule_set
from mlckpt.rules.rundata import RunData
from mlckpt.serving_metrics import summary
from mlckpt.workload.model import workload_from_config
from mlckpt.workload.serving_run import ServingRun, scope_problems
from mlckpt.written import Written

RS = load_rules()  # the default (1.15: 1.14's serving rules as they are)
BASE = ("division=open", "ranks=4", "serving.tp=2", "scale=0.001", "serving.loads=2")


def config_of(*overrides: str) -> dict[str, Any]:
    return compose([*BASE, *overrides])


Docs = tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]


def honest(config: dict[str, Any], hosts: list[str]) -> Docs:
    """run.json, the records and the summary an honest serving run of ``config`` leaves."""
    run = ServingRun.of(config)
    assert run is not None
    plan = run.plan(config, hosts)
    recs = []
    for index in range(run.loads):
        for r in plan.ranks:
            boot = 1000 * sorted(set(hosts)).index(r.host)  # each host booted at its own instant
            t0 = (boot + 5 * (index + 1)) * 1_000_000_000 + r.rank
            recs.append({"op": "load", "index": index, "rank": r.rank, "replica": r.replica, "shard": r.shard,
                         "host": r.host, "strategy": run.strategy, "t0_ns": t0,
                         "t1_ns": t0 + 20_000_000 + 7919 * r.rank + 101 * index,
                         "wall_start": 1.8e9 + 5 * (index + 1) + r.rank / 1e9,
                         "bytes": plan.shard_bytes(r.shard), "storage_bytes": r.storage_bytes,
                         "node_tier_bytes": r.node_tier_bytes, "received_bytes": r.received_bytes,
                         "resident_bytes": 0, "node_tier_resident_bytes": 0,
                         "verified_bytes": plan.shard_bytes(r.shard)})
    placed: dict[str, list[int]] = {}
    for rank, h in enumerate(hosts):
        placed.setdefault(h, []).append(rank)
    run_doc = {"hosts": [{"host": h, "ranks": rs} for h, rs in placed.items()], "ranks": len(hosts),
               "workload": config["workload"]["name"], "division": config["division"],
               "scale": config["scale"], "rules_version": RS.version,
               "started": "2027-01-15T08:00:00.000Z", "ended": "2027-01-15T08:01:00.000Z",
               "pipeline": {"mode": "sync", "compute_interval_s": 0.0, "fast": None, "fast_keep": 1},
               "serving": run.block("/dev/shm/t" if run.strategy == "nodecache" else None),
               "storage": {"kind": "posix"}, "records_format": Written.of(RS.version).records}
    w = Written.of(RS.version)
    doc = summary(run, recs, ranks=len(hosts), hosts=len(placed), max_resident_fraction=0.01,
                  formats=(w.summary, w.records))
    return run_doc, recs, doc


def result_findings(config: dict[str, Any], run_doc: dict[str, Any], recs: list[dict[str, Any]],
                    doc: dict[str, Any], rs: Any = RS) -> dict[str, list[str]]:
    ctx = Context(config, workload_from_config(config["workload"]), (), None, None, True,
                  run=RunData(run_doc, config, doc, recs, {"hosts": []}))
    out: dict[str, list[str]] = {}
    for f in rs.evaluate(ctx, ["result"]).findings:
        out.setdefault(f.rule, []).append(f.message)
    return out


@pytest.mark.parametrize("strategy", ["direct", "fanout", "nodecache"])
def test_an_honest_serving_result_has_no_finding_and_no_checkpoint_rule_judges_it(strategy: str) -> None:
    config = config_of(f"serving.strategy={strategy}")
    hosts = ["a", "a", "b", "b"]
    got = result_findings(config, *honest(config, hosts))
    assert got == {}
    # the checkpoint rules would have called load records anything but a result
    ctx = Context(config, workload_from_config(config["workload"]), (), None, None, True,
                  run=RunData(*honest(config, hosts)[:1], config, {}, honest(config, hosts)[1], {}))
    judged = {r.id for r in RS.rules if ctx.kind in r.kinds and "result" in r.stages}
    assert judged == {"SERVING-RECORDED", "SERVING-PLAN", "SERVING-COLD", "SERVING-SUMMARY",
                      "OBJECT-STORAGE-RECORDED", "RUN-CLAIMS", "RESULT-CONSISTENT", "RESULT-TIMES",
                      "HOST-CLOCKS", "RECORDS-COPIES", "SERVING-COUNTERS",  # these two from 1.14
                      "SYSTEM-COMPLETE",  # from 1.15
                      "WITNESS-HOST"}  # from 1.16: passes a run that claims no witness


def test_a_checkpoint_run_is_judged_by_no_serving_rule() -> None:
    ctx = setup(["ranks=8"]).context()
    assert ctx.kind == "checkpoint"
    assert not [r.id for r in RS.rules if r.id.startswith("SERVING-") and ctx.kind in r.kinds]


def test_each_forged_part_is_named_by_its_rule() -> None:
    config = config_of("serving.strategy=fanout")
    hosts = ["a", "a", "b", "b"]
    run_doc, recs, doc = honest(config, hosts)

    def forged(edit: Any) -> dict[str, list[str]]:
        r, x, d = copy.deepcopy((run_doc, recs, doc))
        edit(r, x, d)
        return result_findings(config, r, x, d)

    got = forged(lambda r, x, d: r["serving"].update(replicas=4))
    assert list(got) == ["SERVING-RECORDED"] and "replicas=4" in got["SERVING-RECORDED"][0]
    got = forged(lambda r, x, d: [q.update(storage_bytes=q["bytes"], received_bytes=0) for q in x])
    assert "SERVING-PLAN" in got and "load 0: " in got["SERVING-PLAN"][0]
    got = forged(lambda r, x, d: x[5].update(resident_bytes=x[5]["storage_bytes"]))
    assert "load 1: " in got["SERVING-COLD"][0] and "SERVING-SUMMARY" in got
    got = forged(lambda r, x, d: d.update(effective_gb_s=d["effective_gb_s"] * 2))
    assert list(got) == ["SERVING-SUMMARY"] and "effective_gb_s" in got["SERVING-SUMMARY"][0]
    got = forged(lambda r, x, d: r["hosts"].__setitem__(1, {"host": "b", "ranks": [2]}))  # rank 3 nowhere
    assert "run.json placing each of the 4 ranks on one host" in got["SERVING-PLAN"][0]
    got = forged(lambda r, x, d: x.append({**x[0], "op": "load", "index": 2}))
    assert any("loads 0..1" in m for m in got["SERVING-PLAN"])


@pytest.mark.parametrize(("override", "problem"), [
    ("serving.tp=3", "ranks=4 (whole replicas: a multiple of serving.tp=3)"),
    ("scale=1.0", "scale=1 with serving.strategy=fanout"),
    ("checkpoint.tiers.fast=/tmp/x", "checkpoint.tiers.fast (one tier of storage"),
    ("residency=stream", "residency=stream (every replica holds its whole shard)"),
    ("witness.url=http://w:1", "witness.url (serving runs are not witnessed)"),
    ("checkpoint.mode=async", "checkpoint.mode=async (no checkpoints are written)"),
    ("framework.writer=safetensors", "framework.writer (the engine loads the weights)"),
])
def test_what_a_serving_run_cannot_be_run_with(override: str, problem: str) -> None:
    config = config_of("serving.strategy=fanout")
    key, value = override.split("=", 1)
    node = config
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = int(value) if value.isdigit() else float(value) if value[0].isdigit() else value
    assert any(p.startswith(problem) for p in scope_problems(config)), scope_problems(config)
    assert scope_problems(config_of("serving.strategy=fanout")) == []
    assert scope_problems(config_of()) == []  # a checkpoint run: not a serving rule's business


def test_a_rules_file_with_an_unknown_kind_is_a_defect_of_the_data(tmp_path: Path, monkeypatch: Any) -> None:
    from mlckpt import resources
    from mlckpt.rules import CHECKS

    root = tmp_path / "rules"
    (root / "9.1").mkdir(parents=True)
    (root / "9.1" / "rules.yaml").write_text(
        'version: "9.1"\nrules:\n  - {id: X, severity: invalid, divisions: [open], stages: [config], '
        'kinds: [inference], check: serving_scope, message: m}\n')
    (root / "9.2").mkdir()
    (root / "9.2" / "rules.yaml").write_text('version: "9.2"\nextends: "1.13"\nkinds: {NO-SUCH: [serving]}\n'
                                             'rules: []\n')
    real = resources.rules_dir()
    for entry in real.iterdir():
        (root / entry.name).symlink_to(entry)
    monkeypatch.setattr("mlckpt.rules.engine.rules_dir", lambda: root)
    with pytest.raises(ValueError, match="rule X has a bad kind"):
        load_rule_set("9.1", CHECKS)
    with pytest.raises(ValueError, match="kinds names unknown rules or kinds"):
        load_rule_set("9.2", CHECKS)


def test_copied_replicas_are_caught_from_rules_1_14_and_judged_as_before_under_1_13() -> None:
    """Direct loading: every replica reads its whole shard, so ranks 0-1 copied as 2-3 (replica 1)
    fit the plan of two replicas; only their timings, repeated to the nanosecond, tell.  RECORDS-COPIES
    judges serving runs from rules 1.14; a bundle made under 1.13 keeps its verdict."""
    config = config_of("serving.strategy=direct")
    hosts = ["a", "a", "a", "a"]
    run_doc, recs, _ = honest(config, hosts)
    for r in recs:
        if r["replica"] == 1:
            twin = next(q for q in recs if q["index"] == r["index"] and q["rank"] == r["rank"] - 2)
            r.update(t0_ns=twin["t0_ns"], t1_ns=twin["t1_ns"], wall_start=twin["wall_start"])
    run = ServingRun.of(config)
    assert run is not None
    w = Written.of(RS.version)
    doc = summary(run, recs, ranks=4, hosts=1, max_resident_fraction=0.01, formats=(w.summary, w.records))
    got = result_findings(config, run_doc, recs, doc)
    assert set(got) == {"RECORDS-COPIES"}, got
    assert "the same timings as load 0 rank 0" in got["RECORDS-COPIES"][0]
    old = dict(config, rules_version="1.13")
    assert "RECORDS-COPIES" not in result_findings(old, dict(run_doc, rules_version="1.13"), recs, doc,
                                                   load_rules("1.13"))


@pytest.mark.parametrize(("resident", "cold"), [(0, True), (10, True), (None, False)])
def test_the_summary_says_whether_the_node_tier_was_read_cold(resident: int | None, cold: bool) -> None:
    """Summary format 9: a tier whose files were at most 1 % resident before the ranks read them is
    cold; one read from memory (a tmpfs tier keeps every page) is warm.  Null without a tier."""
    config = config_of("serving.strategy=nodecache")
    _, recs, _ = honest(config, ["a", "a", "b", "b"])
    for r in recs:
        r["node_tier_resident_bytes"] = r["node_tier_bytes"] if resident is None else resident
    run = ServingRun.of(config)
    assert run is not None
    w = Written.of(RS.version)
    doc = summary(run, recs, ranks=4, hosts=2, max_resident_fraction=0.01, formats=(w.summary, w.records))
    assert doc["node_tier_cold"] is cold
    assert [ld["node_tier_resident_bytes"] for ld in doc["loads"]] == [
        sum(r["node_tier_resident_bytes"] for r in recs if r["index"] == i) for i in range(2)]
    direct = config_of("serving.strategy=direct")
    _, drecs, _ = honest(direct, ["a", "a", "b", "b"])
    drun = ServingRun.of(direct)
    assert drun is not None
    assert summary(drun, drecs, ranks=4, hosts=2, max_resident_fraction=0.01,
                   formats=(w.summary, w.records))["node_tier_cold"] is None
    old = Written.of("1.13")
    assert "node_tier_cold" not in summary(run, recs, ranks=4, hosts=2, max_resident_fraction=0.01,
                                           formats=(old.summary, old.records))


def _with_counters(recs: list[dict[str, Any]], own: int | None = None, device: int | None = None) -> None:
    """Each host's first record of each load carries its host's counters around the load, as the
    op timer reads them: ``own``/``device``, the bytes read in the window (default: the host's
    claimed storage bytes)."""
    firsts: dict[tuple[int, str], dict[str, Any]] = {}
    for r in recs:
        firsts.setdefault((r["index"], r["host"]), r)
    for (index, host), lead in firsts.items():
        hr = [r for r in recs if r["index"] == index and r["host"] == host]
        claimed = sum(r["storage_bytes"] for r in hr)
        t0, t1 = min(r["t0_ns"] for r in hr), max(r["t1_ns"] for r in hr)
        lead["host_counters"] = {
            "device": "254:0",
            "before": {"t_ns": t0 - 1000, "own_read_bytes": 4096, "read_bytes": 1 << 30},
            "after": {"t_ns": t1 + 1000, "own_read_bytes": 4096 + (claimed if own is None else own),
                      "read_bytes": (1 << 30) + (claimed if device is None else device)}}


def _counters_findings(recs: list[dict[str, Any]], config: dict[str, Any], run_doc: dict[str, Any],
                       doc: dict[str, Any], fs: str = "ext4") -> list[str]:
    system = {"hosts": [{"hostname": h, "filesystem": {"fs_type": fs}} for h in ("a", "b")]}
    ctx = Context(config, workload_from_config(config["workload"]), (), None, None, True,
                  run=RunData(run_doc, config, doc, recs, system))
    return [f.message for f in RS.evaluate(ctx, ["result"]).findings if f.rule == "SERVING-COUNTERS"]


@pytest.mark.parametrize(("own", "device", "shift", "found"), [
    (None, None, 0, None),  # as the kernel saw it
    (None, 10 << 30, 0, None),  # the device busier than the ranks: other processes read too
    (0, None, 0, "the host's ranks read at least"),  # bytes the ranks never read
    (None, 0, 0, "the device read at least"),
    (None, None, 10_000, "every rank of the host inside its counters' window"),  # a rank moved out
])
def test_the_counters_around_a_load_hold_its_claimed_bytes(own: int | None, device: int | None, shift: int,
                                                           found: str | None) -> None:
    config = config_of("serving.strategy=direct")
    run_doc, recs, doc = honest(config, ["a", "a", "b", "b"])
    _with_counters(recs, own, device)
    recs[-1]["t1_ns"] += shift  # a rank's end past its host's closing counters
    got = _counters_findings(recs, config, run_doc, doc)
    if found is None:
        assert got == []
    else:
        assert got and found in got[0], got


def test_the_counters_are_not_judged_on_a_filesystem_without_a_device_of_its_own() -> None:
    config = config_of("serving.strategy=direct")
    run_doc, recs, doc = honest(config, ["a", "a", "b", "b"])
    _with_counters(recs, own=0, device=0)
    assert _counters_findings(recs, config, run_doc, doc, fs="nfs4") == []
    for r in recs:
        r.pop("host_counters", None)
    assert "on 0 records" in _counters_findings(recs, config, run_doc, doc)[0]
