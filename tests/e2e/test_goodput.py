"""`mlckpt goodput` on real bundles (tests/conftest.py's honest_bundles): its costs are the records'
own, worked out here from the raw times, its interval the model's, and what it cannot answer it
refuses in one line."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import MLCKPT, cli_env

from mlckpt.plan import goodput
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import workload_from_config


def _goodput(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MLCKPT), "goodput", *args], env=cli_env(), text=True, capture_output=True,
                          timeout=120, check=False)


def _ops(folder: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for line in (folder / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault((r["op"], r["index"]), []).append(r)
    return out


def test_a_sync_runs_costs_are_its_records_at_full_size(honest_bundles: dict[str, Path]) -> None:
    folder = honest_bundles["llama3_8b"]
    proc = _goodput(str(folder), "--gpus", "16384", "--gpu-mtbf", "50000h", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    ops = _ops(folder)
    [write] = [recs for (op, _), recs in ops.items() if op == "write"]
    [read] = [recs for (op, _), recs in ops.items() if op == "read"]
    # the op is its slowest rank, from its host's barrier to last byte; a sync write is safe when it ends
    stall = (max(r["t1_ns"] for r in write) - min(r["t0_ns"] for r in write)) / 1e9
    restore = (max(r["t1_ns"] for r in read) - min(r["t0_ns"] for r in read)) / 1e9
    config = yaml.safe_load((folder / "config.yaml").read_text())
    full = make_plan(workload_from_config(config["workload"]), 4, 1.0).total_bytes
    scale = full / sum(r["bytes"] for r in write)
    assert doc["measured"]["as_run"] == pytest.approx(
        {"stall_s": stall, "durable_s": stall, "restore_s": restore})
    assert doc["measured"]["write_scale"] == pytest.approx(scale) and scale > 1000  # scale 0.0005
    assert doc["stall_s"] == pytest.approx(stall * scale) and doc["restore_s"] == pytest.approx(
        restore * doc["measured"]["read_scale"])
    assert doc["mtbf_s"] == pytest.approx(50000 * 3600 / 16384)
    costs = goodput.Costs(doc["stall_s"], doc["durable_s"], doc["restore_s"])
    assert doc["optimal_s"] == pytest.approx(goodput.optimal_interval(costs, doc["mtbf_s"]))
    assert doc["daly_s"] * 0.99 <= doc["interval_s"] <= doc["young_s"]  # within Young's and Daly's
    assert doc["keep_up_s"] == 0 and doc["goodput"] == pytest.approx(
        goodput.goodput_at(doc["interval_s"], costs, doc["mtbf_s"]))
    assert "holds, by key fingerprint" in doc["signature"]


def test_an_async_run_is_safe_later_than_it_stalls(honest_bundles: dict[str, Path]) -> None:
    """Its interval can be no shorter than its persisting (D − C), and only the restore from the
    durable tier counts (a failure takes the node's fast tier with it)."""
    folder = honest_bundles["async_tiers"]
    proc = _goodput(str(folder), "--mtbf", "1h", "--as-run", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    writes = [recs for (op, _), recs in _ops(folder).items() if op == "write"]
    # each from its host's barrier (one host): the first rank to leave it
    stall = statistics.fmean(max(r["staged_ns"] for r in recs) - min(r["t0_ns"] for r in recs)
                             for recs in writes) / 1e9
    durable = statistics.fmean(max(r["t1_ns"] for r in recs) - min(r["t0_ns"] for r in recs)
                               for recs in writes) / 1e9
    assert doc["stall_s"] == pytest.approx(stall) and doc["durable_s"] == pytest.approx(durable)
    assert doc["keep_up_s"] == pytest.approx(durable - stall) and durable > stall
    assert doc["measured"]["reads"] == 1 and doc["projected"] is False


def test_the_terminal_shows_its_arithmetic(honest_bundles: dict[str, Path]) -> None:
    proc = _goodput(str(honest_bundles["llama3_8b"]), "--mtbf", "3h", "--interval", "30m")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("llama3_8b on 4 ranks (") and "1 checkpoint(s) and 1 restore(s)" in lines[0]
    assert lines[1].startswith("  measured per checkpoint (scale 0.0005): stall C = ")
    assert lines[2].startswith("  at full size (× ")
    assert lines[3] == "  job MTBF M = 3.00 h (given)"
    assert lines[4].startswith("  interval that maximises goodput: τ* = M·(1 + W₀(−e^(−1−C/M))) = ")
    assert lines[-1].startswith("  at 30.00 min: goodput ") and "work lost per failure" in lines[-1]


@pytest.mark.parametrize(("args", "message"), [
    ((), "--mtbf: give the job's MTBF (--mtbf 3h), or --gpus N with --gpu-mtbf H"),
    (("--gpus", "8"), "--mtbf: give the job's MTBF (--mtbf 3h), or --gpus N with --gpu-mtbf H"),
    (("--mtbf", "3h", "--gpus", "8", "--gpu-mtbf", "9h"), "--mtbf: give the job's MTBF"),
    (("--mtbf", "soon"), "--mtbf: not a duration: 'soon'"),
    (("--gpus", "0", "--gpu-mtbf", "9h"), "--gpus: the job's GPUs, at least 1 (not 0)"),
    (("--mtbf", "3h", "--interval", "-5"), "--interval: not a duration: '-5'"),
    (("--mtbf", "3h", "--interval", "0"), "--interval: not a positive duration: '0'"),
])
def test_what_it_cannot_use_is_refused_in_one_line(honest_bundles: dict[str, Path], args: tuple[str, ...],
                                                   message: str) -> None:
    proc = _goodput(str(honest_bundles["llama3_8b"]), *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"mlckpt: error: {message}") and proc.stderr.count("\n") == 1, proc.stderr


def test_a_serving_run_or_a_missing_folder_is_not_a_checkpoint_result(honest_bundles: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    proc = _goodput(str(honest_bundles["serving"]), "--mtbf", "3h")
    assert proc.returncode == 2 and "a serving run loads weights and writes no checkpoint" in proc.stderr
    proc = _goodput(str(tmp_path), "--mtbf", "3h")
    assert proc.returncode == 2 and "not a readable result folder" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_write_invocation_alone_has_no_restore_to_count(honest_bundles: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """Records with no restore from the durable tier (a split result's write invocation) give no
    goodput: refused in one line, never a figure made without R."""
    folder = tmp_path / "w"
    shutil.copytree(honest_bundles["llama3_8b"], folder)
    lines = (folder / "records.jsonl").read_text().splitlines()
    (folder / "records.jsonl").write_text("".join(f"{line}\n" for line in lines
                                                  if json.loads(line)["op"] == "write"))
    proc = _goodput(str(folder), "--mtbf", "3h")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert "1 checkpoint(s) and 0 restore(s) from the durable tier: goodput needs both" in proc.stderr


def test_the_leaderboard_and_compare_show_the_goodput_the_records_give(honest_bundles: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """At the rules version's reference job (rules 1.18: 16,384 GPUs of 50,000 h), worked out by the
    checker from the bundle's records: what `mlckpt goodput` prints for that job."""
    from support.trees import tree_of

    from checker import leaderboard
    from checker.compare import compare
    from checker.leaderboard.collect import read_bundle
    from mlckpt import bundle
    from mlckpt.rules import load_rules

    h = honest_bundles
    folder = h["llama3_8b"]
    ref = load_rules(json.loads((folder / "run.json").read_text())["rules_version"]).data["goodput"]
    assert ref == {"gpus": 16384, "gpu_mtbf_s": 180000000}
    proc = _goodput(str(folder), "--gpus", str(ref["gpus"]), "--gpu-mtbf", str(ref["gpu_mtbf_s"]), "--json")
    assert proc.returncode == 0, proc.stderr
    want = json.loads(proc.stdout)["goodput"]
    assert 0.5 < want < 1
    root = tree_of(h, tmp_path / "t", folder)
    trusted = bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml")
    board = leaderboard.collect(root, trusted)
    [entry] = [e for t in board.tables for e in t.entries]
    assert entry.row()["goodput_pct"] == pytest.approx(100 * want)
    docs = read_bundle(folder, trusted)
    side = {m["key"]: m for m in compare((str(folder), docs), (str(folder), docs))["metrics"]}
    assert side["goodput_pct"]["a"] == pytest.approx(100 * want)
    # a serving run has no checkpoint: no goodput, and the row says so rather than inventing one
    assert math.isnan(read_bundle(h["serving"], trusted).goodput)
