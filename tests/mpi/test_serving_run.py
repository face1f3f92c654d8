"""Serving runs end to end (rules 1.14): `mlckpt run serving.strategy=...` on real MPI ranks, each
strategy's signed bundle through mlckpt-check, and the forgeries a serving result invites (a
strategy relabelled, a replica count claimed that the records do not hold, replicas copied, a
faster time to ready, bytes claimed from the storage that the kernel never saw read, a warm cache
or a warm node tier hidden, buffered reads or weights in memory
claimed, a serving block edited) caught by the rule named, after re-signing."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli_env
from support.forge import edit_json, edit_records, edit_yaml, read_json, read_records, resign, resummarize
from support.runs import hard_rules, judged_alone, printed_bundle, signed_run
from support.trees import tree_of

from mlckpt import bundle
from mlckpt.rules import load_rules

BIN = Path(sys.executable).parent
BASE = ("workload=llama3_8b", "division=open", "scale=0.002", "ranks=4", "serving.tp=2", "serving.loads=2",
        "checkpoint.folder=ck", "output.root=results")
STRATEGIES = ("direct", "fanout", "nodecache")


def run(h: dict[str, Path], cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return signed_run(h, cwd, *BASE, *overrides, timeout=300)


@pytest.fixture(scope="module")
def made(honest_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    h = honest_bundles
    out: dict[str, Any] = {"h": h}
    for strategy in STRATEGIES:
        cwd = tmp_path_factory.mktemp(strategy)
        proc = run(h, cwd, f"serving.strategy={strategy}", f"serving.node_tier={cwd / 'tier'}")
        assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
        out[strategy] = {"bundle": printed_bundle(proc), "out": proc.stdout, "cwd": cwd}
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_passes_the_checker(made: dict[str, Any], strategy: str, tmp_path: Path) -> None:
    m = made[strategy]
    b = judged_alone(made["h"], tree_of(made["h"], tmp_path / "t", m["bundle"]))
    assert b["verdict"] == "open" and not hard_rules(b), b["findings"]
    s = b["metrics"]["serving"]
    summary = read_json(m["bundle"], "summary.json")
    assert s["strategy"] == strategy and s["replicas"] == 2 and s["ready_s"] == summary["ready_s_median"] > 0
    assert f"2 replicas ({strategy}) ready in" in m["out"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_records_hold_what_each_strategy_promises(made: dict[str, Any], strategy: str) -> None:
    m = made[strategy]
    run_doc, records, summary = (read_json(m["bundle"], "run.json"), read_records(m["bundle"]),
                                 read_json(m["bundle"], "summary.json"))
    assert run_doc["serving"]["strategy"] == strategy and run_doc["run_format"] == 13
    assert run_doc["records_format"] == 14 and summary["summary_format"] == 12
    assert (run_doc["serving"]["node_tier"] is None) == (strategy != "nodecache")
    assert [(r["index"], r["rank"]) for r in records] == [(i, r) for i in range(2) for r in range(4)]
    shards = sum(r["bytes"] for r in records if r["index"] == 0 and r["replica"] == 0)
    for load in summary["loads"]:
        # direct: every replica reads its shards; fan-out and one host's node cache: each shard once
        assert load["storage_bytes"] == shards * (2 if strategy == "direct" else 1)
        assert load["placed_bytes"] == 2 * shards
        assert load["received_bytes"] == (shards if strategy == "fanout" else 0)
        assert load["node_tier_bytes"] == (2 * shards if strategy == "nodecache" else 0)
        assert load["resident_bytes"] <= 0.01 * load["storage_bytes"]
        # a tier on this disk was made durable and evicted: every rank read it from the device
        assert load["node_tier_resident_bytes"] <= 0.01 * load["node_tier_bytes"]
    assert summary["node_tier_cold"] is (True if strategy == "nodecache" else None)
    for r in records:  # records format 12: what the pipelined exchange cost, within the load
        if strategy == "fanout":
            assert 0 < r["exchange_cpu_ns"] <= r["t1_ns"] - r["t0_ns"] + 1_000_000
            assert 0 <= r["exchange_tail_ns"] <= r["t1_ns"] - r["t0_ns"]
        else:
            assert "exchange_cpu_ns" not in r and "exchange_tail_ns" not in r
    assert all(r["verified_bytes"] == r["bytes"] > 0 for r in records)
    # every load timed by the op timer: its host's counters around it, on the host's first rank
    for index in range(2):
        [leader] = [r for r in records if r["index"] == index and "host_counters" in r]
        hc = leader["host_counters"]
        claimed = sum(r["storage_bytes"] for r in records if r["index"] == index)
        assert hc["after"]["own_read_bytes"] - hc["before"]["own_read_bytes"] >= claimed
        assert hc["before"]["t_ns"] < min(r["t0_ns"] for r in records if r["index"] == index)
        assert all(r["direct"] is True and r["cpu_ns"] > 0 for r in records)
    assert summary["read_cold"] and summary["read_verified"] and summary["num_loads"] == 2
    left = [p for p in (m["cwd"] / "ck").rglob("*") if p.is_file()]
    assert (not left and not (m["cwd"] / "tier").exists()) or not any((m["cwd"] / "tier").iterdir()), left


def _each(recs: list[dict[str, Any]], **values: Any) -> None:
    for r in recs:
        r.update(values)


def _relabel(strategy: str) -> Callable[[Path], None]:
    def edit(b: Path) -> None:
        edit_yaml(b, "config.yaml", lambda c: c["serving"].update(strategy=strategy))
        edit_json(b, "run.json", lambda r: r["serving"].update(strategy=strategy))
        edit_records(b, lambda recs: _each(recs, strategy=strategy))
        resummarize(b)
    return edit


def _claim_eight_ranks(b: Path) -> None:
    def run_json(r: dict[str, Any]) -> None:
        r.update(ranks=8)
        r["serving"].update(replicas=4)
        r["hosts"][0].update(ranks=list(range(8)))
    edit_yaml(b, "config.yaml", lambda c: c.update(ranks=8))
    edit_json(b, "run.json", run_json)


def _more_replicas(b: Path) -> None:
    """Two replicas' records claimed as four: the configuration, run.json's count and placement,
    and a summary recomputed from the records as they are."""
    _claim_eight_ranks(b)
    resummarize(b)
    edit_json(b, "summary.json", lambda s: s.update(replicas=4, ranks=8, placed_bytes=2 * s["placed_bytes"]))


def _copied_ranks(b: Path) -> None:
    """Two replicas' records made four by copying ranks 0-3 as 4-7 (new replicas, same bytes)."""
    def more(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        extra = [{**copy.deepcopy(r), "rank": r["rank"] + 4, "replica": r["replica"] + 2} for r in recs]
        return sorted(recs + extra, key=lambda r: (r["index"], r["rank"]))
    edit_records(b, more)
    _claim_eight_ranks(b)
    resummarize(b)


def _copied_replicas(b: Path) -> None:
    """Under direct loading every replica reads its whole shard, so ranks 0-3 copied as 4-7 fit the
    plan of four replicas: only their timings, repeated to the nanosecond, tell."""
    _copied_ranks(b)


def _tier_claimed_cold(b: Path) -> None:
    """A warm node tier (its files in the page cache before the ranks read them) claimed cold."""
    edit_records(b, lambda recs: _each(recs, node_tier_resident_bytes=int(recs[0]["node_tier_bytes"])))
    resummarize(b)
    edit_json(b, "summary.json", lambda s: s.update(node_tier_cold=True))


def _fanout_as_direct(b: Path) -> None:
    """A fan-out run passed off as direct, coherently: every rank claims its whole shard from the
    storage and nothing from the network, so the records fit the direct plan they claim; the
    kernel's counters around each load saw each shard read once."""
    def direct(recs: list[dict[str, Any]]) -> None:
        for r in recs:
            r.update(strategy="direct", storage_bytes=r["bytes"], received_bytes=0)
            r.pop("exchange_cpu_ns")
            r.pop("exchange_tail_ns")
    edit_yaml(b, "config.yaml", lambda c: c["serving"].update(strategy="direct"))
    edit_json(b, "run.json", lambda r: r["serving"].update(strategy="direct"))
    edit_records(b, direct)
    resummarize(b)


def _exchange_hidden(b: Path) -> None:
    """A fan-out load made faster by cutting its end, the exchange's tail left as it was: the
    exchange would have run past the load's end."""
    def cut(recs: list[dict[str, Any]]) -> None:
        for r in recs:
            r["t1_ns"] = r["t0_ns"] + max(1, r["exchange_tail_ns"] - 2_000_000)
            r["exchange_tail_ns"] = max(r["exchange_tail_ns"], 3_000_000)
    edit_records(b, cut)
    resummarize(b)


def _exchange_on_direct(b: Path) -> None:
    """A direct load that claims a fan-out exchange's cost."""
    edit_records(b, lambda recs: _each(recs, exchange_cpu_ns=1, exchange_tail_ns=1))


def _buffered(b: Path) -> None:
    """A run that read its weights through the page cache, claimed as any other."""
    edit_yaml(b, "config.yaml", lambda c: c["io"].update(direct=False))


def _weights_in_memory(b: Path) -> None:
    """Weights laid out on tmpfs (system.json as such a host measures its folder)."""
    def tmpfs(doc: dict[str, Any]) -> None:
        for h in doc["hosts"]:
            h["filesystem"]["fs_type"] = "tmpfs"
    edit_json(b, "system.json", tmpfs)


def _faster(b: Path) -> None:
    edit_json(b, "summary.json", lambda s: s.update(ready_s_median=s["ready_s_median"] / 2))


def _warm(b: Path) -> None:
    edit_records(b, lambda recs: _each([r for r in recs if r["index"] == 1], resident_bytes=1 << 30))
    resummarize(b)


def _fewer_loads(b: Path) -> None:
    edit_json(b, "run.json", lambda r: r["serving"].update(loads=1))


def _one_load_dropped(b: Path) -> None:
    edit_records(b, lambda recs: [r for r in recs if r["index"] == 0])
    resummarize(b)


def _streamed(b: Path) -> None:
    edit_yaml(b, "config.yaml", lambda c: c.update(residency="stream"))


def _closed(b: Path) -> None:
    """A serving run claimed for the closed division (no closed serving workload is defined)."""
    edit_yaml(b, "config.yaml", lambda c: c.update(division="closed"))
    edit_json(b, "run.json", lambda r: r.update(division="closed"))


# Rules whose failing cases are here, on bundles of real serving runs (tests/unit/rules/
# test_rules_coverage.py counts them): rule -> (source strategy, forgery)
FORGERIES = {
    "SERVING-PLAN": [("direct", _relabel("fanout")),  # direct's records labelled fan-out
                     ("fanout", _relabel("direct")), ("fanout", _more_replicas), ("fanout", _copied_ranks),
                     ("direct", _one_load_dropped), ("fanout", _exchange_hidden),
                     ("direct", _exchange_on_direct)],
    "RECORDS-COPIES": [("direct", _copied_replicas)],
    "SERVING-SUMMARY": [("direct", _faster), ("nodecache", _tier_claimed_cold)],
    "SERVING-DIRECT": [("direct", _buffered)],
    "SERVING-COUNTERS": [("fanout", _fanout_as_direct)],
    "MEMORY-FOLDER": [("fanout", _weights_in_memory)],
    "SERVING-COLD": [("nodecache", _warm)],
    "SERVING-RECORDED": [("direct", _fewer_loads)],
    "SERVING-SCOPE": [("fanout", _streamed)],
    "SERVING-CLOSED": [("direct", _closed)],
}
CASES = [(rule, source, forge) for rule, cases in FORGERIES.items() for source, forge in cases]


@pytest.mark.parametrize(("rule", "source", "forge"), CASES,
                         ids=[f"{r}-{s}-{f.__name__}" for r, s, f in CASES])
def test_a_forged_serving_result_is_caught(made: dict[str, Any], rule: str, source: str,
                                           forge: Callable[[Path], None], tmp_path: Path) -> None:
    h = made["h"]
    b = tmp_path / "b" / made[source]["bundle"].name
    shutil.copytree(made[source]["bundle"], b)
    forge(b)
    run_doc = read_json(b, "run.json")
    resign(b, bundle.load_private_key(h["dir"] / "keys" / "org.pem"), ranks=run_doc["ranks"],
           division=run_doc["division"])
    got = judged_alone(h, tree_of(h, tmp_path / "t", b))
    assert got["verdict"] == load_rules().rule(rule).severity, got["findings"]  # invalid, or open
    assert rule in {f["rule"] for f in got["findings"]}, got["findings"]


def test_a_serving_bundle_no_checkpoint_plan_fits_is_judged_not_faulted(made: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    """A serving run's workload parallelism edited so that no checkpoint plan fits its ranks (4
    ranks, pipeline 3): the checker judges it (the serving rules hold it to its own plan) rather
    than faulting while building a checkpoint plan it does not use."""
    h = made["h"]
    b = tmp_path / "b" / made["direct"]["bundle"].name
    shutil.copytree(made["direct"]["bundle"], b)
    edit_yaml(b, "config.yaml", lambda c: c["workload"]["parallelism"].update(pipeline=3))
    resign(b, bundle.load_private_key(h["dir"] / "keys" / "org.pem"), ranks=4, division="open")
    got = judged_alone(h, tree_of(h, tmp_path / "t", b))
    assert "INTERNAL" not in {f["rule"] for f in got["findings"]}, got["findings"]
    assert got["verdict"] == "open" and not hard_rules(got), got["findings"]
    assert any(n["rule"] == "BYTES-PLAN" and "no checkpoint plan" in n["reason"]
               for n in got["not_checked"]), got


def test_a_serving_run_that_cannot_be_run_is_refused_before_any_io(honest_bundles: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    proc = run(honest_bundles, tmp_path, "serving.strategy=fanout", "scale=1.0")
    assert proc.returncode == 2 and "[SERVING-SCOPE]" in proc.stderr and "Traceback" not in proc.stderr
    proc = run(honest_bundles, tmp_path, "serving.strategy=direct", "serving.tp=3")
    assert proc.returncode == 2 and "ranks=4 (whole replicas: a multiple of serving.tp=3)" in proc.stderr
    assert not (tmp_path / "ck").exists() and not (tmp_path / "results").exists()
    proc = run(honest_bundles, tmp_path, "serving.strategy=direct", "rules_version='1.12'")
    assert proc.returncode == 2 and "serving runs need rules_version 1.13" in proc.stderr
    proc = run(honest_bundles, tmp_path, "serving.strategy=fanout", "io.direct=false")
    assert proc.returncode == 2 and "[SERVING-DIRECT]" in proc.stderr and "io.direct=false" in proc.stderr
    assert not (tmp_path / "ck").exists() and not (tmp_path / "results").exists()


def test_weights_in_memory_are_refused_before_any_io(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this host")
    folder = shm / f"mlckpt-test-weights-{tmp_path.name}"
    try:
        proc = run(honest_bundles, tmp_path, "serving.strategy=direct", f"checkpoint.folder={folder}")
        assert proc.returncode == 2 and "[MEMORY-FOLDER]" in proc.stderr, proc.stderr[-2000:]
        assert "tmpfs" in proc.stderr and "Traceback" not in proc.stderr
        assert not any(folder.rglob("*.bin")) if folder.exists() else True
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_node_tier_in_memory_is_labelled_warm(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    """nodecache's default tier, /dev/shm, holds its files in memory whatever the eviction: the
    summary says its reads were warm, and the checker passes the labelled result."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this host")
    proc = run(honest_bundles, tmp_path, "serving.strategy=nodecache", f"serving.node_tier={shm}")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    b = printed_bundle(proc)
    summary, records = read_json(b, "summary.json"), read_records(b)
    assert summary["node_tier_cold"] is False and summary["read_cold"] is True
    for load in summary["loads"]:
        assert load["node_tier_resident_bytes"] >= 0.99 * load["node_tier_bytes"] > 0
    assert sum(r["node_tier_resident_bytes"] for r in records) == sum(
        ld["node_tier_resident_bytes"] for ld in summary["loads"])
    got = judged_alone(honest_bundles, tree_of(honest_bundles, tmp_path / "t", b))
    assert got["verdict"] == "open" and not hard_rules(got), got["findings"]
    shown = subprocess.run([str(BIN / "mlckpt"), "report", str(b)], env=cli_env(), text=True,
                           capture_output=True, timeout=120, check=False)
    assert shown.returncode == 0 and "warm: read from memory" in shown.stdout, shown.stdout
    assert not list(shm.glob(f"mlckpt-tier-{b.name.split('-')[0]}*"))


def test_the_leaderboard_ranks_the_strategies_in_one_serving_class(made: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    h = made["h"]
    root = tree_of(h, tmp_path / "t", *(made[s]["bundle"] for s in STRATEGIES), h["llama3_8b"])
    shutil.copy(h["dir"] / "trusted-keys.yaml", root / "trusted-keys.yaml")
    docs = {}
    for fmt in ("json", "md", "csv", "html"):
        proc = subprocess.run([str(BIN / "mlckpt-check"), "leaderboard", str(root), "--format", fmt, "--out",
                               str(tmp_path / f"lb.{fmt}")], env=cli_env(), text=True, capture_output=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        docs[fmt] = (tmp_path / f"lb.{fmt}").read_text()
    board = json.loads(docs["json"])
    [serving] = [c for c in board["classes"] if c["pipeline"] == "serving"]
    assert serving["id"] == "open-llama3_8b-x0_002-serving" and serving["sort"].startswith("sorted by time")
    rows = serving["rows"]
    assert sorted(r["strategy"] for r in rows) == sorted(STRATEGIES)
    assert [r["ready_s"] for r in rows] == sorted(r["ready_s"] for r in rows)  # fastest first
    for r in rows:
        summary = read_json(made[r["strategy"]]["bundle"], "summary.json")
        assert r["ready_s"] == round(summary["ready_s_median"], 3) and r["replicas"] == 2 and r["tp"] == 2
        assert r["storage_gb"] == round(summary["storage_bytes"] / 1e9, 2)
        assert "write_gib_s" not in r
    assert [c for c in board["classes"] if c["pipeline"] == "sync"]  # the checkpoint run beside it
    assert "| Strategy " in docs["md"] and "Time to ready (s)" in docs["md"]
    assert "Time to ready (s)" in docs["csv"].splitlines()[0] and "fanout" in docs["csv"]
    assert 'aria-sort="ascending"' in docs["html"] and ">Time to ready<" in docs["html"]


def test_compare_and_report_show_a_serving_runs_loads(made: dict[str, Any], tmp_path: Path) -> None:
    a, b = made["direct"]["bundle"], made["fanout"]["bundle"]
    proc = subprocess.run([str(BIN / "mlckpt-check"), "compare", str(a), str(b), "--json"], env=cli_env(),
                          text=True, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = {m["key"]: m for m in json.loads(proc.stdout)["metrics"]}
    assert (rows["strategy"]["a"], rows["strategy"]["b"]) == ("direct", "fanout")
    assert rows["storage_gb"]["ratio_b_over_a"] == pytest.approx(0.5)  # fan-out reads each shard once
    assert "write_bandwidth_mean_gib_s" not in rows
    summary = read_json(b, "summary.json")
    assert rows["ready_s_median"]["b"] == summary["ready_s_median"]
    proc = subprocess.run([str(BIN / "mlckpt"), "report", str(b), "--csv", str(tmp_path / "ops.csv")],
                          env=cli_env(), text=True, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "serving    2 replicas of TP 2, fanout" in proc.stdout and "node tier" not in proc.stdout
    shown = subprocess.run([str(BIN / "mlckpt"), "report", str(made["nodecache"]["bundle"])], env=cli_env(),
                           text=True, capture_output=True, timeout=120, check=False)
    assert "cold: read from its device, 0% of its reads resident beforehand" in shown.stdout, shown.stdout
    lines = (tmp_path / "ops.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith("load,0,,fanout,")
    slowest = float(lines[1].split(",")[4])
    assert slowest == summary["loads"][0]["ready_s"]
