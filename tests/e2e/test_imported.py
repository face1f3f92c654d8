"""MLPerf Storage's published results, read as they are published (folders written here in the
published shape, not copies): a timestamp folder, a workload folder holding both invocations of a split
result, a system's and a submitter's tree, mlpstorage metadata of a 200-host run.  Every figure is
quoted as published and every row is labelled unverified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.published import invocation

from checker import imported
from mlckpt.errors import UsageError

BIN = Path(sys.executable).parent
def test_a_timestamp_folder_reads_as_published(tmp_path: Path) -> None:
    run = invocation(tmp_path / "20260722_185605", write=20.0, read=30.0)
    docs = imported.load_foreign(run, "B")
    s = docs.summary
    assert s["write_bandwidth_mean_gib_s"] == 20.0 and s["read_bandwidth_mean_gib_s"] == 30.0
    assert docs.run["workload"] == "llama3_8b" and docs.run["division"] == "closed" and docs.keyid == ""


def test_a_workload_folder_with_both_invocations_is_one_result(tmp_path: Path) -> None:
    wl = tmp_path / "llama3-8b"
    invocation(wl / "20260722_185605", write=20.0)
    invocation(wl / "20260722_190012", read=31.5, start="2026-07-22T19:00:12")
    assert imported.is_foreign(wl)
    docs = imported.load_foreign(wl, "B")
    s = docs.summary
    assert (s["write_bandwidth_mean_gib_s"], s["read_bandwidth_mean_gib_s"]) == (20.0, 31.5)
    assert (s["num_writes"], s["num_reads"]) == (10, 10) and s["restore_bytes"] == s["checkpoint_bytes"]
    # two writes side by side are no split result
    two = tmp_path / "two"
    invocation(two / "a", write=1.0)
    invocation(two / "b", write=2.0)
    with pytest.raises(UsageError, match=r"not one result .* `mlckpt-check import` lists what is there"):
        imported.load_foreign(two, "B")


def test_a_workload_folder_with_one_invocation_is_that_result(tmp_path: Path) -> None:
    """A published workload folder holding one invocation (a write-only run) reads as it, as the
    same folder with both invocations does (``mlckpt-check compare`` beside a bundle:
    tests/e2e/test_leaderboard.py)."""
    wl = tmp_path / "one" / "llama3-8b"
    invocation(wl / "20260722_185605", write=20.0)
    assert imported.is_foreign(wl)
    docs = imported.load_foreign(wl, "B")
    assert docs.summary["write_bandwidth_mean_gib_s"] == 20.0
    assert "read_bandwidth_mean_gib_s" not in docs.summary
    assert not imported.is_foreign(tmp_path / "one" / "llama3-8b" / "20260722_185605" / "none")


def test_metadata_of_200_hosts_reads(tmp_path: Path) -> None:
    run = invocation(tmp_path / "20260801_000000", write=800.0, hosts=200, processes=1600,
                     metadata_hosts=200)
    meta = next(run.glob("*_metadata.json"))
    assert meta.stat().st_size > 8_000_000  # about 43 KB per host, as published; 8 × the old bound
    docs = imported.load_foreign(run, "B")
    assert docs.run["ranks"] == 1600 and len(docs.run["hosts"]) == 200


def test_import_lists_every_result_of_a_submitters_tree_and_what_it_could_not_read(tmp_path: Path) -> None:
    sysdir = tmp_path / "closed" / "Acme" / "results" / "fast" / "checkpointing"
    invocation(sysdir / "llama3-8b" / "20260722_185605", write=20.0)
    invocation(sysdir / "llama3-8b" / "20260722_190012", read=31.5)
    invocation(sysdir / "llama3-70b" / "20260723_101010", write=140.0, read=190.0, model="llama3-70b",
               processes=64, hosts=8)
    broken = sysdir / "llama3-405b" / "20260724_000000"
    broken.mkdir(parents=True)
    (broken / "summary.json").write_text('{"metric": {}}')
    (tmp_path / "closed" / "Acme" / "systems").mkdir(parents=True)
    for level in (tmp_path, tmp_path / "closed" / "Acme", sysdir, sysdir / "llama3-8b"):
        rows, problems = imported.import_rows(level)
        assert rows, level
    rows, problems = imported.import_rows(tmp_path)
    assert [(Path(r["result"]).name, r["invocations"], r["write_gib_s"], r["read_gib_s"]) for r in rows] == [
        ("20260723_101010", 1, 140.0, 190.0), ("llama3-8b", 2, 20.0, 31.5)]
    assert [(Path(f).name, "checkpoint_size_GB" in why) for f, why in problems] == [("20260724_000000", True)]
    proc = subprocess.run([str(BIN / "mlckpt-check"), "import", str(tmp_path)], text=True,
                          capture_output=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "result (UNVERIFIED)" in proc.stdout and "not read: " in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("2 results read, 1 not read, under ")
    doc = json.loads(subprocess.run([str(BIN / "mlckpt-check"), "import", str(tmp_path), "--json"], text=True,
                                    capture_output=True, check=True, timeout=120).stdout)
    assert len(doc["results"]) == 2 and doc["not_read"][0]["folder"].endswith("20260724_000000")
    empty = tmp_path / "nothing"
    empty.mkdir()
    none = subprocess.run([str(BIN / "mlckpt-check"), "import", str(empty)], text=True, capture_output=True,
                          check=False, timeout=120)
    assert none.returncode == 1 and "0 results read" in none.stdout
