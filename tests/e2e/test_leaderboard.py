"""Leaderboard and compare: golden outputs, stable result IDs, exclusion, class separation.

The trees here are *synthetic but fully valid* submission trees: :func:`make_bundle` builds each
bundle the way the runner does (``mlckpt.plan.config.setup`` for the resolved configuration and the
plan, per-rank records (records format 2) with the plan's bytes and the configured checkpoint
pipeline's stages, ``mlckpt.metrics.summarize``, the rule set's own verdict) with deterministic
timings and a fixed Ed25519 key per organisation (Ed25519 signatures are deterministic), so the
same call gives a byte-identical tree on every machine, and the checker passes it exactly as it
would a real one.  That is what makes golden files possible, and
closed full-scale results (105 GiB × 10 writes are not runnable in a test) testable.  One test
also builds the table from real runner bundles.

Regenerate the golden files after an intended change with ``MLCKPT_UPDATE_GOLDEN=1 pytest
tests/e2e/test_leaderboard.py`` and review the diff.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import paths
from support.synthetic import (
    GOLDEN_TREE,
    board_json,
    build_tree,
    lb_cli,
    make_bundle,
)

from checker import cli, leaderboard, tree_check
from checker.leaderboard import COLUMN, COLUMNS, fmt, render, result_id, rounded
from checker.leaderboard import command as leaderboard_command
from mlckpt import bundle
from mlckpt.units import GiB as GIB

GOLDEN = paths.GOLDEN
UPDATE = bool(os.environ.get("MLCKPT_UPDATE_GOLDEN"))

@pytest.fixture(scope="module")
def golden_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT = <tmp>/tree; pages go to <tmp>/pub/ (links are relative to it)."""
    return build_tree(tmp_path_factory.mktemp("golden") / "tree")


@pytest.fixture(scope="module")
def golden_board(golden_tree: Path) -> leaderboard.Leaderboard:
    trusted = bundle.TrustedKeys.load(golden_tree / "trusted-keys.yaml")
    return leaderboard.collect(golden_tree, trusted, jobs=2)


FORMATS = ("md", "csv", "json", "html")


@pytest.fixture(scope="module")
def outputs(golden_tree: Path) -> dict[str, str]:
    """The command's output for the golden tree in every format, written to <tmp>/pub/."""
    return {f: lb_cli(golden_tree, f, golden_tree.parent / "pub" / f"leaderboard.{f}") for f in FORMATS}


PLOTLY_STUB = "/* plotly.js (the installed plotly package's bundle) is inlined here */"


def stub_plotly(page: str) -> str:
    js = render.plotly_bundle()
    assert page.count(js) == 1, "the page inlines plotly.js exactly once"
    return page.replace(js, PLOTLY_STUB)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing {path}: run with MLCKPT_UPDATE_GOLDEN=1 and review the diff"
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} differs from the golden file (if intended: MLCKPT_UPDATE_GOLDEN=1, review the diff)")


# ----------------------------------------------------------------------------------------------
# Golden outputs and determinism


def test_the_golden_tree_passes_the_checker(golden_tree: Path) -> None:
    trusted = bundle.TrustedKeys.load(golden_tree / "trusted-keys.yaml")
    report = tree_check.check_tree(golden_tree, trusted, jobs=2)
    assert report["exit_status"] == 0, [f for f in report["findings"]]
    assert len(report["bundles"]) == len(GOLDEN_TREE)
    assert sum(b["path"].endswith(".tar.gz") for b in report["bundles"]) == 1


@pytest.mark.parametrize("fmt_name", FORMATS)
def test_golden_outputs(outputs: dict[str, str], fmt_name: str) -> None:
    text = outputs[fmt_name]
    check_golden(f"leaderboard.{fmt_name}", stub_plotly(text) if fmt_name == "html" else text)


def test_identical_trees_give_byte_identical_outputs(outputs: dict[str, str], tmp_path: Path) -> None:
    """A second tree built the same way elsewhere: every format byte-identical (links are relative,
    so the page sits at the same place relative to its tree)."""
    other = build_tree(tmp_path / "tree")
    board = leaderboard.collect(other, bundle.TrustedKeys.load(other / "trusted-keys.yaml"), jobs=2)
    base = tmp_path / "pub"
    links = {e.path: leaderboard_command._link(other / e.path, base, e.path.endswith(".tar.gz"))
             for t in board.tables for e in t.entries}
    for fmt_name in FORMATS:
        reports = (leaderboard_command.run_pages(board, other, base / f"leaderboard.{fmt_name}")
                   if fmt_name == "html" else None)
        assert render.render(board, fmt_name, links=links, reports=reports) == outputs[fmt_name], fmt_name
    # No clock, no randomness: nothing like a timestamp in any output.
    for text in outputs.values():
        assert not re.search(r"20\d\d-\d\d-\d\dT\d\d:\d\d", text.replace(render.plotly_bundle(), ""))


