"""Split invocations on real MPI: a write invocation that keeps its checkpoints, a read-only
invocation that restores them (checkpoint.num_writes=0 checkpoint.restore_from=...), and the
checker pairing the two bundles (SPLIT-PAIR)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.runs import printed_bundle
from support.trees import tree_of

from checker.tree_check import check_tree
from mlckpt import bundle

BIN = Path(sys.executable).parent
SMALL = ("workload=llama3_8b", "division=open", "scale=0.0005", "ranks=4", "io.direct=false")
# Rules whose failing cases are here, on bundles of real split results: a read invocation re-pointed at
# another write invocation, a read invocation moved on the wall clock (tests/e2e/test_checker.py and
# tests/unit/rules/test_rules_coverage.py count them)
FORGERIES = ("SPLIT-EVIDENCE",)


def run(h: dict[str, Path], cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """An invocation these tests need valid: beside a busy disk a try may come out disturbed, so it is
    tried up to six times (each try keeps its bundle; the one printed last is the result's)."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(h["dir"] / "xdg"), "MLCKPT_RETRY_DISTURBED": "5"}
    env.pop("MLCKPT_DEBUG", None)
    return subprocess.run(
        [str(BIN / "mlckpt"), "run", *SMALL, f"system={h['dir'] / 'laptop-ext4.yaml'}",
         f"signing.key={h['dir'] / 'keys' / 'org.pem'}", "checkpoint.folder=ck", "output.root=results",
         *overrides], cwd=cwd, env=env, text=True, capture_output=True, timeout=900, check=False)


def write_invocation(h: dict[str, Path], cwd: Path, writes: int = 2) -> Path:
    proc = run(h, cwd, f"checkpoint.num_writes={writes}", "checkpoint.num_reads=0", "checkpoint.keep=true")
    assert proc.returncode == 0, proc.stderr
    return printed_bundle(proc)


def checked(h: dict[str, Path], root: Path) -> dict[str, Any]:
    return check_tree(root, bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml"), jobs=1)


@pytest.fixture(scope="module")
def split(honest_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    h = honest_bundles
    cwd = tmp_path_factory.mktemp("split")
    w = write_invocation(h, cwd)
    kept = sorted(p.relative_to(cwd) for p in (cwd / "ck").rglob("*") if p.is_file())
    proc = run(h, cwd, "checkpoint.num_writes=0", "checkpoint.num_reads=3",
               f"checkpoint.restore_from={w.name}")
    assert proc.returncode == 0, proc.stderr
    return {"h": h, "cwd": cwd, "write": w, "read": printed_bundle(proc), "out": proc.stdout, "kept": kept}


def test_the_write_invocation_keeps_its_checkpoints_and_its_content_key(split: dict[str, Any]) -> None:
    w = split["write"]
    run_doc = json.loads((w / "run.json").read_text())
    files = [str(p) for p in split["kept"]]
    assert f"ck/{w.name}/.mlckpt-run" in files
    assert sum(f.startswith(f"ck/{w.name}/ckpt-0002/") for f in files) == 8  # 4 ranks × 2 files
    assert run_doc["restored_from"] is None and run_doc["run_format"] == 13
    # its commitment to the content key: the read invocation's proof opens it, nothing else does
    from mlckpt.rules.checks.split import proof_matches

    proof = json.loads((split["read"] / "run.json").read_text())["restored_from"]["content_proof"]
    assert proof_matches(proof, run_doc["content_commitment"])
    assert not proof_matches(run_doc["content_commitment"], run_doc["content_commitment"])
    assert not proof_matches(proof[:-1] + ("0" if proof[-1] != "0" else "1"), run_doc["content_commitment"])
    summary = json.loads((w / "summary.json").read_text())
    assert summary["num_reads"] == 0 and sorted(summary["metric"]) == [
        "checkpoint_size_GB", "save_checkpoint_duration_mean_seconds",
        "save_checkpoint_duration_stdev_seconds", "save_checkpoint_io_mean_GB_per_second",
        "save_checkpoint_io_stdev_GB_per_second"]
    assert summary["mlckpt_read_guarantee"] == "no_reads"


def test_the_read_invocation_restores_and_verifies_the_written_content(split: dict[str, Any]) -> None:
    r, w = split["read"], split["write"]
    run_doc = json.loads((r / "run.json").read_text())
    wrun = json.loads((w / "run.json").read_text())
    source = run_doc["restored_from"]
    assert (source["run_id"], source["name"], source["num_writes"]) == (wrun["run_id"], w.name, 2)
    assert source["statement_sha256"] == bundle.verify_bundle(w).statement_sha256
    records = [json.loads(line) for line in (r / "records.jsonl").read_text().splitlines()]
    assert {x["op"] for x in records} == {"read"} and len(records) == 3 * 4
    restored = [sorted({x["checkpoint"] for x in records if x["index"] == k}) for k in (1, 2, 3)]
    assert restored == [[1], [2], [1]]  # restores cycle through the write invocation's checkpoints
    assert all(x["verified_bytes"] == x["bytes"] and x["mismatches"] == 0 for x in records)
    summary = json.loads((r / "summary.json").read_text())
    assert summary["num_writes"] == 0 and summary["mlckpt_read_guarantee"] == "cold_verified"
    assert set(summary["metric"]) == {"checkpoint_size_GB", "load_checkpoint_duration_mean_seconds",
                                      "load_checkpoint_duration_stdev_seconds",
                                      "load_checkpoint_io_mean_GB_per_second",
                                      "load_checkpoint_io_stdev_GB_per_second"}
    assert f"read-only invocation: restoring the 2 checkpoints of {w.name}" in split["out"]
    # restored, so removed (checkpoint.keep=false): nothing of the write invocation is left (a try of it
    # that a busy machine disturbed, retried, kept its own checkpoints: another run's)
    assert not (split["cwd"] / "ck" / w.name).exists()
    assert [p.name for p in (split["cwd"] / "ck").iterdir()] == [
        b.name for b in (split["cwd"] / "results").iterdir() if b.name < w.name]


def test_the_checker_joins_the_two_invocations(split: dict[str, Any], tmp_path: Path) -> None:
    report = checked(split["h"], tree_of(split["h"], tmp_path / "tree", split["write"], split["read"]))
    by = {b["run_id"]: b for b in report["bundles"]}
    read_id = json.loads((split["read"] / "run.json").read_text())["run_id"]
    assert all(b["verdict"] == "open" for b in report["bundles"]), report["findings"]
    assert not [f for f in report["findings"] if f["rule"] in ("SPLIT-PAIR", "SPLIT-EVIDENCE")]
    assert "SPLIT-EVIDENCE" not in {n["rule"] for b in report["bundles"] for n in b["not_checked"]}
    gap = by[read_id]["metrics"]["split_gap_s"]
    assert 0 <= gap < 60


def test_a_read_invocation_without_its_write_invocation_fails_split_pair(split: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    report = checked(split["h"], tree_of(split["h"], tmp_path / "tree", split["read"]))
    [b] = report["bundles"]
    hits = [f for f in report["findings"] if f["rule"] == "SPLIT-PAIR"]
    assert b["verdict"] == "invalid" and len(hits) == 1
    assert hits[0]["message"].endswith("got not in the tree"), hits[0]["message"]
    assert split["write"].name in hits[0]["message"]


def test_a_write_invocation_other_than_the_one_restored_fails_split_pair(split: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    """The write invocation re-signed after an edit is another bundle under the same run id."""
    from support.forge import resign

    other = tmp_path / split["write"].name
    shutil.copytree(split["write"], other)
    with open(other / "run.log", "a") as fh:
        fh.write("a line added afterwards\n")
    resign(other, bundle.load_private_key(split["h"]["dir"] / "keys" / "org.pem"))
    report = checked(split["h"], tree_of(split["h"], tmp_path / "tree", other, split["read"]))
    hits = [f for f in report["findings"] if f["rule"] == "SPLIT-PAIR"]
    assert hits and "another bundle under that run id" in hits[0]["message"], report["findings"]


def test_a_read_invocation_presented_as_another_writes_fails_split_evidence(
        split: dict[str, Any], tmp_path: Path) -> None:
    """The vendor re-points a read invocation at another write invocation of the same system (an earlier,
    better one, whose own restores it never ran) and re-signs: SPLIT-PAIR holds (that invocation is in
    the tree, unchanged, compatible, ended before), but the read invocation's content proof opens only
    the commitment of the write invocation whose key it held."""
    from support.forge import edit_json, resign

    h, cwd = split["h"], tmp_path / "later"
    cwd.mkdir()
    later = write_invocation(h, cwd, writes=2)
    proc = run(h, cwd, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               f"checkpoint.restore_from={later}")
    assert proc.returncode == 0, proc.stderr
    forged = tmp_path / printed_bundle(proc).name
    shutil.copytree(printed_bundle(proc), forged)
    w = split["write"]
    wrun = json.loads((w / "run.json").read_text())
    edit_json(forged, "run.json", lambda r: r["restored_from"].update(
        run_id=wrun["run_id"], name=w.name, ended=wrun["ended"],
        statement_sha256=bundle.verify_bundle(w).statement_sha256))
    resign(forged, bundle.load_private_key(h["dir"] / "keys" / "org.pem"))
    report = checked(h, tree_of(h, tmp_path / "tree", w, forged))
    [b] = [b for b in report["bundles"] if b["path"].endswith(forged.name)]
    assert b["verdict"] == "invalid", report["findings"]
    assert {f["rule"] for f in b["findings"]} == {"SPLIT-EVIDENCE"}, [
        (f["rule"], f["message"]) for f in b["findings"]]
    [hit] = [f for f in b["findings"] if f["rule"] == "SPLIT-EVIDENCE"]
    assert hit["message"].startswith("run.json: ") and "does not" in hit["message"], hit["message"]
    # the honest split of the same invocations passes
    honest = checked(h, tree_of(h, tmp_path / "honest", later, printed_bundle(proc)))
    assert {b["verdict"] for b in honest["bundles"]} <= {"open", "disturbed"}, honest["findings"]
    assert not [f for f in honest["findings"] if f["rule"].startswith("SPLIT-")]


def test_a_read_invocation_moved_later_on_the_wall_clock_fails_split_evidence(
        split: dict[str, Any], tmp_path: Path) -> None:
    """The vendor widens the gap between the invocations (MLPerf asks for 30 s) by moving the read
    invocation's wall-clock times a minute later, run.json and records alike, and re-signs: on the same
    boot, its monotonic clock says it did not move."""
    from support.forge import edit_json, edit_records, resign, resummarize

    forged = tmp_path / split["read"].name
    shutil.copytree(split["read"], forged)

    def later(stamp: str) -> str:
        import datetime

        when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) + datetime.timedelta(seconds=60)
        return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    edit_records(forged, lambda rs: [r.update(wall_start=r["wall_start"] + 60) for r in rs] and None)
    resummarize(forged)
    edit_json(forged, "run.json", lambda r: r.update(started=later(r["started"]), ended=later(r["ended"])))
    resign(forged, bundle.load_private_key(split["h"]["dir"] / "keys" / "org.pem"))
    report = checked(split["h"], tree_of(split["h"], tmp_path / "tree", split["write"], forged))
    [b] = [b for b in report["bundles"] if b["path"].endswith(forged.name)]
    hits = [f for f in b["findings"] if f["rule"] == "SPLIT-EVIDENCE"]
    assert b["verdict"] == "invalid" and hits, b["findings"]
    message = hits[0]["message"]
    assert message.startswith("records.jsonl: ") and message.endswith("got 60.000 s apart"), hits
    assert "expected host vm: one wall-minus-monotonic clock offset in both invocations on boot " in message
    assert b["metrics"]["split_gap_s"] >= 60  # the gap it claims


def test_clock_offsets_are_compared_only_on_one_boot() -> None:
    from mlckpt.rules.checks.split import clock_problems

    w = {"h": {"boot_id": "b1", "offset_s": 1000.0, "first_s": 0.0, "last_s": 10.0}}
    moved = {"h": {"boot_id": "b1", "offset_s": 1030.0, "first_s": 40.0, "last_s": 50.0}}
    assert [got for _, got in clock_problems(w, moved, 0.02, 0.001)] == ["30.000 s apart"]
    rebooted = {"h": {**moved["h"], "boot_id": "b2"}}  # the operator rebooted between the invocations
    assert clock_problems(w, rebooted, 0.02, 0.001) == []
    slewed = {"h": {"boot_id": "b1", "offset_s": 1000.5, "first_s": 1010.0, "last_s": 1020.0}}
    assert clock_problems(w, slewed, 0.02, 0.001) == []  # 0.5 s over 1000 s: within NTP's slew
    assert clock_problems(w, {"other": moved["h"]}, 0.02, 0.001) == []  # no host in common


def test_a_write_invocation_without_a_commitment_is_refused_under_1_10_before_any_io(
        honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=1", "checkpoint.num_reads=0",
               "checkpoint.keep=true", "rules_version=1.9")
    assert proc.returncode == 0, proc.stderr
    w = printed_bundle(proc)
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               f"checkpoint.restore_from={w}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"mlckpt: error: checkpoint.restore_from: {w.name} cannot be restored here: it has no content "
        "commitment (rules 1.9), which rules 1.22 bind a restore to: restore it under rules_version=1.9, "
        "or write it again under 1.22")
    assert len(list((tmp_path / "ck" / w.name).rglob("*.pt"))) == 8  # untouched: 4 ranks × 2 files
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               f"checkpoint.restore_from={w}", "rules_version=1.9")
    assert proc.returncode == 0, proc.stderr  # under its own rules it restores


def test_a_read_only_invocation_of_a_missing_bundle_is_refused_before_any_io(
        honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               "checkpoint.restore_from=0123456789abcdef")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "mlckpt: error: checkpoint.restore_from: no bundle folder '0123456789abcdef' (nor a run of that "
        f"name or id under {tmp_path / 'results'})")
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").rglob("ckpt-*"))


def test_a_tampered_write_invocation_is_refused_before_any_io(honest_bundles: dict[str, Path],
                                                        tmp_path: Path) -> None:
    w = write_invocation(honest_bundles, tmp_path, writes=1)
    record = (w / "records.jsonl").read_text().replace('"bytes": ', '"bytes": 1', 1)
    (w / "records.jsonl").write_text(record)
    before = sorted((tmp_path / "ck").rglob("*"))
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               f"checkpoint.restore_from={w}")
    assert proc.returncode == 2
    assert "checkpoint.restore_from: " in proc.stderr and "is not an intact signed bundle" in proc.stderr
    assert "records.jsonl" in proc.stderr
    assert sorted((tmp_path / "ck").rglob("*")) == before  # nothing read, nothing removed
    assert "read 1/1" not in proc.stdout


