"""Per-request latency (mlckpt/latency.py): percentiles within the histogram's stated error of a
brute-force computation, exact merges, hostile histograms refused cheaply, and the summary's
figures; and one run's report made from them (mlckpt/report)."""

from __future__ import annotations

import base64
import csv
import io
import random
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.browser import chromium, missing

from mlckpt import latency, metrics
from mlckpt.report import model, text

GiB = 1 << 30


def brute(values: list[int], p: float) -> int:
    """The percentile as HdrHistogram defines it: the k-th smallest, k = ⌊p/100 · n + 0.5⌋ (≥ 1)."""
    s = sorted(values)
    return s[max(1, int(p / 100 * len(s) + 0.5)) - 1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1_000, 10**11), min_size=1, max_size=3000))
def test_every_percentile_is_within_the_histograms_error_of_the_exact_one(values: list[int]) -> None:
    h = latency.decode(latency.encode(values))  # type: ignore[arg-type]
    got = latency.percentiles_ms(h)
    assert got["count"] == len(values)
    for name, p in latency.PERCENTILES.items():
        true = brute(values, p)
        ns = round(got[name] * 1e6)  # the histogram's value, in ns
        assert true <= ns <= true * (1 + latency.RELATIVE_ERROR) + 1, (name, true, got[name])
    assert max(values) <= round(got["max"] * 1e6) <= max(values) * (1 + latency.RELATIVE_ERROR) + 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(1, 10**10), min_size=1, max_size=200), min_size=1, max_size=8))
def test_histograms_merge_exactly(parts: list[list[int]]) -> None:
    merged = latency.merged(latency.encode(p) for p in parts)  # type: ignore[misc]
    whole = latency.decode(latency.encode([v for p in parts for v in p]))  # type: ignore[arg-type]
    assert latency.percentiles_ms(merged) == latency.percentiles_ms(whole)
    assert latency.cdf_ms(merged) == latency.cdf_ms(whole)


def _library_merge(blocks: list[dict[str, Any]]) -> tuple[Any, latency.Seen]:
    """What merged() stands for: each block decoded by the library into a histogram of its own and
    added with HdrHistogram.add."""
    out, seen = latency.histogram(), {}
    for b in blocks:
        h = latency.decode(b)
        seen[id(b)] = latency.block_facts(h)
        out.add(h)
    return out, seen


def _raw_block(values: list[int]) -> dict[str, Any]:
    """A block as a hostile or odd runner could write it: any value the histogram takes, 0 and
    none included (the runner's own encode() clamps to 1 ns and writes no empty block)."""
    h = latency.histogram()
    for v in values:
        h.record_value(v)
    return {"count": len(values), "hist": h.encode().decode("ascii")}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, latency.HIGHEST_NS), max_size=60), min_size=1, max_size=6))
def test_merged_is_exactly_the_librarys_decode_and_add(parts: list[list[int]]) -> None:
    blocks = [_raw_block(p) for p in parts]
    ref, ref_seen = _library_merge(blocks)
    seen: latency.Seen = {}
    got = latency.merged(blocks, seen)
    assert list(got.counts) == list(ref.counts)
    assert (got.total_count, got.max_value, got.min_value) == (ref.total_count, ref.max_value, ref.min_value)
    assert (got.get_max_value(), got.get_min_value()) == (ref.get_max_value(), ref.get_min_value())
    assert seen == ref_seen
    if ref.total_count:
        assert latency.percentiles_ms(got) == latency.percentiles_ms(ref)


def test_merged_refuses_what_decode_refuses_with_the_same_words() -> None:
    good = latency.encode([5_000, 6_000])
    assert good is not None
    hostile = ({**good, "count": 3}, {"count": 1, "hist": "QUJD" * 4},
               {"count": 1, "hist": _blob(5, 1, 2**62)})
    for bad in hostile:
        with pytest.raises(ValueError) as one:
            latency.decode(bad)
        with pytest.raises(ValueError) as many:
            latency.merged([good, bad])
        assert str(one.value) == str(many.value)


def _blob(digits: int, lowest: int, highest: int, counts: bytes = b"\x02", inner: int = 0x1C849303) -> str:
    head = struct.pack(">IIIIQQd", inner | 0x10, len(counts), 0, digits, lowest, highest, 1.0)
    body = zlib.compress(head + counts)
    return base64.b64encode(struct.pack(">II", 0x1C849304 | 0x10, len(body)) + body).decode()


