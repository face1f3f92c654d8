"""What changes the figure (rules 1.4: records format 4, summary format 4): the first
write apart from the later ones, CPU time per GiB moved, the huge-page share of each rank's state
buffer; recorded by the real runner, recomputed by the checker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.forge import edit_json, resign

from mlckpt import bundle, engine
from mlckpt.metrics import summarize
from mlckpt.units import GiB


def rec(op: str, index: int, rank: int, dur_ms: int, nbytes: int, cpu_ms: int, huge: int | None = None,
        state: int = 1 << 30) -> dict[str, Any]:
    r: dict[str, Any] = {"op": op, "index": index, "checkpoint": index, "rank": rank, "host": "h",
                         "t0_ns": 0, "t1_ns": dur_ms * 10**6, "bytes": nbytes, "files": 1,
                         "cpu_ns": cpu_ms * 10**6}
    if op == "write":
        r.update(mode="sync", staged_ns=r["t1_ns"], backpressure_ns=0, exposed_ns=0, compute_ns=0,
                 stages=[{"tier": "durable", "t0_ns": 0, "t1_ns": r["t1_ns"], "bytes": nbytes}])
    else:
        r.update(resident_bytes=0, cached_check_bytes=nbytes, verified_bytes=nbytes, mismatches=0,
                 tier="durable")
    if huge is not None:
        r.update(state_bytes=state, state_huge_bytes=huge)
    return r


def test_the_first_write_cpu_per_gib_and_huge_pages_are_summarised() -> None:
    g = GiB
    recs = [rec("write", 1, 0, 2000, g, 500, huge=g), rec("write", 1, 1, 1000, g, 300, huge=g // 4),
            rec("write", 2, 0, 1000, g, 400, huge=g), rec("write", 2, 1, 500, g, 200, huge=g),
            rec("write", 3, 0, 500, g, 100, huge=g), rec("write", 3, 1, 500, g, 100, huge=g),
            rec("read", 1, 0, 250, g, 50), rec("read", 1, 1, 500, g, 150)]
    s = summarize(recs, max_resident_fraction=0.01, records_format=4, summary_format=4)
    assert s["write_first_duration_s"] == 2.0 and s["write_first_bandwidth_gib_s"] == 1.0  # 2 GiB / 2 s
    assert s["write_steady_bandwidth_mean_gib_s"] == pytest.approx((2.0 + 4.0) / 2)  # 2/1 s, 2/0.5 s
    assert s["write_cpu_s_per_gib"] == pytest.approx(1.6 / 6) and s["read_cpu_s_per_gib"] == 0.1
    assert s["state_hugepage_fraction_min"] == 0.25  # a rank's 4 KiB pages are not averaged away
    one = summarize(recs[:2], max_resident_fraction=0.01, records_format=4, summary_format=4)
    assert "write_steady_bandwidth_mean_gib_s" not in one
    for fmt in ((3, 4), (4, 3)):  # older records, or an older summary format: no such keys
        old = summarize(recs, max_resident_fraction=0.01, records_format=fmt[0], summary_format=fmt[1])
        assert not {k for k in old if "first" in k or "cpu" in k or "hugepage" in k}


def test_cpu_per_gib_is_absent_when_a_record_lacks_it_and_the_share_capped() -> None:
    recs = [rec("write", 1, 0, 1000, GiB, 100, huge=GiB * 2), rec("write", 1, 1, 1000, GiB, 100)]
    del recs[1]["cpu_ns"]
    s = summarize(recs, max_resident_fraction=0.01, records_format=4, summary_format=4)
    assert "write_cpu_s_per_gib" not in s and s["state_hugepage_fraction_min"] == 1.0


def test_huge_bytes_reads_this_process_s_smaps(tmp_path: Path) -> None:
    buf = engine.alloc(8 << 20)
    got = engine.huge_bytes(buf)
    assert got is not None and 0 <= got <= buf.nbytes
    fake = tmp_path / "smaps"
    lo = buf.ctypes.data
    fake.write_text(f"{lo - 4096:x}-{lo + (4 << 20):x} rw-p 00000000 00:00 0\nAnonHugePages:    6144 kB\n"
                    f"{lo + (4 << 20):x}-{lo + (64 << 20):x} rw-p 00000000 00:00 0\nAnonHugePages:  2048 kB\n"
                    "7fff0000-7fff1000 rw-p 00000000 00:00 0 [stack]\nAnonHugePages:  2048 kB\n")
    # capped at the overlap (4 MiB of the first mapping), the second counted, the stack not
    assert engine.huge_bytes(buf, str(fake)) == (4 << 20) + (2 << 20)
    assert engine.huge_bytes(buf, str(tmp_path / "missing")) is None


def test_a_real_run_records_them_and_the_checker_recomputes_them(honest_bundles: dict[str, Path],
                                                                tmp_path: Path) -> None:
    folder = honest_bundles["llama3_8b"]
    recs = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    assert all(r["cpu_ns"] > 0 and 0 <= r["state_huge_bytes"] <= r["state_bytes"] > 0 for r in recs)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["summary_format"] == 12 and summary["write_first_bandwidth_gib_s"] > 0
    assert "write_steady_bandwidth_mean_gib_s" not in summary  # one write
    assert summary["write_cpu_s_per_gib"] > 0 and summary["read_cpu_s_per_gib"] > 0
    # a first write claimed faster than the records say fails the recomputation
    from support.trees import check, honest_tree

    root = honest_tree(tmp_path / "t", honest_bundles, pack_7b=False)
    work = root / "open" / "example-org" / "results" / "laptop-ext4" / "llama3_8b" / folder.name
    edit_json(work, "summary.json", lambda s: s.update(write_first_bandwidth_gib_s=99.0))
    resign(work, bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem"))
    report = check(root, honest_bundles)
    [b] = [b for b in report["bundles"] if b["path"].endswith(folder.name)]
    msgs = [f["message"] for f in b["findings"] if f["rule"] == "METRICS-RECOMPUTE"]
    assert msgs and "summary.write_first_bandwidth_gib_s" in msgs[0]
    shutil.rmtree(root)


# A warning (the run stays valid), so not one of test_checker's NEGATIVE_CASES (they count the
# verdicts they break): the rule ID heads a row here for the rule-coverage test.
NEGATIVE = [("STATE-HUGEPAGES", 0)]


@pytest.mark.parametrize(("rule", "huge"), NEGATIVE)
def test_a_state_on_small_pages_is_a_warning(honest_bundles: dict[str, Path], tmp_path: Path, rule: str,
                                             huge: int) -> None:
    from support.forge import edit_records, resummarize
    from support.trees import check, honest_tree

    root = honest_tree(tmp_path / "t", honest_bundles, pack_7b=False)
    name = honest_bundles["llama3_8b"].name
    work = root / "open" / "example-org" / "results" / "laptop-ext4" / "llama3_8b" / name
    edit_records(work, lambda rs: [r.update(state_huge_bytes=huge) for r in rs if "state_bytes" in r]
                 and None)
    resummarize(work)
    resign(work, bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem"))
    [b] = [b for b in check(root, honest_bundles)["bundles"] if b["path"].endswith(work.name)]
    assert [(f["rule"], f["severity"]) for f in b["findings"]] == [(rule, "warning")]
    assert b["findings"][0]["message"].endswith(
        "expected at least 50% of every rank's state on huge pages, got 0% on one rank")
    assert b["verdict"] == "open"  # a warning changes nothing