def test_an_incompatible_read_invocation_is_refused_naming_the_difference(
        honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    w = write_invocation(honest_bundles, tmp_path, writes=1)
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               f"checkpoint.restore_from={w}", "scale=0.001")
    assert proc.returncode == 2
    assert "cannot be restored here: scale differs (0.0005 there, 0.001 here)" in proc.stderr
    assert len(list((tmp_path / "ck" / w.name).rglob("*.pt"))) == 8  # untouched


def test_a_page_changed_between_the_invocations_is_named(honest_bundles: dict[str, Path],
                                                        tmp_path: Path) -> None:
    w = write_invocation(honest_bundles, tmp_path, writes=1)
    victim = sorted((tmp_path / "ck" / w.name / "ckpt-0001").glob("*.pt"))[0]
    with open(victim, "r+b") as fh:
        fh.seek(4096 * 3 + 100)
        fh.write(b"\xff" * 8)
    proc = run(honest_bundles, tmp_path, "checkpoint.num_writes=0", "checkpoint.num_reads=1",
               f"checkpoint.restore_from={w}")
    assert proc.returncode == 1, proc.stderr  # a verification mismatch: the run failed
    assert victim.name in proc.stderr and "(page 3)" in proc.stderr and "payload corrupted" in proc.stderr
    assert "bundle: " not in proc.stdout