def test_stdout_output_equals_file_output(golden_tree: Path, outputs: dict[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["leaderboard", str(golden_tree), "--format", "csv", "--jobs", "1"]) == 0
    printed = capsys.readouterr()
    assert printed.out == outputs["csv"]
    assert printed.err == "leaderboard: 17 results in 10 classes\n"


# ----------------------------------------------------------------------------------------------
# Result IDs


def test_result_id_scheme_is_pinned() -> None:
    # Changing the derivation would renumber every published result: this value must never change.
    assert result_id("acme", "fast", "llama3_8b", "0123456789abcdef") == "ZWLLJ-WN2QP"
    assert re.fullmatch(r"[A-Z2-7]{5}-[A-Z2-7]{5}", result_id("a", "b", "c", "d"))
    assert result_id("acme", "fast", "llama3_8b", "1") != result_id("acme", "fast", "llama3_8b", "2")
    assert result_id("ab", "c", "w", "1") != result_id("a", "bc", "w", "1")  # separators matter


def test_ids_stay_stable_when_a_bundle_is_added(golden_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(golden_tree, root)
    before = {r["bundle"]: r["result_id"] for c in board_json(root, tmp_path)["classes"] for r in c["rows"]}
    # A faster result in an existing class (it ranks first) and one in a new class and organisation.
    new1 = make_bundle(root, org="zeta", system="z1", workload="llama3_8b", ranks=8, scale=0.01, seed=7,
                       write_gib_s=99.0, read_gib_s=99.0)
    new2 = make_bundle(root, org="newco", system="n1", workload="llama_7b_zero3", ranks=8, scale=0.001)
    doc = board_json(root, tmp_path)
    after = {r["bundle"]: r["result_id"] for c in doc["classes"] for r in c["rows"]}
    assert {k: after[k] for k in before} == before
    added = set(after) - set(before)
    assert added == {str(p.relative_to(root)) for p in (new1, new2)}
    assert len(set(after.values())) == len(after)
    scaled = next(c for c in doc["classes"] if c["id"] == "open-llama3_8b-x0_01")
    assert scaled["rows"][0]["bundle"] == str(new1.relative_to(root))
    for c in doc["classes"]:
        for r in c["rows"]:
            org, _, system = r["bundle"].split("/")[1:4]
            run = r["bundle"].rsplit("-", 1)[1].removesuffix(".tar.gz")
            assert r["result_id"] == result_id(org, system, c["workload"], run)


# ----------------------------------------------------------------------------------------------
# What is listed, in which class, in which order


def test_tampered_bundle_is_excluded(golden_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(golden_tree, root)
    clean = board_json(root, tmp_path)
    victim = next(r for c in clean["classes"] if c["division"] == "closed" for r in c["rows"])
    summary = root / victim["bundle"] / "summary.json"
    doc = json.loads(summary.read_text())
    doc["write_bandwidth_mean_gib_s"] *= 10  # a better number than was measured
    summary.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    # And a packed bundle with one byte flipped inside its records.
    archive = next(root.rglob("*.tar.gz"))
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tf:
        tf.extractall(unpacked, filter="data")
    rec = unpacked / "records.jsonl"
    rec.write_text(rec.read_text().replace('"bytes": ', '"bytes": 1', 1))
    archive.unlink()
    bundle.pack(unpacked, archive)

    doc = board_json(root, tmp_path)
    rows = {r["bundle"]: r for c in doc["classes"] for r in c["rows"]}
    archive_rel = str(archive.relative_to(root))
    assert victim["bundle"] not in rows and archive_rel not in rows
    assert victim["result_id"] not in {r["result_id"] for r in rows.values()}
    excluded = {x["path"]: x for x in doc["excluded"]}
    assert set(excluded) == {victim["bundle"], archive_rel}
    assert excluded[victim["bundle"]]["verdict"] == "invalid"
    assert "BUNDLE-FILES" in excluded[victim["bundle"]]["rules"]
    assert len(rows) == sum(len(c["rows"]) for c in clean["classes"]) - 2
    md = lb_cli(root, "md", tmp_path / "lb.md")
    assert victim["result_id"] not in md and f"`{victim['bundle']}`: invalid (" in md


def test_closed_full_scale_never_shares_a_table(golden_board: leaderboard.Leaderboard) -> None:
    keys = [t.key for t in golden_board.tables]
    assert len(keys) == len(set(keys))
    assert [k.id for k in keys] == [
        "closed-llama3_8b-full", "closed-llama3_70b-full", "open-llama3_8b-full",
        "open-llama3_8b-x0_0125", "open-llama3_8b-x0_01", "open-llama3_8b-x0_01-sync-tiers",
        "open-llama3_8b-x0_01-async", "open-llama3_8b-x0_01-async-tiers", "open-llama_7b-full",
        "open-llama_7b_zero3-full"]
    for t in golden_board.tables:
        for e in t.entries:
            key = (t.key.division, t.key.workload, t.key.scale == "scaled", t.key.pipeline, t.key.factor)
            assert (e.division, e.workload, e.scaled, e.pipeline, e.scale) == key
        assert set(t.frame["division"]) == {t.key.division}
        full = t.frame["mode"].str.endswith("full scale")
        assert full.all() if t.key.scale == "full" else not full.any()
        # The mode column names the checkpoint mode first, the same in every row of a class.
        assert t.frame["mode"].str.startswith(t.key.pipeline + ", ").all()
    closed8 = golden_board.tables[0]
    assert len(closed8.entries) == 2 and all(e.division == "closed" and not e.scaled for e in closed8.entries)


def test_closed_run_published_under_open_is_ranked_as_open(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_bundle(root, **{**GOLDEN_TREE[0], "tree_division": "open"})
    make_bundle(root, **GOLDEN_TREE[1])
    doc = board_json(root, tmp_path)
    assert [(c["id"], [r["division"] for r in c["rows"]]) for c in doc["classes"]] == [
        ("closed-llama3_8b-full", ["closed"]), ("open-llama3_8b-full", ["open"])]


def test_rows_are_ranked_by_write_bandwidth(golden_board: leaderboard.Leaderboard) -> None:
    for t in golden_board.tables:
        w = list(t.frame["write_gib_s"])
        assert w == sorted(w, reverse=True)
        assert [e.result_id for e in t.entries] == list(t.frame["result_id"])


def test_row_values_come_from_the_bundles(golden_tree: Path, golden_board: leaderboard.Leaderboard) -> None:
    for t in golden_board.tables:
        for rec in t.frame.to_dict("records"):
            folder = golden_tree / rec["bundle"]
            if not folder.is_dir():
                continue
            summary = json.loads((folder / "summary.json").read_text())
            run = json.loads((folder / "run.json").read_text())
            assert rec["write_gib_s"] == summary["write_bandwidth_mean_gib_s"]
            assert rec["write_slowest_rank_gib_s"] == summary["write_slowest_rank_bandwidth_mean_gib_s"]
            assert rec["ranks"] == run["ranks"] and rec["hosts"] == len(run["hosts"])
            straggler = [summary[k] for k in ("write_straggler_ratio_max", "read_straggler_ratio_max")
                         if k in summary]
            assert rec["straggler_ratio"] == max(straggler)
            assert rec["stall_s"] == summary["write_stall_mean_s"]
            assert rec["time_to_durable_s"] == summary["write_time_to_durable_mean_s"]
            if summary["tiers"] == ["durable"]:  # sync, one tier: training waits until durable
                assert summary["mode"] == "sync" and rec["stall_s"] == rec["time_to_durable_s"]
                assert rec["stall_s"] == summary["write_duration_mean_s"]
            else:
                assert rec["stall_s"] < rec["time_to_durable_s"]
                # the training the persist overlapped, as measured, never as configured
                measured = f", {summary['write_compute_mean_s']:.2f} s of training per checkpoint, "
                assert measured in rec["mode"], rec["mode"]
                configured = run["pipeline"]["compute_interval_s"]
                assert f", {configured:.2f} s of training" not in rec["mode"] or (
                    round(configured, 2) == round(summary["write_compute_mean_s"], 2))
            # Reads: the durable tier's restores only; none of them → missing, as with no reads.
            fast = sum(o["op"] == "read" and o["tier"] != "durable" for o in summary["ops"])
            if summary["num_reads"] > fast:
                assert rec["read_gib_s"] == summary["read_bandwidth_mean_gib_s"]
                n = summary["num_reads"]
                assert rec["verification"] == (f"verified, cold, {fast} of {n} from the fast tier" if fast
                                               else "verified, cold")
            else:
                assert math.isnan(rec["read_gib_s"]) and math.isnan(rec["read_duration_s"])
                assert "read_bandwidth_mean_gib_s" not in summary
                assert rec["verification"] == ("no reads" if not fast else "verified, all from the fast tier")
    modes = {rec["mode"] for t in golden_board.tables for rec in t.frame.to_dict("records")}
    assert modes == {
        "sync, full, direct, 4 MiB × 4 per rank, full scale",
        "sync, full, direct, 4 MiB × 4 per rank, scaled ×0.01",
        "sync, full, direct, 4 MiB × 4 per rank, scaled ×0.0125",
        "sync, stream, buffered, 4 MiB × 4 per rank, scaled ×0.01",
        "sync, full, direct, 4 MiB × 4 per rank, restore repopulate, full scale",
        "async, 0.02 s of training per checkpoint, full, direct, 4 MiB × 4 per rank, scaled ×0.01",
        "async, 0.20 s of training per checkpoint, full, direct, 4 MiB × 4 per rank, scaled ×0.01",
        "sync+tiers, 0.50 s of training per checkpoint, full, direct, 4 MiB × 4 per rank, scaled ×0.01",
        "async+tiers, 0.10 s of training per checkpoint, full, direct, 4 MiB × 4 per rank, scaled ×0.01"}
    acc = {rec["accelerator"] for t in golden_board.tables for rec in t.frame.to_dict("records")}
    assert {"h100", "h200", "<b>mi300x</b> | 8/node", None} == acc


def _bundle_of(golden_tree: Path, golden_board: leaderboard.Leaderboard, pipeline: str,
               org: str) -> tuple[dict[str, Any], Path]:
    """The table row and folder of the golden tree's one ``pipeline`` result of ``org``."""
    found = [(rec, golden_tree / rec["bundle"]) for t in golden_board.tables if t.key.pipeline == pipeline
             for rec in t.frame.to_dict("records") if rec["organisation"] == org]
    assert len(found) == 1, (pipeline, org)
    return found[0]


def test_stall_and_time_to_durable_recomputed_from_the_records(
        golden_tree: Path, golden_board: leaderboard.Leaderboard) -> None:
    """Stall and time to durable straight from records.jsonl (not through mlckpt.metrics): per
    write, the slowest rank's (staged - t0) and (t1 - t0); the columns are the means."""
    checked = set()
    for t in golden_board.tables:
        for rec in t.frame.to_dict("records"):
            folder = golden_tree / rec["bundle"]
            if not folder.is_dir():
                continue
            lines = [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]
            writes: dict[int, list[dict[str, Any]]] = {}
            for r in lines:
                if r["op"] == "write":
                    writes.setdefault(r["index"], []).append(r)
            stall = [max(r["staged_ns"] - r["t0_ns"] for r in rs) / 1e9 for rs in writes.values()]
            durable = [max(r["t1_ns"] - r["t0_ns"] for r in rs) / 1e9 for rs in writes.values()]
            assert rec["stall_s"] == pytest.approx(sum(stall) / len(stall), rel=1e-12)
            assert rec["time_to_durable_s"] == pytest.approx(sum(durable) / len(durable), rel=1e-12)
            checked.add(t.key.pipeline)
    assert checked == {"sync", "sync+tiers", "async", "async+tiers"}


def test_the_synthetic_pipelines_are_not_trivial(golden_tree: Path,
                                                 golden_board: leaderboard.Leaderboard) -> None:
    """What the golden tables show for the pipelined results, against the speeds they were built
    with (GOLDEN_TREE): the stall is the blocking stage (plus back-pressure), not the write."""
    def summary_of(folder: Path) -> dict[str, Any]:
        return json.loads((folder / "summary.json").read_text())

    rec, folder = _bundle_of(golden_tree, golden_board, "async", "acme")
    s = summary_of(folder)
    size = s["write_bytes_per_op"] / GIB
    # ~1 GiB copied at 150 GiB/s, persisted at 20 GiB/s behind 0.2 s of training: nothing exposed.
    assert rec["stall_s"] == pytest.approx(size / 150, rel=0.1)
    assert rec["write_gib_s"] == pytest.approx(20, rel=0.05)
    assert rec["time_to_durable_s"] == pytest.approx(size / 150 + size / 20, rel=0.1)
    assert s["write_overlap_efficiency"] == 1.0 and s["write_backpressure_ops"] == 0
    # zeta: the 8 GiB/s persist does not fit in 0.02 s of training: writes 2 and 3 wait for it.
    rec, folder = _bundle_of(golden_tree, golden_board, "async", "zeta")
    s = summary_of(folder)
    assert s["write_backpressure_ops"] == 2 and 0 < s["write_overlap_efficiency"] < 0.5
    assert rec["stall_s"] > 5 * s["write_stall_min_s"]
    # Sync with a fast tier: the stall is the fast-tier write (60 GiB/s), the drain runs at 12.
    rec, folder = _bundle_of(golden_tree, golden_board, "sync+tiers", "acme")
    s = summary_of(folder)
    assert s["tiers"] == ["fast", "durable"] and s["mode"] == "sync"
    assert rec["stall_s"] == pytest.approx(size / 60, rel=0.1)
    assert s["write_fast_bandwidth_mean_gib_s"] == pytest.approx(60, rel=0.05)
    assert rec["write_gib_s"] == pytest.approx(12, rel=0.05)
    # Its restores: one from each tier; the Read column is the durable one (14 GiB/s), not 70.
    assert rec["read_gib_s"] == s["read_bandwidth_mean_gib_s"] == pytest.approx(14, rel=0.05)
    assert s["read_fast_bandwidth_mean_gib_s"] == pytest.approx(70, rel=0.05)
    # Async with a tmpfs fast tier keeping both checkpoints: no restore from the durable tier.
    rec, folder = _bundle_of(golden_tree, golden_board, "async+tiers", "zeta")
    s = summary_of(folder)
    assert s["tiers"] == ["memory", "fast", "durable"] and s["read_fast_bandwidth_mean_gib_s"] > 80
    assert math.isnan(rec["read_gib_s"]) and rec["verification"] == "verified, all from the fast tier"


def test_non_sync_classes_carry_a_mode_badge(outputs: dict[str, str]) -> None:
    page, doc = outputs["html"], json.loads(outputs["json"])
    badges = re.findall(r'<span class="badge badge-pipeline" title="checkpoint mode">([^<]+)</span>', page)
    assert badges == ["sync+tiers", "async", "async+tiers"]
    assert [(c["pipeline"], c["title"]) for c in doc["classes"] if c["pipeline"] != "sync"] == [
        ("sync+tiers", "llama3_8b · scaled ×0.01 · sync+tiers"),
        ("async", "llama3_8b · scaled ×0.01 · async"),
        ("async+tiers", "llama3_8b · scaled ×0.01 · async+tiers")]
    assert [c["label"] for c in doc["columns"]][12:14] == ["Stall (s)", "Time to durable (s)"]


def test_every_format_shows_the_same_rounded_numbers(outputs: dict[str, str]) -> None:
    doc = json.loads(outputs["json"])
    csv_lines = outputs["csv"].splitlines()
    md, page = outputs["md"], outputs["html"]
    csv_rows = list(csv.DictReader(csv_lines))
    json_rows = [r for c in doc["classes"] for r in c["rows"]]
    assert len(csv_rows) == len(json_rows)
    for jr, cr in zip(json_rows, csv_rows, strict=True):
        for c in COLUMNS:
            # the CSV's Division is MLPerf's column, in its casing (mlckpt's own repeats no header)
            want = fmt(jr[c.key], c, missing="")
            assert cr[c.label] == (want.upper() if c.label == "Division" else want), c.key
            if c.kind == "num" and jr[c.key] is not None:
                assert f"| {fmt(jr[c.key], c)} |".replace(" ", "") in md.replace(" ", "")
                assert f">{fmt(jr[c.key], c)}</td>" in page
    assert [c["label"] for c in doc["columns"]][7:12] == [
        "Write (GiB/s)", "Write duration (s)", "First write (GiB/s)", "Read (GiB/s)", "Read duration (s)"]


def test_markup_in_submitted_text_is_escaped(outputs: dict[str, str]) -> None:
    page, md = outputs["html"], outputs["md"]
    assert "<b>mi300x</b>" not in page and "&lt;b&gt;mi300x&lt;/b&gt; | 8/node" in page
    assert "&lt;b&gt;mi300x&lt;/b&gt; \\| 8/node" in md  # no inline HTML; the pipe cannot break the table


def test_html_is_self_contained(golden_tree: Path, outputs: dict[str, str]) -> None:
    page = stub_plotly(outputs["html"])
    pub = golden_tree.parent / "pub"
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    hrefs = re.findall(r'<td class="text col-result_id" data-value="[^"]*"><a href="([^"]+)"', page)
    assert len(hrefs) == len(GOLDEN_TREE)
    for href in hrefs:
        assert not href.startswith("/") and (pub / href).exists(), href
    figs = json.loads(re.search(r'<script type="application/json" id="lb-figures">(.*?)</script>',
                                page, re.S).group(1))
    assert set(figs) == {f"chart-bars-{t}" for t in (
        "closed-llama3_8b-full", "closed-llama3_70b-full", "open-llama3_8b-full", "open-llama3_8b-x0_0125",
        "open-llama3_8b-x0_01", "open-llama3_8b-x0_01-sync-tiers", "open-llama3_8b-x0_01-async",
        "open-llama3_8b-x0_01-async-tiers", "open-llama_7b-full", "open-llama_7b_zero3-full")} | {
        "chart-scaling-open-llama3_8b-x0_01"}
    scaling = figs["chart-scaling-open-llama3_8b-x0_01"]["data"]
    assert [t["name"] for t in scaling] == ["fast · write", "fast · read", "z1 · write", "z1 · read"]
    assert scaling[0]["x"] == [4, 8, 16] and scaling[2]["x"] == [4, 16]


def test_empty_tree(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_bundle(root, org="acme", system="fast", workload="llama3_8b", ranks=4, scale=0.001)
    shutil.rmtree(root / "open" / "acme" / "results")
    for fmt_name in ("md", "csv", "json", "html"):
        text = lb_cli(root, fmt_name, tmp_path / f"e.{fmt_name}")
        assert text
    assert json.loads((tmp_path / "e.json").read_text())["classes"] == []


def test_leaderboard_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["leaderboard", str(tmp_path / "nope")]) == 2
    assert cli.run(["leaderboard", str(tmp_path)]) == 2  # no trusted keys
    assert cli.run(["leaderboard", str(tmp_path), "--format", "xlsx"]) == 2
    err = capsys.readouterr().err
    assert "no trusted keys" in err and "Traceback" not in err


def test_real_runner_bundles_from_the_sample_tree(tmp_path: Path) -> None:
    sample = paths.REPO / "submissions"
    if not (sample / "trusted-keys.yaml").is_file():
        pytest.skip("no sample submission tree")
    trusted = bundle.TrustedKeys.load(sample / "trusted-keys.yaml")
    report = tree_check.check_tree(sample, trusted)
    passing = {b["path"]: b for b in report["bundles"] if b["verdict"] in ("closed", "open")}
    board = leaderboard.collect(sample, trusted)
    rows = {e.path: e for t in board.tables for e in t.entries}
    assert set(rows) == set(passing)
    for path, b in passing.items():
        e = rows[path]
        assert e.m("write_bandwidth_mean_gib_s") == b["metrics"]["write_bandwidth_mean_gib_s"]
        assert e.m("read_duration_mean_s") == b["metrics"]["read_duration_mean_s"]
        assert (e.ranks, e.scaled, e.org) == (b["metrics"]["ranks"], b["metrics"]["scaled"], b["org"])
        if (sample / path).is_dir():
            summary = json.loads((sample / path / "summary.json").read_text())
            row = e.row()
            assert row["stall_s"] == summary["write_stall_mean_s"]
            assert row["time_to_durable_s"] == summary["write_time_to_durable_mean_s"]
            assert e.pipeline == summary["mode"] + ("+tiers" if "fast" in summary["tiers"] else "")
            assert e.class_key.pipeline == e.pipeline and e.mode.startswith(e.pipeline + ", ")
    # The sample tree holds a real async, tiered run: its own class, its restores split by tier.
    tiered = [e for e in rows.values() if e.pipeline == "async+tiers"]
    assert len(tiered) == 1 and tiered[0].fast_reads >= 1
    assert tiered[0].class_key.id.endswith("-async-tiers")


# ----------------------------------------------------------------------------------------------
# Formatting


def test_fmt_and_rounded_agree() -> None:
    col = COLUMN["write_gib_s"]
    for v in (0.005, 2.675, 1.0049999, 123456.789, 1e-9):
        assert fmt(rounded(v, col), col) == fmt(v, col)
    assert fmt(float("nan"), col) == "—" and rounded(float("nan"), col) is None
    assert fmt(None, COLUMN["accelerator"]) == "—" and fmt(8, COLUMN["ranks"]) == "8"


# ----------------------------------------------------------------------------------------------
# compare


@pytest.fixture(scope="module")
def compared(golden_tree: Path) -> tuple[Path, Path, Path]:
    closed = sorted((golden_tree / "closed" / "acme" / "results" / "fast" / "llama3_8b").iterdir())[0]
    opens = sorted((golden_tree / "open" / "acme" / "results" / "fast" / "llama3_8b").iterdir())
    open_ = next(p for p in opens if json.loads((p / "run.json").read_text())["scale"] == 1.0)
    archive = next(golden_tree.rglob("*.tar.gz"))
    return closed, open_, archive


def test_compare_json_ratios(compared: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b, _ = compared
    assert cli.run(["compare", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m = {x["key"]: x for x in doc["metrics"]}
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    for key in ("write_bandwidth_mean_gib_s", "write_bandwidth_median_gib_s", "write_bandwidth_min_gib_s",
                "write_bandwidth_max_gib_s", "read_duration_mean_s", "write_straggler_ratio_max",
                "read_slowest_rank_bandwidth_mean_gib_s"):
        assert m[key]["a"] == sa[key] and m[key]["b"] == sb[key]
        assert m[key]["ratio_b_over_a"] == pytest.approx(sb[key] / sa[key])
    assert m["ranks"]["a"] == 8 and m["num_writes"]["a"] == 10 and m["num_writes"]["b"] == 3
    assert m["checkpoint_gib"]["a"] == pytest.approx(sa["checkpoint_bytes"] / GIB)
    assert (m["division"]["a"], m["division"]["b"]) == ("closed", "open")
    assert m["mode"]["a"] == "sync, full, direct, 4 MiB × 4 per rank, full scale"
    assert (m["io_block_mib"]["a"], m["io_threads"]["a"]) == (4.0, 4)
    assert doc["same_class"] is False and doc["a"]["class"] == "closed-llama3_8b-full"
    assert doc["differences"] == [{"what": "division", "a": "closed", "b": "open"}]


def test_compare_text_and_archives(compared: tuple[Path, Path, Path],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    a, b, archive = compared
    assert cli.run(["compare", str(b), str(archive)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"write bandwidth mean \(GiB/s\)\s+\d+\.\d\d\s+\d+\.\d\d\s+\d+\.\d{3}", out)
    assert "note: A is in class open-llama3_8b-full, B in open-llama3_8b-x0_01" in out
    assert "warning: A and B differ in scale (full vs ×0.01), I/O settings (" in out
    assert "the ratios compare unlike runs" in out
    assert cli.run(["compare", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "note: A is in class" not in out and "warning:" not in out
    assert re.search(r"write bandwidth mean \(GiB/s\)\s+(\d+\.\d\d)\s+\1\s+1\.000", out)


def test_compare_refuses_what_is_not_a_bundle(compared: tuple[Path, Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    a = compared[0]
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for other in (text, empty, tmp_path / "missing"):
        assert cli.run(["compare", str(a), str(other)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mlckpt-check: error: B ") and str(other) in err


def test_compare_checks_integrity_of_both_first(compared: tuple[Path, Path, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    a, b, _ = compared
    bad = tmp_path / "bad"
    shutil.copytree(a, bad)
    summary = bad / "summary.json"
    summary.write_text(summary.read_text().replace('"num_reads": 10', '"num_reads": 11'))
    for args in ([str(bad), str(b)], [str(b), str(bad)]):
        assert cli.run(["compare", *args, "--json"]) == 3
        captured = capsys.readouterr()
        assert captured.out == ""  # nothing is compared before both verify
        assert captured.err.count("\n") == 1 and "integrity failure" in captured.err
    # Not a bundle wins over an integrity failure: both are checked to be bundles first.
    assert cli.run(["compare", str(bad), str(tmp_path / "missing")]) == 2


def _docs(*, pipeline: dict[str, Any], checkpoint: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Parsed bundle documents with hand-set numbers, for :func:`compare.compare` (pure)."""
    from checker.leaderboard import BundleDocs

    run = {"division": "open", "workload": "llama3_8b", "run_id": "0123456789abcdef", "ranks": 4,
           "scale": 0.01, "hosts": [{"host": "h1", "ranks": [0, 1, 2, 3]}], "system_name": "s1",
           "verdict": "open", "pipeline": pipeline}
    config = {"residency": "full", "io": {"direct": True}, "workload": {"canonical": True},
              "checkpoint": {"restore": "own", "fsync": True, **checkpoint}}
    base = {"num_writes": 2, "num_reads": 2, "checkpoint_bytes": 2 << 30, "restore_bytes": 2 << 30,
            "read_cold": True, "read_verified": True}
    return BundleDocs(run, config, {**base, **summary}, {}, "0" * 64, "1" * 64, "acme")


SYNC_DOCS = dict(
    pipeline={"mode": "sync", "compute_interval_s": 0.0, "fast": None, "fast_keep": 1, "fast_fs": {}},
    checkpoint={},
    summary={"mode": "sync", "tiers": ["durable"], "write_bandwidth_mean_gib_s": 4.0,
             "write_duration_mean_s": 0.5, "write_stall_mean_s": 0.5, "write_time_to_durable_mean_s": 0.5,
             "write_overlap_efficiency": None, "write_backpressure_ops": 0, "write_backpressure_total_s": 0.0,
             "write_compute_mean_s": 0.001, "read_bandwidth_mean_gib_s": 5.0,
             "ops": [{"op": "read", "tier": "durable"}, {"op": "read", "tier": "durable"}]})
ASYNC_TIERS_DOCS = dict(
    pipeline={"mode": "async", "compute_interval_s": 1.5, "fast": "/nvme", "fast_keep": 1,
              "fast_fs": {"h1": "ext4"}},
    checkpoint={"mode": "async", "compute_interval_s": 1.5, "tiers": {"fast": "/nvme", "fast_keep": 1}},
    summary={"mode": "async", "tiers": ["memory", "fast", "durable"], "write_bandwidth_mean_gib_s": 2.0,
             "write_duration_mean_s": 1.0, "write_stall_mean_s": 0.125, "write_time_to_durable_mean_s": 1.25,
             "write_overlap_efficiency": 0.8, "write_backpressure_ops": 1, "write_backpressure_total_s": 0.25,
             "write_compute_mean_s": 1.5, "write_memory_bandwidth_mean_gib_s": 64.0,
             "write_fast_bandwidth_mean_gib_s": 8.0, "write_fast_duration_mean_s": 0.25,
             "read_bandwidth_mean_gib_s": 4.0, "read_fast_bandwidth_mean_gib_s": 10.0,
             "read_fast_duration_mean_s": 0.2,
             "ops": [{"op": "read", "tier": "durable"}, {"op": "read", "tier": "fast"}]})


def test_compare_pipeline_rows_known_numbers() -> None:
    from checker import compare

    a, b = _docs(**SYNC_DOCS), _docs(**ASYNC_TIERS_DOCS)
    doc = compare.compare(("A", a), ("B", b))
    m = {x["key"]: (x["a"], x["b"], x["ratio_b_over_a"]) for x in doc["metrics"]}
    assert m["pipeline"] == ("sync", "async+tiers", None)
    assert m["tiers"] == ("durable", "memory → fast → durable", None)
    assert m["fast_fs"] == (None, "ext4", None)
    assert m["fast_reads"] == (None, 1, None)
    assert m["compute_interval_s"] == (0.0, 1.5, None)  # A is 0: no ratio
    assert m["write_stall_mean_s"] == (0.5, 0.125, 0.25)
    assert m["write_time_to_durable_mean_s"] == (0.5, 1.25, 2.5)
    assert m["write_overlap_efficiency"] == (None, 0.8, None)
    assert m["write_backpressure_ops"] == (0, 1, None)
    assert m["write_backpressure_total_s"] == (0.0, 0.25, None)
    assert m["write_compute_mean_s"] == (0.001, 1.5, 1500.0)
    assert m["write_memory_bandwidth_mean_gib_s"] == (None, 64.0, None)
    assert m["write_fast_bandwidth_mean_gib_s"] == (None, 8.0, None)
    assert m["write_fast_duration_mean_s"] == (None, 0.25, None)
    assert m["write_bandwidth_mean_gib_s"] == (4.0, 2.0, 0.5)  # the durable tier's persist
    assert m["read_bandwidth_mean_gib_s"] == (5.0, 4.0, 0.8)  # durable-tier restores only
    assert m["read_fast_bandwidth_mean_gib_s"] == (None, 10.0, None)
    assert m["read_fast_duration_mean_s"] == (None, 0.2, None)
    # Rows neither bundle has a value for are left out; the rest are always there.
    assert "read_mixed_bandwidth_mean_gib_s" not in m and "write_memory_bandwidth_min_gib_s" not in m
    assert doc["same_class"] is False
    assert doc["a"]["class"] == "open-llama3_8b-x0_01"
    assert doc["b"]["class"] == "open-llama3_8b-x0_01-async-tiers"
    both = compare.compare(("B", b), ("B2", b))
    m2 = {x["key"]: (x["a"], x["b"], x["ratio_b_over_a"]) for x in both["metrics"]}
    assert m2["write_overlap_efficiency"] == (0.8, 0.8, 1.0)
    assert m2["read_fast_bandwidth_mean_gib_s"] == (10.0, 10.0, 1.0)
    plain = {x["key"] for x in compare.compare(("A", a), ("A2", a))["metrics"]}
    assert {"write_stall_mean_s", "write_time_to_durable_mean_s", "pipeline", "tiers"} <= plain
    assert not plain & {"write_overlap_efficiency", "fast_fs", "fast_reads", "read_fast_bandwidth_mean_gib_s",
                        "write_memory_bandwidth_mean_gib_s", "write_fast_bandwidth_mean_gib_s"}
    text = compare.render_text(doc)
    assert re.search(r"^write stall mean \(s\)\s+0\.500\s+0\.125\s+0\.250$", text, re.M)
    assert re.search(r"^write time to durable mean \(s\)\s+0\.500\s+1\.250\s+2\.500$", text, re.M)
    assert re.search(r"^write overlap efficiency\s+—\s+0\.800\s+—$", text, re.M)
    assert re.search(r"^read \(fast tier\) bandwidth mean \(GiB/s\)\s+—\s+10\.00\s+—$", text, re.M)
    assert re.search(r"^write stages\s+durable\s+memory → fast → durable$", text, re.M)


def test_compare_shows_the_io_settings_latency_and_iops() -> None:
    """Two runs at 4 MiB × 4 and 1 MiB × 16: the I/O settings side by side and named as a
    difference, with each op's IOPS and request latency percentiles."""
    from checker import compare

    def with_io(block: int, threads: int, p50: float) -> Any:
        d = _docs(**SYNC_DOCS)
        d.config["io"] = {"direct": True, "block_size": block, "threads": threads}
        lat = {"count": 9, "p50": p50, "p90": 2 * p50, "p99": 3 * p50, "p99_9": 4 * p50, "max": 5 * p50}
        d.summary.update(write_iops_mean=1000.0, write_latency_ms=lat)
        return d

    doc = compare.compare(("A", with_io(4 << 20, 4, 2.0)), ("B", with_io(1 << 20, 16, 0.5)))
    m = {x["key"]: (x["a"], x["b"], x["ratio_b_over_a"]) for x in doc["metrics"]}
    assert m["io_mode"] == ("direct", "direct", None)
    assert m["io_block_mib"] == (4.0, 1.0, 0.25) and m["io_threads"] == (4, 16, 4.0)
    assert m["write_iops_mean"] == (1000.0, 1000.0, 1.0)
    assert m["write_latency_p50_ms"] == (2.0, 0.5, 0.25) and m["write_latency_p99_9_ms"] == (8.0, 2.0, 0.25)
    assert "read_latency_p50_ms" not in m  # neither side has read latencies
    assert doc["differences"] == [{"what": "I/O settings", "a": "direct, 4 MiB × 4 per rank",
                                   "b": "direct, 1 MiB × 16 per rank"}]
    text = compare.render_text(doc)
    assert re.search(r"^I/O requests in flight per rank\s+4\s+16\s+4\.000$", text, re.M)
    assert re.search(r"^write request latency p99\.9 \(ms\)\s+8\.000\s+2\.000\s+0\.250$", text, re.M)
    assert "differ in I/O settings" in text


def test_compare_pipelined_bundles(golden_tree: Path, golden_board: leaderboard.Leaderboard,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, a = _bundle_of(golden_tree, golden_board, "sync+tiers", "acme")
    _, b = _bundle_of(golden_tree, golden_board, "async+tiers", "zeta")
    assert cli.run(["compare", str(a), str(b), "--json"]) == 0
    m = {x["key"]: x for x in json.loads(capsys.readouterr().out)["metrics"]}
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    for key in ("write_stall_mean_s", "write_time_to_durable_max_s", "write_overlap_efficiency",
                "write_fast_bandwidth_mean_gib_s", "write_fast_duration_max_s",
                "read_fast_bandwidth_mean_gib_s", "read_fast_duration_median_s",
                "read_fast_straggler_ratio_max"):
        assert (m[key]["a"], m[key]["b"]) == (sa[key], sb[key]), key
        assert m[key]["ratio_b_over_a"] == pytest.approx(sb[key] / sa[key]), key
    # A's drain fits in its 0.5 s of training; B's does not (0.1 s): a ratio over 0 is none.
    assert m["write_backpressure_total_s"]["a"] == sa["write_backpressure_total_s"] == 0.0
    assert m["write_backpressure_total_s"]["b"] == sb["write_backpressure_total_s"] > 0
    assert m["write_backpressure_total_s"]["ratio_b_over_a"] is None
    # Only B has a memory stage; only A restored from the durable tier.
    assert m["write_memory_bandwidth_mean_gib_s"]["a"] is None
    assert m["write_memory_bandwidth_mean_gib_s"]["b"] == sb["write_memory_bandwidth_mean_gib_s"]
    assert m["read_bandwidth_mean_gib_s"]["a"] == sa["read_bandwidth_mean_gib_s"]
    assert m["read_bandwidth_mean_gib_s"]["b"] is None and "read_bandwidth_mean_gib_s" not in sb
    assert (m["fast_fs"]["a"], m["fast_fs"]["b"]) == ("xfs", "tmpfs")
    assert (m["fast_reads"]["a"], m["fast_reads"]["b"]) == (1, 2)


def test_pass_line_names_stall_and_time_to_durable_when_training_did_not_wait() -> None:
    from checker import report as rep

    def line(metrics: dict[str, Any]) -> str:
        b = {"path": "x", "verdict": "open", "findings": [], "metrics": metrics}
        summary = {"bundles": 1, "valid": 1, "invalid": 0, "internal_errors": 0, "findings": 0,
                   "integrity_failures": 0}
        text = rep.render_text({"bundles": [b], "tree_findings": [], "summary": summary})
        return text.splitlines()[0]

    bw = {"write_bandwidth_mean_gib_s": 2.0, "read_bandwidth_mean_gib_s": 4.5}
    assert line({**bw, "write_stall_mean_s": 0.0125, "write_time_to_durable_mean_s": 1.25}) == (
        "PASS x (open: write 2.00 GiB/s, read 4.50 GiB/s, stall 0.013 s, time to durable 1.250 s)")
    # Sync, one tier: the stall is the time to durable (training waits until durable).
    assert line({**bw, "write_stall_mean_s": 0.5, "write_time_to_durable_mean_s": 0.5}) == (
        "PASS x (open: write 2.00 GiB/s, read 4.50 GiB/s)")
    assert line(bw) == "PASS x (open: write 2.00 GiB/s, read 4.50 GiB/s)"
    # No durable restores (every one from a fast tier): no read number.
    assert line({"write_bandwidth_mean_gib_s": 2.0, "write_stall_mean_s": 0.25,
                 "write_time_to_durable_mean_s": 1.0}) == (
        "PASS x (open: write 2.00 GiB/s, stall 0.250 s, time to durable 1.000 s)")


def test_the_csv_leads_with_mlperfs_results_table(tmp_path: Path) -> None:
    """MLPerf Storage's columns first, in their order and spelling, blank where mlckpt has no data
    (never invented); mlckpt's own columns after them."""
    import csv
    import io

    from checker.leaderboard.systems import MLPERF_COLUMNS

    root = build_tree(tmp_path / "tree")
    rows = list(csv.reader(io.StringIO(lb_cli(root, "csv", tmp_path / "lb.csv"))))
    head = rows[0]
    assert tuple(head[:len(MLPERF_COLUMNS)]) == MLPERF_COLUMNS and len(set(head)) == len(head)
    assert head[:3] == ["Public ID", "Organization", "Division"] and head[len(MLPERF_COLUMNS)] == "Class"
    assert "Slowest rank write (GiB/s)" in head and "Verification" in head  # mlckpt's extras stay
    recs = [dict(zip(head, r, strict=True)) for r in rows[1:]]
    for rec in recs:
        blank = ("Public ID", "RU's", "Integrated Client Storage (TiB)", "Checkpointing - Code")
        assert [rec[k] for k in blank] == ["", "", "", ""]
        # the casing of MLPerf's final results schema
        assert rec["Benchmark Type"] == "checkpointing" and rec["Access Protocol"] == "file"
        assert rec["Division"] in ("OPEN", "CLOSED")
        assert rec["Checkpointing - # Client Nodes"] == rec["Hosts"]
        assert rec["Checkpointing - Write B/W (GiB/s)"] == rec["Write (GiB/s)"]
        assert rec["Checkpointing - Read Duration (secs)"] == rec["Read duration (s)"]
        assert rec["Checkpointing - Logs"] == rec["Bundle"]
    by_workload = {rec["Workload"]: rec for rec in recs}
    r8 = by_workload["llama3_8b"]
    mode, dp = r8["Checkpointing - Checkpoint Mode"], r8["Checkpointing - DP Instances"]
    r8 = next(rec for rec in recs if rec["Workload"] == "llama3_8b" and rec["Scale"] == "full")
    mode, dp = r8["Checkpointing - Checkpoint Mode"], r8["Checkpointing - DP Instances"]
    assert (r8["Model"], dp, mode) == ("8B", r8["Ranks"], "Full")  # TP 1 × PP 1: every rank a DP instance
    assert r8["Name"] == r8["System"]  # MLPerf's Name is the system, as the system folder names it
    scaled = [rec for rec in recs if rec["Scale"] != "full"]
    assert scaled and all(rec["Model"].endswith(f"(scaled ×{rec['Scale']})") for rec in scaled)


def test_compare_puts_a_dlio_result_beside_a_bundle_labelled_unverified(
        compared: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mlckpt-check compare A B where B is a DLIO / mlpstorage result folder (summary.json in
    DLIO's shape, mlpstorage's metadata): its figures as stated, nothing it does not state, and
    the side said to be unverified."""
    a = compared[0]
    dlio = tmp_path / "dlio-run"
    dlio.mkdir()
    metric = {"save_checkpoint_io_mean_GB_per_second": 20.0, "save_checkpoint_io_stdev_GB_per_second": 1.0,
              "save_checkpoint_duration_mean_seconds": 5.2, "save_checkpoint_duration_stdev_seconds": 0.1,
              "checkpoint_size_GB": 104.70}
    (dlio / "summary.json").write_text(json.dumps({
        "start": "2026-07-22T18:57:02.533707", "num_accelerators": 8, "num_hosts": 2, "hostname": "c1",
        "metric": metric, "epochs": 0, "end": "2026-07-22T18:59:25.491152"}))
    checkpoint = {"num_checkpoints_write": 10, "num_checkpoints_read": 0, "fsync": True}
    (dlio / "checkpointing_20260722_185605_metadata.json").write_text(json.dumps({
        "args": {"model": "llama3-8b"}, "num_processes": 8, "verification": "CLOSED",
        "parameters": {"checkpoint": checkpoint}}))
    assert cli.run(["compare", str(a), str(dlio), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compare_format"] == 6 and out["a"]["verified"] and not out["b"]["verified"]
    assert "UNVERIFIED" in out["b"]["source"] and out["b"]["keyid"] is None and out["same_class"] is False
    m = {row["key"]: row for row in out["metrics"]}
    assert m["workload"]["b"] == "llama3_8b" and m["division"]["b"] == "closed"  # mlpstorage's names, ours
    assert (m["ranks"]["b"], m["hosts"]["b"], m["num_writes"]["b"]) == (8, 2, 10)
    assert m["write_bandwidth_mean_gib_s"]["b"] == 20.0 and m["write_duration_mean_s"]["b"] == 5.2
    assert m["checkpoint_gib"]["b"] == pytest.approx(104.70)
    assert m["num_reads"]["b"] is None and m["read_bandwidth_mean_gib_s"]["b"] is None  # not stated
    assert m["write_slowest_rank_bandwidth_mean_gib_s"]["b"] is None  # never guessed
    assert m["mode"]["b"] is None and m["verification"]["b"] == "none (DLIO verifies no page)"
    assert cli.run(["compare", str(a), str(dlio)]) == 0
    text = capsys.readouterr().out
    assert f"B: {dlio} (DLIO / mlpstorage result folder, UNVERIFIED" in text
    assert "note: B is not an mlckpt bundle: nothing of it is signed or recomputed" in text
    bad = tmp_path / "not-a-result"
    bad.mkdir()
    (bad / "summary.json").write_text("{}")
    assert cli.run(["compare", str(a), str(bad)]) == 2
    assert "neither an mlckpt bundle nor a DLIO checkpointing result" in capsys.readouterr().err


def test_compare_joins_a_published_split_result_beside_a_bundle(
        compared: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """B: a published workload folder holding both invocations of a split result (a write invocation and
    a read invocation): one result, write figures from the one and read figures from the other."""
    wl = tmp_path / "llama3-8b"
    for ts, key, gib_s in (("20260722_185605", "save", 20.0), ("20260722_190012", "load", 31.5)):
        (wl / ts).mkdir(parents=True)
        metric = {"checkpoint_size_GB": 104.7045, f"{key}_checkpoint_io_mean_GB_per_second": gib_s,
                  f"{key}_checkpoint_duration_mean_seconds": 104.7045 / gib_s}
        (wl / ts / "summary.json").write_text(json.dumps(
            {"start": "2026-07-22T18:57:02", "num_accelerators": 8, "num_hosts": 2, "metric": metric}))
    assert cli.run(["compare", str(compared[0]), str(wl), "--json"]) == 0
    m = {row["key"]: row for row in json.loads(capsys.readouterr().out)["metrics"]}
    assert (m["write_bandwidth_mean_gib_s"]["b"], m["read_bandwidth_mean_gib_s"]["b"]) == (20.0, 31.5)
    assert m["read_bandwidth_mean_gib_s"]["ratio_b_over_a"] == pytest.approx(
        31.5 / m["read_bandwidth_mean_gib_s"]["a"])
    # the same folder published with one half (the write invocation): that result, as stated
    shutil.rmtree(wl / "20260722_190012")
    assert cli.run(["compare", str(compared[0]), str(wl), "--json"]) == 0
    m = {row["key"]: row for row in json.loads(capsys.readouterr().out)["metrics"]}
    assert (m["write_bandwidth_mean_gib_s"]["b"], m["read_bandwidth_mean_gib_s"]["b"]) == (20.0, None)


def test_a_gpu_source_run_has_a_class_of_its_own(golden_tree: Path,
                                                 golden_board: leaderboard.Leaderboard) -> None:
    """Its stall is a device copy, not a host memcpy: never ranked against host-memory runs."""
    from checker.leaderboard.model import entry_from_docs

    _, folder = _bundle_of(golden_tree, golden_board, "async", "acme")
    docs = {n: json.loads((folder / f"{n}.json").read_text()) for n in ("run", "summary", "system")}
    config = yaml.safe_load((folder / "config.yaml").read_text())
    host = entry_from_docs(str(folder), "acme", "fast", docs["run"], config, docs["summary"], docs["system"])
    config["state"] = {"source": "gpu", "gpu": {"device": None}}
    gpu = entry_from_docs(str(folder), "acme", "fast", docs["run"], config, docs["summary"], docs["system"])
    assert (host.pipeline, gpu.pipeline) == ("async", "async+gpu")
    assert host.class_key != gpu.class_key and gpu.mode.startswith("async+gpu, ") and ", full, " in gpu.mode


def test_object_storage_is_an_object_access_protocol(golden_tree: Path,
                                                      golden_board: leaderboard.Leaderboard) -> None:
    """MLPerf's Access Protocol column says what the run's storage block says: a run on S3 is not
    'file'."""
    from checker.leaderboard.model import entry_from_docs
    from checker.leaderboard.systems import mlperf_row

    _, folder = _bundle_of(golden_tree, golden_board, "async", "acme")
    docs = {n: json.loads((folder / f"{n}.json").read_text()) for n in ("run", "summary", "system")}
    config = yaml.safe_load((folder / "config.yaml").read_text())
    files = entry_from_docs(str(folder), "acme", "fast", docs["run"], config, docs["summary"], docs["system"])
    run = {**docs["run"], "storage": {"kind": "s3", "bucket": "b", "prefix": "p"}}
    s3 = entry_from_docs(str(folder), "acme", "fast", run, config, docs["summary"], docs["system"])
    rec = {k: 1.0 for k in ("write_gib_s", "write_duration_s", "read_gib_s", "read_duration_s")}
    assert mlperf_row(files, rec, lambda v, k: str(v))["Access Protocol"] == "file"
    assert mlperf_row(s3, rec, lambda v, k: str(v))["Access Protocol"] == "object"


def test_out_makes_its_folder_as_the_readme_example_does(golden_tree: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`mlckpt-check leaderboard … --out site/index.html` with no site/ yet (the README's example)."""
    out = tmp_path / "site" / "index.html"
    assert cli.run(["leaderboard", str(golden_tree), "--format", "html", "--out", str(out)]) == 0
    assert "<html" in out.read_text(encoding="utf-8").lower()
    capsys.readouterr()
    assert cli.run(["leaderboard", str(golden_tree), "--out", str(tmp_path / "site")]) == 2
    assert re.search(r"--out .*site: a folder; give the file to write \(e\.g\. .*index\.html\)",
                     capsys.readouterr().err)


def test_published_results_are_listed_unverified_below_the_checked_ones(
        golden_tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--published DIR: MLPerf's published results (folders written here in the published shape)
    beside the checked ones, each figure as published, marked UNVERIFIED, below every checked
    result of its class whatever its figures."""
    from support.published import invocation

    pub = tmp_path / "published"
    wl = pub / "closed" / "vendorx" / "results" / "sysx" / "checkpointing" / "llama3-8b"
    invocation(wl / "20260722_185605", write=45.5)  # above both checked results of its class
    invocation(wl / "20260722_190012", read=60.25, start="2026-07-22T19:00:12")
    open70 = pub / "open" / "vendorx" / "results" / "sysx" / "checkpointing" / "llama3-70b"
    invocation(open70 / "20260801_000000", write=150.0, read=200.0, model="llama3-70b", division="OPEN",
               processes=64)
    (pub / "notes").mkdir()
    (pub / "notes" / "summary.json").write_text("{}")  # not a result: counted as not read
    doc = json.loads(lb_cli(golden_tree, "json", tmp_path / "lb.json", "--published", str(pub)))
    assert doc["leaderboard_format"] == 7
    [c8] = [c for c in doc["classes"]
            if (c["division"], c["workload"], c["scale"]) == ("closed", "llama3_8b", "full")]
    rows = c8["rows"]
    assert [r["verified"] for r in rows] == [True, True, False]
    mine = rows[-1]
    assert (mine["write_gib_s"], mine["read_gib_s"]) == (45.5, 60.25)  # as published
    assert mine["write_gib_s"] > max(r["write_gib_s"] for r in rows[:-1])  # and still below them
    assert (mine["organisation"], mine["system"], mine["division"]) == ("vendorx", "sysx", "closed")
    assert mine["verification"].startswith("UNVERIFIED: a published DLIO / mlpstorage result")
    assert mine["bundle"] == str(wl.resolve()) and mine["stall_s"] is None  # never guessed
    [c70] = [c for c in doc["classes"] if (c["division"], c["workload"]) == ("open", "llama3_70b")]
    assert [(r["verified"], r["write_gib_s"], r["ranks"]) for r in c70["rows"]] == [(False, 150.0, 64)]
    assert all(r["verified"] for c in doc["classes"] for r in c["rows"]
               if not r["bundle"].startswith(str(pub.resolve())))
    note = capsys.readouterr().err
    assert note.startswith("leaderboard: 17 results in 11 classes; ")
    said = "; and 2 published elsewhere, UNVERIFIED (1 folder not read: `mlckpt-check import DIR` says why)"
    assert said in note
    md = lb_cli(golden_tree, "md", tmp_path / "lb.md", "--published", str(pub))
    assert md.count("| UNVERIFIED: a published DLIO / mlpstorage result") == 2
    assert ("17 results from 2 organisations that pass `mlckpt-check` (rules 1.1), in 11 classes. Beside "
            "them, 2 results published elsewhere (DLIO / mlpstorage), quoted UNVERIFIED") in md
    # what cannot be published beside checked results is refused in one line, exit 2
    capsys.readouterr()
    none = tmp_path / "none"
    for extra, want in ((["--published", str(none)], f"--published {none}: not a folder"),
                        (["--published", str(pub), "--witnessed-only"],
                         "a published DLIO / mlpstorage result has no witness")):
        assert cli.run(["leaderboard", str(golden_tree), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], err
