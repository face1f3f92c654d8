"""Leaderboard and compare: golden outputs, stable result IDs, exclusion, class separation.

The trees here are *synthetic but fully valid* submission trees: :func:`make_bundle` builds each
bundle the way the runner does (``mlckpt.config.setup`` for the resolved configuration and the
plan, per-rank records with the plan's bytes, ``mlckpt.metrics.summarize``, the rule set's own
verdict) with deterministic timings and a fixed Ed25519 key per organisation (Ed25519 signatures
are deterministic), so the same call gives a byte-identical tree on every machine, and the
checker passes it exactly as it would a real one.  That is what makes golden files possible, and
closed full-scale results (105 GiB × 10 writes are not runnable in a test) testable.  One test
also builds the table from real runner bundles.

Regenerate the golden files after an intended change with ``MLCKPT_UPDATE_GOLDEN=1 pytest
tests/test_leaderboard.py`` and review the diff.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import random
import re
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from checker import cli, leaderboard, render
from checker.leaderboard import COLUMN, COLUMNS, fmt, result_id, rounded
from mlckpt import __version__, bundle
from mlckpt.config import setup
from mlckpt.metrics import GIB, dlio_compat, summarize
from mlckpt.result_checks import DATA_SCHEME, RunData
from mlckpt.rules import HostSpec, rank_shift, verdict

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("MLCKPT_UPDATE_GOLDEN"))

# ----------------------------------------------------------------------------------------------
# Synthetic, valid, deterministic bundles


def org_key(org: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"mlckpt-test-key:{org}".encode()).digest())


def system_description(system: str, org: str, *, accelerator: str | None = None,
                       clients: int = 1) -> dict[str, Any]:
    """A valid vendor system description (the tree's systems/<system>.yaml and the bundle's copy)."""
    clients_block: dict[str, Any] = {"count": clients, "model": "test client", "memory_gib": 2048}
    if accelerator:
        clients_block["accelerator"] = accelerator
    return {
        "description_format": 1, "system_name": system, "submitter": org.title(),
        "availability": "available", "description": f"synthetic test system {system}",
        "storage": {"product": f"{system} storage", "type": "parallel-filesystem",
                    "usable_capacity_tib": 100, "max_write_gib_s": 1000, "max_read_gib_s": 1000},
        "clients": clients_block, "network": {"type": "test fabric"},
    }


def _host_facts(name: str) -> dict[str, Any]:
    return {"hostname": name, "cpu_cores": 64, "cpu_model": "Test CPU",
            "memory_total_bytes": 4 << 40, "memory_available_bytes": (4 << 40) - (1 << 30),
            "kernel": "6.1.0-test", "os": "Linux-test", "target_path": "/mnt/test/ckpt",
            "filesystem": {"fs_type": "testfs", "mount_point": "/mnt/test", "source": "test:/",
                           "mount_options": "rw"},
            "mpi_library": "MPICH test", "python": "3.11.0",
            "packages": {"mlckpt": __version__}}


def make_bundle(root: Path, *, org: str, system: str, workload: str, division: str = "open",
                ranks: int = 4, hosts: int = 1, scale: float = 1.0, writes: int = 2, reads: int = 2,
                write_gib_s: float = 10.0, read_gib_s: float = 12.0, straggle: float = 1.2,
                seed: int = 0, accelerator: str | None = None, desc_accelerator: str | None = None,
                extra: Sequence[str] = (), started: str = "2026-01-02T03:04:05.000Z",
                run_id: str | None = None, pack: bool = False, tree_division: str | None = None) -> Path:
    """Write one signed bundle into ``root`` (tree layout, under ``tree_division``/ if given, else
    its own division) and return its folder (or archive, with ``pack``)."""
    overrides = [f"workload={workload}", f"division={division}", f"ranks={ranks}",
                 f"checkpoint.num_writes={writes}", f"checkpoint.num_reads={reads}"]
    if scale != 1.0:
        overrides.append(f"scale={scale}")
    if accelerator:
        overrides.append(f"accelerator={accelerator}")
    overrides += [*extra, f"system={system}.yaml"]
    s = setup(overrides)
    cfg = s.config
    rng = random.Random(f"{division}/{org}/{system}/{workload}/{ranks}/{scale}/{seed}")
    run_id = run_id or f"{rng.getrandbits(64):016x}"
    stamp = started.replace("-", "").replace(":", "")[:15] + "Z"
    name = f"{stamp}-{workload}-{ranks}r-{run_id}"
    per_host = ranks // hosts
    specs = tuple(HostSpec(f"{system}-n{h:02d}", tuple(range(h * per_host, (h + 1) * per_host)),
                           (4 << 40) - (1 << 30)) for h in range(hosts))
    host_of = {r: h.name for h in specs for r in h.ranks}
    ctx = s.context(specs, complete=True)
    shift = rank_shift(ctx)
    plan = s.plan
    io_cfg = cfg["io"]
    records: list[dict[str, Any]] = []
    t = 1_000_000_000_000 + rng.randrange(10**9)
    wall = 1_800_000_000.0

    def op(kind: str, index: int, ckpt: int, per_rank: list[tuple[int, int]], gib_s: float) -> None:
        nonlocal t, wall
        total = sum(b for b, _ in per_rank)
        dur = total / (gib_s * GIB) * rng.uniform(0.95, 1.05)
        slow = rng.randrange(ranks)
        end = t
        for r, (nbytes, nfiles) in enumerate(per_rank):
            f = 1.0 if r == slow else rng.uniform(1 / straggle, 1 / straggle + (1 - 1 / straggle) * 0.5)
            t0 = t + rng.randrange(20_000)
            t1 = t0 + max(1, int(dur * f * 1e9))
            end = max(end, t1)
            rec: dict[str, Any] = {"op": kind, "index": index, "checkpoint": ckpt, "rank": r,
                                   "host": host_of[r], "t0_ns": t0, "t1_ns": t1,
                                   "wall_start": round(wall, 6), "bytes": nbytes, "files": nfiles,
                                   "fsync": kind == "write", "direct": io_cfg["direct"],
                                   "dontcache": io_cfg["dontcache"]}
            if kind == "read":
                rec.update(resident_bytes=0, cached_check_bytes=nbytes, verified_bytes=nbytes, mismatches=0)
            records.append(rec)
        wall += (end - t) / 1e9 + 1.0
        t = end + 1_000_000_000

    restore = str(cfg["checkpoint"]["restore"])
    w = [(sum(f.bytes for f in rp.files), len(rp.files)) for rp in plan.rank_plans]
    rd = []
    for r in range(ranks):
        files = [x.file for x in plan.restore_reads(r, restore, shift)]
        rd.append((sum(f.bytes for f in files), len(files)))
    for k in range(1, writes + 1):
        op("write", k, k, w, write_gib_s)
    for k in range(1, reads + 1):
        op("read", k, (k - 1) % writes + 1, rd, read_gib_s)

    rules = s.rules
    summary = summarize(records, max_resident_fraction=rules.data["cold_read"]["max_resident_fraction"])
    summary["read_valid"] = bool(summary.get("read_cold", True) and summary.get("read_verified", True))
    summary["checkpoint_bytes"] = plan.total_bytes
    summary["restore_bytes"] = plan.restore_bytes(restore)
    summary["dlio_compat"] = dlio_compat(summary, plan.total_bytes)
    # One description per system (the first bundle of a system writes it; later ones embed it).
    org_dir = root / (tree_division or division) / org
    desc_path = org_dir / "systems" / f"{system}.yaml"
    desc = (yaml.safe_load(desc_path.read_text()) if desc_path.is_file() else
            system_description(system, org, accelerator=desc_accelerator or accelerator, clients=hosts))
    sysdoc = {"hosts": [_host_facts(h.name) for h in specs], "description": desc}
    ended = started[:11] + "23:59:59.000Z"
    manifest: dict[str, Any] = {
        "run_format": 1, "run_id": run_id, "name": name, "status": "complete",
        "mlckpt_version": __version__, "rules_version": rules.version, "workload": workload,
        "division": division, "scaled": scale != 1.0, "scale": cfg["scale"], "ranks": ranks,
        "hosts": [{"host": h.name, "ranks": list(h.ranks)} for h in specs], "rank_shift": shift,
        "verdict": "", "findings": [], "overrides": overrides, "started": started, "ended": ended,
        "records_format": 1, "data_scheme": DATA_SCHEME, "system_name": system,
    }
    found = [*rules.evaluate(ctx, ["config", "host"]).findings,
             *rules.evaluate(replace(ctx, run=RunData(manifest, cfg, summary, records, sysdoc)),
                             ["result"]).findings]
    manifest["findings"] = [f.to_dict() for f in found]
    manifest["verdict"] = verdict(found, division)

    (org_dir / "systems").mkdir(parents=True, exist_ok=True)
    (org_dir / "systems" / f"{system}.yaml").write_text(yaml.safe_dump(desc, sort_keys=True))
    folder = org_dir / "results" / system / workload / name
    folder.mkdir(parents=True)

    def dump(fname: str, doc: Any) -> None:
        (folder / fname).write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")

    dump("run.json", manifest)
    (folder / "config.yaml").write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    (folder / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    dump("summary.json", summary)
    dump("system.json", sysdoc)
    (folder / "run.log").write_text(f"synthetic test run {name}\n")
    key = org_key(org)
    bundle.sign_bundle(folder, key, bundle.Predicate(
        run_id=run_id, mlckpt_version=__version__, runner_code_sha256="0" * 64,
        rules_version=rules.version, workload=workload, division=division, started=started,
        ended=ended, extra={"ranks": ranks, "scaled": manifest["scaled"], "verdict": manifest["verdict"]}))
    _trust(root, org)
    if pack:
        archive = bundle.pack(folder, folder.parent / f"{name}.tar.gz")
        shutil.rmtree(folder)
        return archive
    return folder


def _trust(root: Path, org: str) -> None:
    path = root / "trusted-keys.yaml"
    doc = yaml.safe_load(path.read_text()) if path.is_file() else {
        "mlckpt_trusted_keys": "1.0", "organizations": {}}
    doc["organizations"][org] = [bundle.public_key_text(org_key(org).public_key())]
    doc["organizations"] = dict(sorted(doc["organizations"].items()))
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


# ----------------------------------------------------------------------------------------------
# The golden tree: every class kind, a packed bundle, repeated rank counts, missing values.

CLOSED = {"division": "closed", "writes": 10, "reads": 10}
GOLDEN_TREE: tuple[dict[str, Any], ...] = (
    {**CLOSED, "org": "acme", "system": "fast", "workload": "llama3_8b", "ranks": 8, "hosts": 2,
     "accelerator": "h100", "write_gib_s": 40.0, "read_gib_s": 55.0},
    {**CLOSED, "org": "zeta", "system": "z1", "workload": "llama3_8b", "ranks": 8, "hosts": 2,
     "accelerator": "h200", "write_gib_s": 30.0, "read_gib_s": 65.0, "straggle": 1.6},
    {**CLOSED, "org": "acme", "system": "fast", "workload": "llama3_70b", "ranks": 64, "hosts": 8,
     "accelerator": "h100", "write_gib_s": 140.0, "read_gib_s": 190.0},
    # Open, full scale, same workload and ranks as a closed result: still another class.
    {"org": "acme", "system": "fast", "workload": "llama3_8b", "ranks": 8, "hosts": 2, "writes": 3,
     "reads": 3, "write_gib_s": 42.0, "read_gib_s": 50.0},
    # Open, scaled: a scaling series for both systems (zeta's 16-rank result packed).
    *({"org": "acme", "system": "fast", "workload": "llama3_8b", "ranks": r, "scale": 0.01,
       "write_gib_s": 5 * r**0.8, "read_gib_s": 6 * r**0.7} for r in (4, 8, 16)),
    {"org": "acme", "system": "fast", "workload": "llama3_8b", "ranks": 8, "scale": 0.01, "seed": 1,
     "write_gib_s": 5 * 8**0.8, "read_gib_s": 6 * 8**0.7},
    {"org": "zeta", "system": "z1", "workload": "llama3_8b", "ranks": 4, "scale": 0.01,
     "extra": ("residency=stream", "io.direct=false"), "write_gib_s": 18.0, "read_gib_s": 16.0},
    {"org": "zeta", "system": "z1", "workload": "llama3_8b", "ranks": 16, "scale": 0.01, "pack": True,
     "extra": ("residency=stream", "io.direct=false"), "write_gib_s": 36.0, "read_gib_s": 60.0},
    # Open, full scale, other workloads: restore=repopulate, markup in a description, no reads.
    {"org": "zeta", "system": "z2", "workload": "llama_7b", "ranks": 4,
     "extra": ("checkpoint.restore=repopulate",), "desc_accelerator": "<b>mi300x</b> | 8/node",
     "write_gib_s": 11.0, "read_gib_s": 14.0},
    {"org": "acme", "system": "fast", "workload": "llama_7b_zero3", "ranks": 4, "reads": 0,
     "write_gib_s": 9.5},
)


def build_tree(root: Path, spec: Sequence[dict[str, Any]] = GOLDEN_TREE) -> Path:
    for kw in spec:
        make_bundle(root, **kw)
    return root


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


def lb_cli(root: Path, fmt_name: str, out: Path, *extra: str) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    status = cli.run(["leaderboard", str(root), "--format", fmt_name, "--out", str(out), *extra])
    assert status == 0
    return out.read_text(encoding="utf-8")


def board_json(root: Path, tmp: Path) -> dict[str, Any]:
    return json.loads(lb_cli(root, "json", tmp / "lb.json"))


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
    report = cli.check_tree(golden_tree, trusted, jobs=2)
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
    links = {e.path: leaderboard._link(other / e.path, base, e.path.endswith(".tar.gz"))
             for t in board.tables for e in t.entries}
    for fmt_name in FORMATS:
        assert render.render(board, fmt_name, links=links) == outputs[fmt_name], fmt_name
    # No clock, no randomness: nothing like a timestamp in any output.
    for text in outputs.values():
        assert not re.search(r"20\d\d-\d\d-\d\dT\d\d:\d\d", text.replace(render.plotly_bundle(), ""))


def test_stdout_output_equals_file_output(golden_tree: Path, outputs: dict[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["leaderboard", str(golden_tree), "--format", "csv", "--jobs", "1"]) == 0
    printed = capsys.readouterr()
    assert printed.out == outputs["csv"]
    assert printed.err == "leaderboard: 12 results in 6 classes\n"


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
    scaled = next(c for c in doc["classes"] if c["id"] == "open-llama3_8b-scaled")
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
        "open-llama3_8b-scaled", "open-llama_7b-full", "open-llama_7b_zero3-full"]
    for t in golden_board.tables:
        for e in t.entries:
            key = (t.key.division, t.key.workload, t.key.scale == "scaled")
            assert (e.division, e.workload, e.scaled) == key
        assert set(t.frame["division"]) == {t.key.division}
        full = t.frame["mode"].str.endswith("full scale")
        assert full.all() if t.key.scale == "full" else not full.any()
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
            if summary["num_reads"]:
                assert rec["read_gib_s"] == summary["read_bandwidth_mean_gib_s"]
                assert rec["verification"] == "verified, cold"
            else:
                assert math.isnan(rec["read_gib_s"]) and rec["verification"] == "no reads"
    modes = {rec["mode"] for t in golden_board.tables for rec in t.frame.to_dict("records")}
    assert {"full, direct, full scale", "stream, buffered, scaled ×0.01",
            "full, direct, restore repopulate, full scale"} <= modes
    acc = {rec["accelerator"] for t in golden_board.tables for rec in t.frame.to_dict("records")}
    assert {"h100", "h200", "<b>mi300x</b> | 8/node", None} == acc


def test_every_format_shows_the_same_rounded_numbers(outputs: dict[str, str]) -> None:
    doc = json.loads(outputs["json"])
    csv_lines = outputs["csv"].splitlines()
    md, page = outputs["md"], outputs["html"]
    csv_rows = list(csv.DictReader(csv_lines))
    json_rows = [r for c in doc["classes"] for r in c["rows"]]
    assert len(csv_rows) == len(json_rows)
    for jr, cr in zip(json_rows, csv_rows, strict=True):
        for c in COLUMNS:
            assert cr[c.label] == fmt(jr[c.key], c, missing=""), c.key
            if c.kind == "num" and jr[c.key] is not None:
                assert f"| {fmt(jr[c.key], c)} |".replace(" ", "") in md.replace(" ", "")
                assert f">{fmt(jr[c.key], c)}</td>" in page
    assert [c["label"] for c in doc["columns"]][7:11] == [
        "Write (GiB/s)", "Write duration (s)", "Read (GiB/s)", "Read duration (s)"]


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
    assert len(hrefs) == 12
    for href in hrefs:
        assert not href.startswith("/") and (pub / href).exists(), href
    figs = json.loads(re.search(r'<script type="application/json" id="lb-figures">(.*?)</script>',
                                page, re.S).group(1))
    assert set(figs) == {f"chart-bars-{t}" for t in (
        "closed-llama3_8b-full", "closed-llama3_70b-full", "open-llama3_8b-full", "open-llama3_8b-scaled",
        "open-llama_7b-full", "open-llama_7b_zero3-full")} | {"chart-scaling-open-llama3_8b-scaled"}
    scaling = figs["chart-scaling-open-llama3_8b-scaled"]["data"]
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
    sample = Path(__file__).resolve().parents[1] / "submissions"
    if not (sample / "trusted-keys.yaml").is_file():
        pytest.skip("no sample submission tree")
    trusted = bundle.TrustedKeys.load(sample / "trusted-keys.yaml")
    report = cli.check_tree(sample, trusted)
    passing = {b["path"]: b for b in report["bundles"] if b["verdict"] in ("closed", "open")}
    board = leaderboard.collect(sample, trusted)
    rows = {e.path: e for t in board.tables for e in t.entries}
    assert set(rows) == set(passing)
    for path, b in passing.items():
        e = rows[path]
        assert e.m("write_bandwidth_mean_gib_s") == b["metrics"]["write_bandwidth_mean_gib_s"]
        assert e.m("read_duration_mean_s") == b["metrics"]["read_duration_mean_s"]
        assert (e.ranks, e.scaled, e.org) == (b["metrics"]["ranks"], b["metrics"]["scaled"], b["org"])


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
def pair(golden_tree: Path) -> tuple[Path, Path, Path]:
    closed = sorted((golden_tree / "closed" / "acme" / "results" / "fast" / "llama3_8b").iterdir())[0]
    opens = sorted((golden_tree / "open" / "acme" / "results" / "fast" / "llama3_8b").iterdir())
    open_ = next(p for p in opens if json.loads((p / "run.json").read_text())["scale"] == 1.0)
    archive = next(golden_tree.rglob("*.tar.gz"))
    return closed, open_, archive


def test_compare_json_ratios(pair: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b, _ = pair
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
    assert m["mode"]["a"] == "full, direct, full scale"
    assert doc["same_class"] is False and doc["a"]["class"] == "closed-llama3_8b-full"


def test_compare_text_and_archives(pair: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b, archive = pair
    assert cli.run(["compare", str(b), str(archive)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"write bandwidth mean \(GiB/s\)\s+\d+\.\d\d\s+\d+\.\d\d\s+\d+\.\d{3}", out)
    assert "note: A is in class open-llama3_8b-full, B in open-llama3_8b-scaled" in out
    assert cli.run(["compare", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "note: A is in class" not in out
    assert re.search(r"write bandwidth mean \(GiB/s\)\s+(\d+\.\d\d)\s+\1\s+1\.000", out)


def test_compare_refuses_what_is_not_a_bundle(pair: tuple[Path, Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    a = pair[0]
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for other in (text, empty, tmp_path / "missing"):
        assert cli.run(["compare", str(a), str(other)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mlckpt-check: error: B ") and str(other) in err


def test_compare_checks_integrity_of_both_first(pair: tuple[Path, Path, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    a, b, _ = pair
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