@pytest.mark.parametrize("block, says", [
    ({"count": 1, "hist": "not base64!"}, "not an HdrHistogram encoding"),
    ({"count": 1, "hist": "QUJD" * 4}, "not an HdrHistogram V2 compressed encoding"),
    ({"count": 1, "hist": "A" * (latency.MAX_HIST_CHARS + 4)}, "at most 65536 characters"),
    ({"count": 1, "hist": 7}, "at most 65536 characters"),
    # a histogram of a range that would make the library allocate gigabytes
    ({"count": 1, "hist": _blob(5, 1, 2**62)}, "with 5 digits, expected 1..3600000000000 ns with 2"),
    # counts under the wrapper's own cookie (the library raises HdrCookieException)
    ({"count": 1, "hist": _blob(2, 1, latency.HIGHEST_NS, inner=0x1C849304)},
     "not an HdrHistogram V2 encoding of counts"),
    # a compressed bomb: its counts inflate far past any genuine histogram's
    ({"count": 1, "hist": _blob(2, 1, latency.HIGHEST_NS, b"\0" * (16 << 20))},
     "larger than a histogram of this range holds"),
])
def test_a_hostile_histogram_is_refused_before_the_library_decodes_it(block: dict[str, Any],
                                                                     says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        latency.decode(block)


def test_a_histogram_whose_count_is_not_its_own_is_refused() -> None:
    block = latency.encode([5_000, 6_000, 7_000])
    assert block is not None and latency.decode(block).get_total_count() == 3
    with pytest.raises(ValueError, match=r"requests\.count 4 but the histogram holds 3 requests"):
        latency.decode({**block, "count": 4})
    assert latency.encode([]) is None


def record(op: str, index: int, rank: int, lat: list[int], dur_ns: int,
           **extra: Any) -> dict[str, Any]:
    t0 = index * 10**10 + rank * 1000
    r: dict[str, Any] = {"op": op, "index": index, "checkpoint": index, "rank": rank, "host": "h",
                         "t0_ns": t0,
                         "t1_ns": t0 + dur_ns, "bytes": 1 << 26, "files": 1, "fsync": op == "write",
                         "requests": latency.encode(lat), **extra}
    if op == "write":
        r.update(mode="sync", staged_ns=t0 + dur_ns, backpressure_ns=0, exposed_ns=0, compute_ns=0,
                 stages=[{"tier": "durable", "t0_ns": t0, "t1_ns": t0 + dur_ns, "bytes": 1 << 26}])
    else:
        r.update(tier="durable", resident_bytes=0, cached_check_bytes=1 << 26, verified_bytes=1 << 26,
                 mismatches=0)
    return r


def runs_records() -> list[dict[str, Any]]:
    rnd = random.Random(7)
    recs = []
    for op in ("write", "read"):
        for k in (1, 2):
            for rank in range(4):
                lat = [rnd.randint(10**5, 10**7) for _ in range(50)]
                dur = 10**8 * (rank + 1)
                phases = {"open": 10**6, "transfer": dur - 3 * 10**6}
                if op == "write":
                    phases.update(fsync=10**6, dir_fsync=10**6)
                recs.append(record(op, k, rank, lat, dur, phases_ns=phases))
    return recs


def test_the_summary_reports_every_requests_percentiles_iops_and_the_slowest_ranks_phases() -> None:
    recs = runs_records()
    s = metrics.summarize(recs, max_resident_fraction=0.01, records_format=7, summary_format=6)
    all_w = latency.merged(r["requests"] for r in recs if r["op"] == "write")
    assert s["write_latency_ms"] == latency.percentiles_ms(all_w) and s["write_latency_ms"]["count"] == 400
    assert s["write_iops_mean"] == pytest.approx(200 / 0.4)  # 4 ranks × 50 requests over the slowest 0.4 s
    assert s["write_phases"] == {"open": 0.001, "transfer": pytest.approx(0.397), "fsync": 0.001,
                                 "dir_fsync": 0.001}
    assert s["read_phases"] == {"open": 0.001, "transfer": pytest.approx(0.397)}
    older = metrics.summarize(recs, max_resident_fraction=0.01, records_format=6, summary_format=5)
    assert "write_latency_ms" not in older  # a rule set before 1.10 reports none
    recs[0].pop("requests")
    s = metrics.summarize(recs, max_resident_fraction=0.01, records_format=7, summary_format=6)
    assert "write_latency_ms" not in s and "read_latency_ms" in s  # what the records cannot give is absent


def test_the_report_tables_and_csv_come_from_the_records() -> None:
    recs = runs_records()
    summary = metrics.summarize(recs, max_resident_fraction=0.01, records_format=7, summary_format=6)
    run = {"name": "r", "workload": "llama3_8b", "ranks": 4, "verdict": "open", "findings": [],
           "division": "open", "scale": 0.01, "rules_version": "1.10"}
    rep = model.build(run, summary, {"hosts": [{"hostname": "h"}]}, recs)
    assert [(o["op"], o["index"]) for o in rep.ops] == [("write", 1), ("write", 2), ("read", 1), ("read", 2)]
    w1 = rep.ops[0]
    assert (w1["duration_s"], w1["slowest_rank"], w1["requests"]) == (0.4, 3, 200)
    assert w1["straggler_ratio"] == pytest.approx(0.4 / 0.25)  # the slowest over the median rank
    assert w1["bandwidth_gib_s"] == pytest.approx(4 * (1 << 26) / GiB / 0.4)
    assert w1["p99_ms"] == latency.percentiles_ms(latency.merged(
        r["requests"] for r in recs if (r["op"], r["index"]) == ("write", 1)))["p99"]
    assert len(rep.ranks) == 16 and {r["duration_s"] for r in rep.ranks if r["op"] == "read 2"} == {
        0.1, 0.2, 0.3, 0.4}
    rows = list(csv.DictReader(io.StringIO(text.csv_text(rep))))
    assert len(rows) == 4 and float(rows[2]["duration_s"]) == 0.4 and rows[2]["op"] == "read"
    assert float(rows[0]["fsync_s"]) == 0.001 and rows[2]["fsync_s"] == ""
    out = text.render(rep)
    assert out.startswith("r: verdict open\n") and "request latency (ms" in out
    p99 = f"{summary['write_latency_ms']['p99']:.4g}"
    assert re.search(rf"^write\s+400\s+\S+\s+\S+\s+{re.escape(p99)}\s", out, re.M), out


def test_the_report_names_the_io_settings_and_prints_no_e_notation() -> None:
    recs = runs_records()
    for r in recs:
        r["phases_ns"] = {**r.get("phases_ns", {}), "open": 47_263}  # 4.7263e-05 s
    summary = metrics.summarize(recs, max_resident_fraction=0.01, records_format=7, summary_format=6)
    run = {"name": "r", "workload": "llama3_8b", "ranks": 4, "verdict": "open", "findings": []}
    config = {"io": {"direct": False, "block_size": 1 << 20, "threads": 16}}
    rep = model.build(run, summary, {"hosts": []}, recs, config)
    assert dict(rep.facts)["I/O"] == "buffered, 1 MiB requests, 16 in flight per rank"
    assert "I/O" not in dict(model.build(run, summary, {"hosts": []}, recs).facts)  # no config: not guessed
    out = text.render(rep)
    assert "buffered, 1 MiB requests, 16 in flight per rank" in out
    assert not re.search(r"\de-\d", out), out
    assert " 0.0000473 " in out


def test_the_timeline_puts_each_op_on_its_hosts_clock_and_the_device_samples_beside_it() -> None:
    recs = runs_records()
    recs[0]["host_counters"] = {"samples": [[recs[0]["t0_ns"], 0, 0],
                                            [recs[0]["t0_ns"] + 10**8, 0, GiB // 10]]}
    segs = model.segments(recs)
    assert segs[0].start_s == 0 and segs[0].end_s == pytest.approx(0.4 + 3e-6)
    assert model.sampled(recs) == {"h": [(pytest.approx(0.1), pytest.approx(1.0))]}


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_the_page_draws_the_timeline_each_ranks_time_and_the_latency_cdf(tmp_path: Path) -> None:
    from mlckpt.report import page

    recs = runs_records()
    summary = metrics.summarize(recs, max_resident_fraction=0.01, records_format=7, summary_format=6)
    run = {"name": "r", "workload": "llama3_8b", "ranks": 4, "verdict": "open", "findings": [
        {"rule": "FOREIGN-IO", "severity": "warning", "message": "a <b>tenant</b>"}]}
    rep = model.build(run, summary, {"hosts": []}, recs)
    out = tmp_path / "report.html"
    out.write_text(page.render(rep))
    with chromium() as d:
        d.get(out.as_uri())
        drawn = d.execute_script("""
            const n = id => document.querySelectorAll('#' + id + ' .scatterlayer .trace, #' + id
                + ' .barlayer .trace, #' + id + ' g.trace.boxes').length;
            const data = id => document.getElementById(id).data;
            return {timeline: data('timeline'), ranks: data('ranks'), latency: data('latency'),
                    phases: data('phases'), traces: ['timeline', 'ranks', 'latency', 'phases'].map(n),
                    title: document.title, finding: document.querySelector('ul').innerText};""")
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        png = d.get_screenshot_as_png()
    assert not errors, errors
    assert drawn["traces"] == [1, 2, 2, 4]  # one host; writes and reads; two CDFs; four phases
    # the timeline: each op's bandwidth on the host, from the host's first op
    seg = rep.segments[0]
    assert drawn["timeline"][0]["x"][:2] == [seg.start_s, seg.end_s]
    assert drawn["timeline"][0]["y"][0] == pytest.approx(seg.gib_s)
    # each rank's duration, per op: the stragglers visible (rank 3 takes 4× rank 0)
    writes = drawn["ranks"][0]
    assert writes["x"][:4] == ["write 1"] * 4 and writes["y"][:4] == [0.1, 0.2, 0.3, 0.4]
    # the latency CDF: every request of every rank, ending at 1
    xs, ys = latency.cdf_ms(latency.merged(r["requests"] for r in recs if r["op"] == "write"))
    assert drawn["latency"][0]["x"] == xs and drawn["latency"][0]["y"] == ys and ys[-1] == 1
    assert drawn["phases"][1]["name"] == "transfer" and drawn["phases"][1]["y"][0] == pytest.approx(0.397)
    assert drawn["finding"] == "warning: [FOREIGN-IO] a <b>tenant</b>"  # escaped, shown as text
    assert len(png) > 50_000


def test_mlckpt_report_prints_writes_and_refuses_in_one_line(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    mlckpt = Path(sys.executable).parent / "mlckpt"
    empty = subprocess.run([str(mlckpt), "report", str(tmp_path)], capture_output=True, text=True,
                           check=False)
    assert empty.returncode == 2 and empty.stderr == (
        f"mlckpt: error: {tmp_path}: not a run's result folder (no run.json, summary.json, system.json, "
        "records.jsonl)\n")
    recs = runs_records()
    summary = metrics.summarize(recs, max_resident_fraction=0.01, records_format=7, summary_format=6)
    run = {"name": "r", "workload": "llama3_8b", "ranks": 4, "verdict": "open", "findings": []}
    for name, doc in (("run.json", run), ("summary.json", summary), ("system.json", {"hosts": []})):
        (tmp_path / name).write_text(json.dumps(doc))
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = subprocess.run([str(mlckpt), "report", str(tmp_path), "--html", str(tmp_path / "p.html"), "--csv",
                          str(tmp_path / "ops.csv")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("r: verdict open\n") and "signature  unsigned" in out.stdout
    assert f"wrote {tmp_path / 'p.html'}" in out.stdout and (tmp_path / "p.html").stat().st_size > 1_000_000
    assert (tmp_path / "ops.csv").read_text() == text.csv_text(model.build(run, summary, {"hosts": []}, recs))
    (tmp_path / "records.jsonl").write_text('{"op": "write"}\n')  # a record the report cannot use
    bad = subprocess.run([str(mlckpt), "report", str(tmp_path)], capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"mlckpt: error: {tmp_path}: its records do not make")
    assert len(bad.stderr.splitlines()) == 1


def test_an_op_without_a_positive_duration_gives_no_iops_and_no_fault() -> None:
    recs = runs_records()
    for r in recs:
        if (r["op"], r["index"]) == ("write", 1):
            r["t1_ns"] = r["t0_ns"]  # schema-valid; RESULT-TIMES names it
    s = latency.summary([(op, [r for r in recs if (r["op"], r["index"]) == (op, k)])
                         for op in ("write", "read") for k in (1, 2)])
    assert "write_iops_mean" not in s and "read_iops_mean" in s and "write_latency_ms" in s


def test_records_before_format_7_are_not_checked_for_requests_and_a_pass_says_nothing() -> None:
    from mlckpt.rules import load_rules
    from mlckpt.rules.checks.requests import request_evidence
    from mlckpt.rules.engine import Context, NotChecked
    from mlckpt.rules.rundata import RunData

    rs = load_rules("1.10")

    def judged(fmt: int) -> list[Any]:
        ctx = Context({}, None, (), run=RunData({"records_format": fmt}, {}, {}, runs_records(), {}))  # type: ignore[arg-type]
        return list(request_evidence(ctx, rs, rs.rule("RECORDS-REQUESTS")))

    [older] = judged(6)  # a 1.9 bundle judged by rules 1.10 (mlckpt-check --rules 1.10)
    assert isinstance(older, NotChecked) and "before format 7" in str(older.reason)
    assert judged(7) == []  # every histogram holds: no finding