def test_num_writes_0_without_restore_from_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([str(BIN / "mlckpt"), "plan", *SMALL, "checkpoint.num_writes=0"],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "(num_writes=0 needs restore_from)" in proc.stderr


def test_the_leaderboard_shows_a_split_result_as_one_row(split: dict[str, Any], tmp_path: Path) -> None:
    import csv
    import io

    from checker.leaderboard import collect
    from checker.leaderboard.render import render_csv

    h = split["h"]
    trusted = bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml")
    board = collect(tree_of(h, tmp_path / "tree", split["write"], split["read"]), trusted)
    [table] = board.tables
    [entry] = table.entries
    w = json.loads((split["write"] / "summary.json").read_text())
    r = json.loads((split["read"] / "summary.json").read_text())
    assert entry.m("write_bandwidth_mean_gib_s") == w["write_bandwidth_mean_gib_s"]
    assert entry.m("read_bandwidth_mean_gib_s") == r["read_bandwidth_mean_gib_s"]
    assert (entry.num_writes, entry.num_reads, entry.verification) == (2, 3, "verified, cold")
    [row] = list(csv.DictReader(io.StringIO(render_csv(board))))
    assert row["Checkpointing - Logs"] == " + ".join(entry.invocations)
    assert split["write"].name in entry.invocations[0] and split["read"].name in entry.invocations[1]
    assert row["Checkpointing - Read B/W (GiB/s)"] == f"{r['read_bandwidth_mean_gib_s']:.2f}"
    # the write invocation alone is no row: a leaderboard row needs both invocations; the checker passes it
    # and says, in the same words, that it is unpaired
    from checker.split import LONE_WRITE

    alone_tree = tree_of(h, tmp_path / "alone", split["write"])
    alone = collect(alone_tree, trusted)
    assert alone.tables == () and [(x.verdict, x.reason) for x in alone.excluded] == [
        ("unpaired", LONE_WRITE)]
    proc = subprocess.run([str(BIN / "mlckpt-check"), str(alone_tree), "--trusted-keys",
                           str(h["dir"] / "trusted-keys.yaml")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("PASS ") and lines[1] == f"    note: {LONE_WRITE}"
    report = check_tree(alone_tree, trusted)
    assert report["bundles"][0]["metrics"]["unpaired_write_half"] is True
    # paired: no note
    both = check_tree(tree_of(h, tmp_path / "both", split["write"], split["read"]), trusted)
    assert [b["metrics"].get("unpaired_write_half") for b in both["bundles"]].count(True) == 0


def test_a_time_without_its_zone_gives_no_gap_never_a_checker_fault() -> None:
    """run.json's times are checked against 'date-time' only where jsonschema's format checkers are
    installed; a signed bundle with a zoneless time made pairing raise (naive minus aware)."""
    from checker.split import gap_s

    aware, naive = "2026-11-26T10:00:00+00:00", "2026-11-26T10:00:05"
    assert gap_s({"ended": aware}, {"started": naive}) is None
    assert gap_s({"ended": naive}, {"started": aware}) is None
    assert gap_s({"ended": aware}, {"started": "2026-11-26T10:00:05Z"}) == 5.0


def test_a_fault_while_joining_one_bundle_is_that_bundles_alone() -> None:
    """A defect met while joining one read invocation (here: its restored_from is not a mapping) becomes
    its INTERNAL finding; the write invocation beside it keeps its verdict, and the tree is still judged."""
    from checker.results import INTERNAL, BundleResult
    from checker.split import add_splits

    def result(name: str, run: dict[str, Any], config: dict[str, Any]) -> BundleResult:
        return BundleResult(f"open/o/results/s/llama3_8b/{name}", "o", "s", "llama3_8b", "open",
                            run_id=name, rules_version="1.9", verdict="open", integrity="ok", metrics={},
                            invocation={"run": run, "config": config})

    kept = {"checkpoint": {"num_reads": 0, "keep": True}}
    write = result("w", {"run_id": "w", "restored_from": None}, kept)
    read = result("r", {"run_id": "r", "restored_from": "not a mapping"}, {"checkpoint": {}})
    add_splits([write, read])
    assert read.verdict == "internal-error"
    assert [f["rule"] for f in read.findings] == [INTERNAL]
    assert read.findings[0]["message"].startswith("checker fault in stage split results: AttributeError")
    assert write.verdict == "open" and write.metrics == {"unpaired_write_half": True}
