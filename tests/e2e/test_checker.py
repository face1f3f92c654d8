"""mlckpt-check: honest bundles from the real runner pass; every rule ID catches a mutated copy.

The honest bundles come from real ``mlckpt run``s (conftest ``honest_bundles``: two sync runs and an
asynchronous, tiered one).  Each case in
``NEGATIVE_CASES`` copies one, gives it its own run id, edits it and re-signs it with the
organisation's trusted key (so the edit reaches the layer the rule lives in), or tampers with it
after signing (integrity rules).  All cases sit in one tree checked once; each asserts that its
rule fired on its bundle with the expected message fragment.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import paths
from support.catalogue import forgery_rules
from support.forge import disguise, edit_json, edit_records, edit_yaml, resign, resummarize, shift
from support.trees import assert_report_valid, check, honest_tree, write_system

import checker.bundle_check
from checker.cli import run
from mlckpt import bundle, latency
from mlckpt.rules import DEFAULT_RULES_VERSION, load_rules

ORG = "example-org"
SYSTEM = "laptop-ext4"
CHECK = Path(sys.executable).parent / "mlckpt-check"
REPO = paths.REPO
INTEGRITY = {"BUNDLE-SIGNATURE", "BUNDLE-KEY", "BUNDLE-FILES", "BUNDLE-PATHS"}
ASYNC = "async_tiers"  # honest_bundles key of the asynchronous, tiered run (2 writes, 2 reads)
# That run's plan: 4 ranks of 14,053,376 B (2 files each); the drain ring is 2 × 4 threads × 4 MiB.
RANK_BYTES = 14_053_376
RING = 2 * 4 * 4 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# Editing and re-signing bundles



def replace_step(name: str, step: Any) -> tuple[tuple[str, Any], ...]:
    """The checker's pipeline with one step replaced (to provoke a checker fault)."""
    return tuple((n, step if n == name else f) for n, f in checker.bundle_check.PIPELINE)

def records(fn: Callable[[list[dict[str, Any]]], Any]) -> Callable[[Path], None]:
    """An edit of records.jsonl in place (``fn``'s result is ignored), with summary.json recomputed
    from the edited records."""
    def edit(folder: Path) -> None:
        edit_records(folder, lambda rs: [fn(rs), None][1])
        resummarize(folder)
    return edit


def foreign_bytes(folder: Path, times: int) -> None:
    """Another tenant on the device all along: its counters gain bytes at ``times`` the ranks' own
    peak rate from the first sample on (the background window before the first op, inside every op
    and between them), the ranks' accounting untouched; summary.json recomputed."""
    def rate_of(recs: list[dict[str, Any]]) -> float:
        return times * max((hc["after"]["own_written_bytes"] + hc["after"]["own_read_bytes"]
                            - hc["before"]["own_written_bytes"] - hc["before"]["own_read_bytes"])
                           / (hc["after"]["t_ns"] - hc["before"]["t_ns"])
                           for hc in (r["host_counters"] for r in recs if "host_counters" in r))

    run = json.loads((folder / "run.json").read_text())
    windows = [h["background"] for h in (run.get("calibration") or {}).get("hosts", []) if "background" in h]
    recs = [json.loads(ln) for ln in (folder / "records.jsonl").read_text().splitlines()]
    rate = rate_of(recs)
    samples = [s for w in windows for s in (w["before"], w["after"])]
    samples += [s for r in recs if "host_counters" in r for s in (r["host_counters"]["before"],
                                                                    r["host_counters"]["after"])]
    start = min(s["t_ns"] for s in samples)

    def flood(sample: dict[str, Any]) -> None:
        sample["written_bytes"] += int(rate * (sample["t_ns"] - start))

    for w in windows:
        flood(w["before"])
        flood(w["after"])
    edit_json(folder, "run.json", lambda r: r.update(calibration=run["calibration"]))
    records(lambda rs: [flood(s) for r in rs if "host_counters" in r
                        for s in (r["host_counters"]["before"], r["host_counters"]["after"])])(folder)


def fast_tier_on(fs: str) -> Callable[[Path], None]:
    """run.json: the fast tier of the run's (only) host is a ``fs`` filesystem."""
    return lambda f: edit_json(f, "run.json", lambda r: r["pipeline"].update(
        fast_fs={h["host"]: fs for h in r["hosts"]}))


def rec(recs: list[dict[str, Any]], op: str, index: int, rank: int) -> dict[str, Any]:
    [r] = [r for r in recs if (r["op"], r["index"], r["rank"]) == (op, index, rank)]
    return r


def each(op: str, index: int, fn: Callable[[dict[str, Any]], None]) -> Callable[[list[dict[str, Any]]], None]:
    """Apply ``fn`` to every rank's record of one op."""
    def apply(recs: list[dict[str, Any]]) -> None:
        for r in recs:
            if (r["op"], r["index"]) == (op, index):
                fn(r)
    return apply


def key(h: Mapping[str, Path], name: str) -> Any:
    return bundle.load_private_key(h["dir"] / "keys" / f"{name}.pem")


S3_BLOCK = {"kind": "s3", "client": "botocore 1.44.8", "endpoint_host": "s3.example.com",
            "region": "us-east-1", "bucket": "ckpt", "prefix": "runs", "part_size": 16 << 20, "inflight": 8,
            "addressing_style": "path", "verify_tls": True}


GPU_BLOCK = {"source": "gpu", "library": "torch", "library_version": "2.11.0", "copy_path": "pinned",
             "ranks": [{"rank": r, "host": "vm", "device": "cuda:0", "device_type": "cuda",
                        "device_name": "NVIDIA H200", "d2h_gib_s": 50.0, "h2d_gib_s": 50.0}
                       for r in range(4)]}


def setitem(path: str, value: Any) -> Callable[[Any], None]:
    """An editor setting dotted ``path`` (list indexes as numbers) to ``value``."""
    def edit(doc: Any) -> None:
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def findings(report: Mapping[str, Any], path_part: str) -> list[dict[str, Any]]:
    bundles = [b for b in report["bundles"] if path_part in b["path"]]
    assert len(bundles) == 1, [b["path"] for b in report["bundles"]]
    return bundles[0]["findings"]


# ----------------------------------------------------------------------------------------------
# The cases


def make_closed(folder: Path) -> None:
    """The run as if submitted in the closed division (what a closed run's files say)."""
    edit_yaml(folder, "config.yaml", setitem("division", "closed"))
    edit_json(folder, "run.json", setitem("division", "closed"))


def add_host(folder: Path) -> None:
    """Ranks 2 and 3 on a second host (with its facts in system.json)."""
    edit_json(folder, "run.json", setitem("hosts", [{"host": "vm", "ranks": [0, 1]},
                                                    {"host": "vm2", "ranks": [2, 3]}]))

    def calibrated(doc: Any) -> None:  # rules 1.8: each host measured its own timing
        cal = doc["calibration"]["hosts"][0]
        doc["calibration"]["hosts"] = [{**cal, "host": h, "ranks": 2} for h in ("vm", "vm2")]
    edit_json(folder, "run.json", calibrated)

    def second(doc: Any) -> None:
        doc["hosts"][0]["hostname"] = "vm"
        doc["hosts"].append({**doc["hosts"][0], "hostname": "vm2"})
        doc["hosts"][1]["boot_id"] = "f" * 8 + doc["hosts"][0]["boot_id"][8:]
    edit_json(folder, "system.json", second)

    def hostnames(recs: list[dict[str, Any]]) -> None:
        # vm2 is another machine: its own clock (booted 1000 s earlier) and its own counters
        counters = {(r["op"], r["index"]): r["host_counters"] for r in recs if "host_counters" in r}
        for r in recs:
            r["host"] = "vm" if r["rank"] < 2 else "vm2"
            if r["rank"] >= 2:
                if r["rank"] == 2:  # its first rank read them just before its own start
                    r["host_counters"] = copy.deepcopy(counters[(r["op"], r["index"])])
                    r["host_counters"]["before"]["t_ns"] = r["t0_ns"] - 50_000
                shift(r, 10**12, wall=False)
    edit_records(folder, hostnames)
    edit_json(folder, "run.json", setitem("hosts.0.host", "vm"))
    resummarize(folder)  # two hosts in DLIO's top-level keys too


def charge_to_ranks(field: str, extra: int) -> Callable[[dict[str, Any]], None]:
    """A host's closing counters with ``extra`` bytes more of ``field`` moved by the device and
    charged to the host's ranks (on the record that carries them; others are left alone)."""
    def apply(r: dict[str, Any]) -> None:
        if "host_counters" in r:
            after = r["host_counters"]["after"]
            after[field] += extra
            after[f"own_{field}"] += extra
    return apply


def first(op: str, fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        def apply(recs: list[dict[str, Any]]) -> None:
            fn(next(r for r in recs if r["op"] == op))
        edit_records(folder, apply)
    return edit


def more_faster_requests(r: dict[str, Any]) -> None:
    """The rank's histogram re-encoded with four times the requests at a quarter of the latency:
    four times the IOPS, a quarter of every percentile, the longest request still in the op."""
    h = latency.decode(r["requests"])
    faster = [item.value_iterated_to // 4 for item in h.get_recorded_iterator()
              for _ in range(4 * item.count_at_value_iterated_to)]
    r["requests"] = latency.encode(faster)


def cut_to_longest(r: dict[str, Any]) -> None:
    """The rank's op cut to its longest request, its real histogram kept."""
    r["t1_ns"] = r["t0_ns"] + latency.block_facts(latency.decode(r["requests"])).top


def both(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        for fn in fns:
            fn(folder)
    return edit


def flip_byte(name: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        p = folder / name
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0x20
        p.write_bytes(bytes(data))
    return edit


def truncate_envelope(folder: Path) -> None:
    p = folder / bundle.SIGNATURE_FILE
    p.write_bytes(p.read_bytes()[:200])


def alter_payload(folder: Path) -> None:
    """Re-encode the statement with one digest changed, keeping the old signature."""
    import base64
    p = folder / bundle.SIGNATURE_FILE
    env = json.loads(p.read_text())
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["predicate"]["verdict"] = "closed"
    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
    env["payload"] = base64.b64encode(payload).decode()
    p.write_text(json.dumps(env))


def symlink_inside(folder: Path) -> None:
    (folder / "run.log").unlink()
    os.symlink("/etc/hostname", folder / "run.log")


def rename_file(folder: Path) -> None:
    (folder / "run.log").rename(folder / "run.txt")


def evil_archive(folder: Path, out: Path) -> None:
    """A .tar.gz whose members are the bundle plus one named ../escape."""
    with tarfile.open(out, "w:gz") as tar:
        for p in sorted(folder.iterdir()):
            tar.add(p, arcname=p.name)
        info = tarfile.TarInfo("../escape")
        data = b"outside\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@dataclass(frozen=True)
class Case:
    fragment: str  # must appear in the message of one finding of the rule
    mutate: Callable[[Path], None] | None = None  # edit before re-signing: reaches parse/rules
    tamper: Callable[[Path], None] | None = None  # edit after signing: integrity
    division: str = "open"  # the tree folder it is placed under
    closed: bool = False  # make_closed first
    source: str = "llama3_8b"
    system: str = SYSTEM
    workload_dir: str | None = None
    sign: str = "org"  # org | other | rogue
    predicate: Mapping[str, Any] = field(default_factory=dict)
    archive: Callable[[Path, Path], None] | None = None  # write the leaf as this archive
    alone: bool = False  # no other rule fires (but RESULT-VERDICT: run.json's verdict is now wrong)


C = Case
NEGATIVE_CASES: dict[str, list[Case]] = {
    # --- structural (config stage): no plan, plan-dependent rules not checked
    "RANKS-MULTIPLE": [C("ranks must be a positive multiple of TP·PP = 8; got 4", mutate=lambda f: edit_yaml(
        f, "config.yaml", setitem("workload.parallelism.tensor", 8)))],
    "ZERO3-PIPELINE": [C("ZeRO stage 3 requires pipeline parallelism 1; got PP = 2",
                         mutate=lambda f: edit_yaml(f, "config.yaml",
                                                    setitem("workload.parallelism.pipeline", 2)))],
    "LAYERS-PIPELINE": [C("num_layers must be at least PP = 4; got 2", mutate=lambda f: edit_yaml(
        f, "config.yaml", lambda c: c["workload"].update(
            model={**c["workload"]["model"], "num_layers": 2},
            parallelism={"tensor": 1, "pipeline": 4, "zero_stage": 1})))],
    "SCALE-RANGE": [C("scale must be in (0, 1]; got 1.5",
                      mutate=lambda f: edit_yaml(f, "config.yaml", setitem("scale", 1.5)))],
    # a run claiming to have restored another whose bundle is not in the tree
    "SPLIT-PAIR": [C("got not in the tree", mutate=lambda f: edit_json(f, "run.json", setitem(
        "restored_from", {"run_id": "00000000000000aa", "num_writes": 1, "statement_sha256": "0" * 64,
                          "name": "20260101T000000Z-llama3_8b-4r-00000000000000aa",
                          "ended": "2026-01-01T00:00:00.000Z", "content_proof": "0" * 64})))],
    "COUNTS-POSITIVE": [C("got num_writes=0, num_reads=1",
                          mutate=lambda f: edit_yaml(f, "config.yaml", setitem("checkpoint.num_writes", 0)))],
    # --- closed-division eligibility: closed-shaped copies of a tiny open run
    "CLOSED-WORKLOAD": [C("expected one of llama3_8b, llama3_70b, llama3_405b, llama3_1t, got llama_7b",
                          closed=True, division="closed", source="llama_7b")],
    "CLOSED-RANKS": [C("closed runs of this workload use exactly 8 ranks; got 4", closed=True,
                       division="closed")],
    "CLOSED-COUNTS": [C("closed runs use 10 writes and 10 reads; got 1 writes and 1 reads", closed=True)],
    "CLOSED-PARAMS": [C("closed runs keep this parameter at scale=1.0; got scale=0.0005", closed=True)],
    "CLOSED-OVERRIDES": [C("'stream_buffer_bytes' is not allowed", closed=True, mutate=lambda f: edit_json(
        f, "run.json", lambda r: r["overrides"].append("stream_buffer_bytes=268435456")))],
    "CLOSED-RANKS-PER-HOST": [C("closed runs place at least 4 ranks on every host; host vm has 2",
                                closed=True, mutate=add_host)],
    "CLOSED-ACCELERATOR-MEMORY": [C("(declare accelerator=NAME), got no accelerator", closed=True)],
    # --- resources measured by the runner and recorded in system.json
    "HOST-MEMORY": [
        C("host vm: host memory must hold the resident state of its ranks",
          mutate=lambda f: edit_json(f, "system.json", setitem("hosts.0.memory_available_bytes", 4096))),
        # async: each rank's state, its staging copy and its drain ring; one byte short of that
        C(": host memory must hold the resident state of its ranks: expected at least 235.22 MiB, "
          "got 235.22 MiB available", source=ASYNC, alone=True,
          mutate=lambda f: edit_json(f, "system.json", setitem("hosts.0.memory_available_bytes",
                                                               4 * (2 * RANK_BYTES + RING) - 1))),
    ],
    # --- object storage (rules 1.6): a bundle of a folder run claiming an object store, or the reverse
    "OBJECT-MODES": [C("got checkpoint.tiers.fast=/nvme/fast", mutate=lambda f: edit_yaml(
        f, "config.yaml", lambda c: c["checkpoint"].update(folder="s3://ckpt/runs",
                                                           tiers={"fast": "/nvme/fast", "fast_keep": 1})))],
    "OBJECT-STORAGE-RECORDED": [
        C("expected storage.kind=posix, got storage.kind=s3", mutate=lambda f: edit_json(
            f, "run.json", setitem("storage", S3_BLOCK))),
        C("expected storage.kind='s3', got 'posix'", mutate=lambda f: edit_yaml(f, "config.yaml", lambda c: (
            c["checkpoint"].update(folder="s3://ckpt/runs")))),
    ],
    # --- GPU-resident state (rules 1.7): a host-memory bundle claiming a GPU source, or the reverse
    "GPU-MODES": [C("got checkpoint.tiers.fast=/nvme/fast", mutate=lambda f: edit_yaml(
        f, "config.yaml", lambda c: c.update(state={"source": "gpu", "gpu": {"device": None}}, checkpoint={
            **c["checkpoint"], "tiers": {"fast": "/nvme/fast", "fast_keep": 1}})))],
    "GPU-SOURCE-RECORDED": [
        C("expected state: null (host memory), got state.source='gpu'", mutate=lambda f: edit_json(
            f, "run.json", setitem("state", GPU_BLOCK))),
        C("expected state.source='gpu', got None", mutate=lambda f: edit_yaml(
            f, "config.yaml", lambda c: c["state"].update(source="gpu"))),
        C("expected no device copies in a run with its state in host memory, got device_copy_ns",
          mutate=first("read", lambda r: r.update(device_copy_ns=1000))),
    ],
    # --- result stage (the runner's own result checks, recomputed from the raw records)
    "RESULT-CONSISTENT": [
        C("expected run.json ranks=4, got 8", mutate=lambda f: edit_json(
            f, "run.json", setitem("ranks", 8)), predicate={"ranks": 8}),
        C("expected run.json pipeline.mode='async', got 'sync'", source=ASYNC, alone=True,
          mutate=lambda f: edit_json(f, "run.json", setitem("pipeline.mode", "sync"))),
        C("expected run.json pipeline.fast_keep=1, got 2", source=ASYNC, alone=True,
          mutate=lambda f: edit_json(f, "run.json", setitem("pipeline.fast_keep", 2))),
    ],
    "RESULT-COUNTS": [C("one record per rank 0..3", mutate=lambda f: edit_records(f, lambda rs: rs[1:]))],
    "RESULT-TIMES": [
        C("t1_ns > t0_ns in every record",
          mutate=first("write", lambda r: r.update(t1_ns=r["t0_ns"] - 5))),
        # consecutive writes of a rank: the next may start once training resumed (staged), not before
        C("rank 0: timestamps must be ordered and durations positive: expected each op of a rank starts "
          "after its previous op ended, got write 2 starts before write 1 ended", source=ASYNC,
          mutate=records(lambda rs: rec(rs, "write", 2, 0).update(
              t0_ns=rec(rs, "write", 1, 0)["staged_ns"] - 1000))),
    ],
    "BYTES-PLAN": [C("write 1 rank 0: bytes per rank must equal the plan",
                     mutate=first("write", lambda r: r.update(bytes=r["bytes"] + 4096)))],
    "METRICS-RECOMPUTE": [C("summary.write_bandwidth_mean_gib_s", mutate=lambda f: edit_json(
        f, "summary.json",
        lambda s: s.update(write_bandwidth_mean_gib_s=2 * s["write_bandwidth_mean_gib_s"]))),
        # a flattering request latency, re-signed: the histograms in the records say otherwise
        C("summary.read_latency_ms.p99", mutate=lambda f: edit_json(
            f, "summary.json", lambda s: s["read_latency_ms"].update(p99=s["read_latency_ms"]["p99"] / 2)))],
    # a canonical name on another model (the leaderboard would list it as llama3_8b)
    # rules 1.11: a library writer with a fast tier (FRAMEWORK-RECORDED's cases: tests/mpi/test_frameworks.py)
    "FRAMEWORK-SCOPE": [C("got checkpoint.tiers.fast (one tier)", mutate=lambda f: edit_yaml(
        f, "config.yaml", lambda c: c.update(
            framework={"writer": "torch_save", "reference": None, "threads": None, "sync_files": None,
                       "tensors": None},
            checkpoint={**c["checkpoint"], "tiers": {"fast": "/nvme/fast", "fast_keep": 1}})))],
    "WORKLOAD-NAME": [C("expected workload.model.num_layers=32 for llama3_8b, got "
                        "workload.model.num_layers=16", mutate=lambda f: edit_yaml(
                            f, "config.yaml", setitem("workload.model.num_layers", 16)))],
    "RUN-CLAIMS": [
        # a scaled run that says it is not (the leaderboard would list it at full scale)
        C("run.json scaled=True (scale 0.0005), got scaled=False", mutate=lambda f: edit_json(
            f, "run.json", setitem("scaled", False))),
        # a second host that no record evidences (the leaderboard would show 2 hosts)
        C("records from every host run.json places ranks on, got none from host ghost",
          mutate=lambda f: edit_json(f, "run.json", lambda r: r.update(hosts=[
              {**r["hosts"][0], "ranks": r["hosts"][0]["ranks"][:2]},
              {**r["hosts"][0], "host": "ghost", "ranks": r["hosts"][0]["ranks"][2:]}]))),
    ],
    "RECORDS-REQUESTS": [
        C("requests.count 1 but the histogram holds", mutate=first("write", lambda r: r["requests"].update(
            count=1 if r["requests"]["count"] != 1 else 2))),
        C("every rank's requests, or none", mutate=first("read", lambda r: r.pop("requests"))),
        C("requests.hist: not an HdrHistogram", mutate=first("read", lambda r: r["requests"].update(
            hist="QUJD" * 8))),
        C("a request of", mutate=first("write", lambda r: r.update(t1_ns=r["t0_ns"] + 1000))),
    ],
    # rules 1.17: the request data held to what the engine must do
    "REQUESTS-PLANNED": [C("expected 4 requests (one per io.block_size=4194304 piece of the op's 2 files), "
                           "got 16", mutate=records(lambda rs: more_faster_requests(
                               next(r for r in rs if r["op"] == "write"))))],
    # the op cut to its longest request (RECORDS-REQUESTS holds it no shorter), with one request in
    # flight claimed: the rank's requests no longer fit in it
    "REQUESTS-BUSY": [C("requests adding up to at most io.threads=1", mutate=both(
        lambda f: edit_yaml(f, "config.yaml", setitem("io.threads", 1)),
        records(lambda rs: cut_to_longest(next(r for r in rs if r["op"] == "read")))))],
    # rules 1.18: another tenant's 200 MB read charged to the ranks during a write (the device
    # read them: DEVICE-COUNTERS' "own at most the device's" holds)
    "OWN-BYTES": [C("the host's ranks read at most", mutate=records(each("write", 1, charge_to_ranks(
        "read_bytes", 200 << 20))))],
    "FSYNC-EVERY-WRITE": [C("4 of 4 write records without fsync", closed=True, mutate=both(
        lambda f: edit_yaml(f, "config.yaml", setitem("checkpoint.fsync", False)),
        records(lambda rs: [r.update(fsync=False) for r in rs if r["op"] == "write"])))],
    "COLD-READ": [
        C("read 1: restores must start from a cold page cache", mutate=first(
            "read", lambda r: r.update(resident_bytes=r["cached_check_bytes"] * 2))),
        # a durable-tier restore from the page cache is caught even with a tmpfs fast tier ...
        C("read 1: restores must start from a cold page cache: expected at most 1% resident before a "
          "restore, got 100.0% resident", source=ASYNC, alone=True, mutate=both(
              fast_tier_on("tmpfs"),
              records(each("read", 1, lambda r: r.update(resident_bytes=r["cached_check_bytes"]))))),
        # ... and a fast-tier restore is only exempt when the fast tier is memory (here: ext4)
        C("read 2: restores must start from a cold page cache: expected at most 1% resident before a "
          "restore, got 100.0% resident", source=ASYNC, alone=True, mutate=both(
              fast_tier_on("ext4"),
              records(each("read", 2, lambda r: r.update(resident_bytes=r["cached_check_bytes"]))))),
    ],
    "DATA-VERIFIED": [C("0 mismatches", mutate=first("read", lambda r: r.update(mismatches=3)))],
    "DATA-UNIQUE": [C("data_scheme 'zeros'",
                      mutate=lambda f: edit_json(f, "run.json", setitem("data_scheme", "zeros")))],
    "BANDWIDTH-PLAUSIBLE": [C("(declared, +5%)", system="slow-ext4", mutate=lambda f: (
        edit_json(f, "system.json", lambda s: s["description"].update(
            system_name="slow-ext4", storage={**s["description"]["storage"], "max_write_gib_s": 0.001})),
        edit_json(f, "run.json", setitem("system_name", "slow-ext4"))))],
    # --- asynchronous and tiered checkpointing (the async_tiers run)
    # a witness asked for on an asynchronous run (only a forger's edit gets it past the gates)
    "WITNESS-MODE": [C("expected checkpoint.mode=sync with no fast tier, got checkpoint.mode=async",
                       source=ASYNC, mutate=lambda f: edit_yaml(f, "config.yaml", setitem(
                           "witness.url", "http://127.0.0.1:8470")))],
    "ASYNC-RESIDENCY": [C("expected residency=full with checkpoint.mode=async, got residency=stream",
                          source=ASYNC, mutate=lambda f: edit_yaml(f, "config.yaml",
                                                                   setitem("residency", "stream")))],
    "TIERS-DISTINCT": [C("expected a fast tier apart from checkpoint.folder=./mlckpt-checkpoints, got "
                         "checkpoint.tiers.fast=./mlckpt-checkpoints/fast", source=ASYNC, mutate=both(
                             lambda f: edit_yaml(f, "config.yaml", setitem("checkpoint.tiers.fast",
                                                                           "./mlckpt-checkpoints/fast")),
                             lambda f: edit_json(f, "run.json", setitem("pipeline.fast",
                                                                        "./mlckpt-checkpoints/fast"))))],
    "PIPELINE-DECLARED": [
        C("write 1 rank 1: every checkpoint follows the configured mode and tiers, with the configured "
          "training interval: expected mode async, stages memory → fast → durable, got mode sync, "
          "stages memory → fast → durable", source=ASYNC, alone=True,
          mutate=records(lambda rs: rec(rs, "write", 1, 1).update(mode="sync"))),
        C("write 2 rank 3: every checkpoint follows the configured mode and tiers, with the configured "
          "training interval: expected a training interval of at least 0.05 s, got 0.010 s",
          source=ASYNC, alone=True, mutate=records(lambda rs: rec(rs, "write", 2, 3).update(
              compute_ns=10_000_000))),
        # every rank claims the same (undeclared) pipeline: the summary agrees, the config does not
        C("expected mode sync, stages durable, got mode async, stages durable", alone=True,
          mutate=records(each("write", 1, lambda r: r.update(mode="async")))),
    ],
    "ASYNC-TIMELINE": [
        # the time training waited for checkpoint 1 lies within checkpoint 2's back-pressure
        C("write 1 rank 1: each checkpoint's stall, background stages and durability must be ordered on "
          "its rank's clock: expected an ordered checkpoint timeline, got exposed 1000000 ns exceeds "
          "write 2's back-pressure 0 ns", source=ASYNC, mutate=records(lambda rs: (
              rec(rs, "write", 1, 1).update(exposed_ns=1_000_000),
              rec(rs, "write", 2, 1).update(backpressure_ns=0)))),
        # one staging slot: checkpoint 1 must be durable before checkpoint 2's blocking stage starts
        C("write 1 rank 2: each checkpoint's stall, background stages and durability must be ordered on "
          "its rank's clock: expected an ordered checkpoint timeline, got durable after write 2's "
          "blocking stage began (one staging slot)", source=ASYNC,
          mutate=records(lambda rs: late_durable(rec(rs, "write", 1, 2), rec(rs, "write", 2, 2)))),
    ],
    "TIER-DRAIN-VERIFIED": [
        C(f"write 2 rank 0: every page drained from the fast tier must be verified before it reaches the "
          f"durable tier: expected {RANK_BYTES} B verified on the drain, 0 mismatches, got "
          f"{RANK_BYTES - 4096} B of {RANK_BYTES} verified, 0 mismatches", source=ASYNC, alone=True,
          mutate=records(lambda rs: rec(rs, "write", 2, 0)["stages"][-1].update(
              verified_bytes=RANK_BYTES - 4096))),
        C(f"write 1 rank 3: every page drained from the fast tier must be verified before it reaches the "
          f"durable tier: expected {RANK_BYTES} B verified on the drain, 0 mismatches, got "
          f"{RANK_BYTES} B of {RANK_BYTES} verified, 2 mismatches", source=ASYNC, alone=True,
          mutate=records(lambda rs: rec(rs, "write", 1, 3)["stages"][-1].update(mismatches=2))),
    ],
    "TIER-RESTORE-SOURCE": [
        # checkpoint 1 left the fast tier when checkpoint 2 was durable (fast_keep 1)
        C("read 1 rank 0: a restore reads the nearest tier holding a copy (the node-local fast tier while "
          "it keeps the checkpoint): expected restore from the durable tier, got fast tier",
          source=ASYNC, alone=True, mutate=records(each("read", 1, lambda r: r.update(tier="fast")))),
        # checkpoint 2 is still there: reading the durable tier instead is not what the pipeline does
        C("read 2 rank 3: a restore reads the nearest tier holding a copy (the node-local fast tier while "
          "it keeps the checkpoint): expected restore from the fast tier, got durable tier",
          source=ASYNC, alone=True, mutate=records(each("read", 2, lambda r: r.update(tier="durable")))),
    ],
    # --- submission stage
    "BUNDLE-LAYOUT": [
        C("summary.json: bundles sit at", mutate=lambda f: (f / "summary.json").unlink()),
        C("expected workload 'llama_7b' (the folder it sits in), got workload 'llama3_8b'",
          workload_dir="llama_7b"),
    ],
    "BUNDLE-SIGNATURE": [
        C("not valid JSON", tamper=truncate_envelope),
        C("bad signature by key", tamper=alter_payload),
    ],
    "BUNDLE-KEY": [
        C("signed by untrusted key", sign="rogue"),
        C("registered for 'other-org'", sign="other"),
    ],
    "BUNDLE-FILES": [
        C("run.json: every file must be listed", tamper=flip_byte("run.json")),
        C("digest mismatch", tamper=flip_byte("records.jsonl")),
        C("extra file (not listed in the statement)", tamper=lambda f: (f / "notes.txt").write_text("hi\n")),
        C("missing (listed in the statement, not in the folder)", tamper=lambda f: (f / "run.log").unlink()),
        C("run.txt", tamper=rename_file),
    ],
    "BUNDLE-PATHS": [
        C("is a symlink", tamper=symlink_inside),
        C("contains a '..' component", archive=evil_archive),
    ],
    "BUNDLE-SCHEMA": [
        C("summary.json: every bundle file must parse strictly", mutate=lambda f: (
            f / "summary.json").write_text((f / "summary.json").read_text().replace(
                '"read_cold": true', '"read_cold": NaN'))),
        C("duplicate key", mutate=lambda f: (f / "run.json").write_text(
            '{"ranks": 4, ' + (f / "run.json").read_text().lstrip()[1:])),
        C("records.jsonl: every bundle file", mutate=first("write", lambda r: r.update(rank="0"))),
        C("config.yaml", mutate=lambda f: (f / "config.yaml").write_text(
            "anchor: &a [1, 2]\n" + (f / "config.yaml").read_text() + "again: *a\n")),
    ],
    "RULES-VERSION": [C("expected one of 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 1.10, 1.11, 1.12, "
                        "1.13, 1.14, 1.15, 1.16, 1.17, 1.18, 1.19, 1.20, 1.21, 1.22, mlps-v3.0, mlps-v3.0r2, "
                        "mlps-v3.0r3, mlps-v3.0r4, mlps-v3.0r5, got '9.9'",
                        predicate={"rules_version": "9.9"})],
    "BUNDLE-PREDICATE": [C("expected workload='llama3_70b' as signed in the statement, "
                           "got workload='llama3_8b'", predicate={"workload": "llama3_70b"})],
    # rules 1.8: another tenant moved ten times the run's bytes on the device during every op
    # (run.json's verdict edited to match, as the runner would have recorded it)
    "FOREIGN-IO": [C("by other processes in", predicate={"verdict": "disturbed"},
                     mutate=lambda f: [foreign_bytes(f, 10),
                                       edit_json(f, "run.json", setitem("verdict", "disturbed"))] and None)],
    # rules 1.9: the checkpoint folder on tmpfs, as system.json's filesystem says
    "MEMORY-FOLDER": [C("a checkpoint folder on storage, got", mutate=lambda f: edit_json(
        f, "system.json", lambda s: [h["filesystem"].update(fs_type="tmpfs") for h in s["hosts"]] and None))],
    "SYSTEM-DESCRIPTION": [
        C("a different embedded description (notes", mutate=lambda f: edit_json(
            f, "system.json", lambda s: s["description"].update(notes="faster than it is"))),
        C("got missing", system="no-such-system", mutate=lambda f: (
            edit_json(f, "system.json", lambda s: s.pop("description") and None),
            edit_json(f, "run.json", setitem("system_name", None)))),
        # run without system=: filed under a system whose description the tree holds, still refused
        C("it was run with (mlckpt run system=FILE), got none: the run named no system description",
          mutate=lambda f: (edit_json(f, "system.json", lambda s: s.pop("description") and None),
                            edit_json(f, "run.json", setitem("system_name", None)))),
    ],
    # rules 1.15: a drafted description (its placeholder left in), in the tree as in the bundle
    "SYSTEM-COMPLETE": [C("expected no value marked COMPLETE, got submitter: 'COMPLETE: your organisation'",
                          system="drafted-ext4", mutate=lambda f: (
                              edit_json(f, "system.json", lambda s: s["description"].update(
                                  system_name="drafted-ext4", submitter="COMPLETE: your organisation")),
                              edit_json(f, "run.json", setitem("system_name", "drafted-ext4"))))],
    "DIVISION-PLACEMENT": [
        C("a bundle under closed/ must earn the closed verdict: expected verdict closed (the bundle sits "
          "under closed/), got verdict open (division=open)", division="closed"),
        C("got verdict open (CLOSED-ACCELERATOR-MEMORY, CLOSED-COUNTS", closed=True, division="closed"),
    ],
    "RESULT-VERDICT": [C("expected open (division=open), got closed", mutate=lambda f: edit_json(
        f, "run.json", setitem("verdict", "closed")), predicate={"verdict": "closed"})],
    "DUPLICATE-RUN": [C("each run may be submitted once")],  # placed twice, see build_case
}


def late_durable(w1: dict[str, Any], w2: dict[str, Any]) -> None:
    """Checkpoint 1 durable 1 µs after checkpoint 2's blocking stage began (two in flight)."""
    w1["t1_ns"] = w1["stages"][-1]["t1_ns"] = w2["stages"][0]["t0_ns"] + 1000


def build_case(root: Path, h: Mapping[str, Path], i: int, case: Case) -> str:
    """Place the case's bundle; its tree-relative path (the first copy for DUPLICATE-RUN)."""
    src = h[case.source]
    run_id = f"{0xc0ffee00 + i:016x}"
    work = root.parent / "work" / run_id
    shutil.copytree(src, work)
    disguise(work, i)  # timings of its own: copies of one run would be one run submitted many times
    edit_json(work, "run.json", setitem("run_id", run_id))
    pred: dict[str, Any] = {"run_id": run_id}
    if case.closed:
        make_closed(work)
        pred["division"] = "closed"
    if case.mutate:
        case.mutate(work)
    workload = case.workload_dir or json.loads((src / "run.json").read_text())["workload"]
    resign(work, key(h, case.sign), **{**pred, **case.predicate})
    if case.tamper:
        case.tamper(work)
    dest_dir = root / case.division / ORG / "results" / case.system / workload
    dest_dir.mkdir(parents=True, exist_ok=True)
    if not (root / case.division / ORG / "systems" / f"{case.system}.yaml").exists():
        if case.system == "slow-ext4":
            text = (h["dir"] / "laptop-ext4.yaml").read_text().replace(
                "laptop-ext4", "slow-ext4").replace("max_write_gib_s: 100", "max_write_gib_s: 0.001")
            write_system(root, h, case.division, case.system, text)
        elif case.system == "drafted-ext4":
            text = (h["dir"] / "laptop-ext4.yaml").read_text().replace("laptop-ext4", "drafted-ext4")
            text = re.sub(r"(?m)^submitter: .*$", 'submitter: "COMPLETE: your organisation"', text)
            write_system(root, h, case.division, case.system, text)
        elif case.system == SYSTEM:
            write_system(root, h, case.division)
    if case.archive:
        case.archive(work, dest_dir / f"{run_id}.tar.gz")
        return f"{case.division}/{ORG}/results/{case.system}/{workload}/{run_id}.tar.gz"
    shutil.copytree(work, dest_dir / run_id, symlinks=True)
    if case.fragment == "each run may be submitted once":  # the same signed run, twice
        name = json.loads((work / "run.json").read_text())["name"]
        shutil.copytree(work, dest_dir / name, symlinks=True)
    return f"{case.division}/{ORG}/results/{case.system}/{workload}/{run_id}"


CASE_IDS = [(rule, i) for rule, cases in NEGATIVE_CASES.items() for i in range(len(cases))]


@pytest.fixture(scope="module")
def mutated(honest_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[dict[str, Any], dict[tuple[str, int], str]]:
    root = tmp_path_factory.mktemp("mutated") / "tree"
    root.mkdir()
    paths = {}
    for n, (rule, i) in enumerate(CASE_IDS):
        paths[(rule, i)] = build_case(root, honest_bundles, n, NEGATIVE_CASES[rule][i])
    return check(root, honest_bundles, jobs=2), paths


@pytest.mark.parametrize(("rule", "index"), CASE_IDS, ids=[f"{r}-{i}" for r, i in CASE_IDS])
def test_negative_case_is_caught_under_its_rule(rule: str, index: int, mutated: Any) -> None:
    report, paths = mutated
    case = NEGATIVE_CASES[rule][index]
    [b] = [b for b in report["bundles"] if b["path"] == paths[(rule, index)]]
    hits = [f for f in b["findings"] if f["rule"] == rule]
    assert hits, f"{rule} did not fire; findings: {[(f['rule'], f['message']) for f in b['findings']]}"
    assert any(case.fragment in f["message"] for f in hits), [f["message"] for f in hits]
    severity = load_rules().rule(rule).severity
    assert {f["severity"] for f in hits} == {severity}
    # an open-severity finding only costs closed eligibility: valid in open/, invalid in closed/
    # and a disturbed one (rules 1.8) is neither valid nor invalid
    want = "open" if severity == "open" and case.division == "open" else "invalid"
    assert b["verdict"] == ("disturbed" if severity == "disturbed" else want), b["findings"]
    # integrity failures are flagged as such; everything else has its signature intact
    assert (b["integrity"] == "failed") == (rule in INTEGRITY)
    assert all(f["path"].startswith(paths[(rule, index)]) for f in b["findings"]
               if not f["path"].startswith(f"{b['division']}/{ORG}/systems/")), b["findings"]
    if case.alone:  # the edit reaches its own rule and no other (summary.json kept consistent)
        assert {f["rule"] for f in b["findings"]} == {rule, "RESULT-VERDICT"}, b["findings"]


def test_every_rule_a_bundle_can_break_has_a_case() -> None:
    # see test_host_rules_without_bundle_data and test_tier_rules_without_bundle_data: rules that
    # need the runner's own host measurements (a fact in rules.yaml) cannot be broken by a bundle
    no_bundle_data = {r.id for r in load_rules().rules if "host_measurements" in r.needs}
    assert no_bundle_data == {"DISK-SPACE", "FOLDER-USABLE", "TIER-SPACE", "TIER-USABLE", "IO-ENGINE",
                              "RESULTS-APART", "HOST-CLOCK-OFFSET", "OBJECT-STORE-USABLE",
                              "GPU-USABLE"}
    # the cross-examination rules (1.2) have their cases in the forgery suite, the transcript
    # rules (1.4) theirs in tests/e2e/test_witness_run.py (bundles of real witnessed runs), SPLIT-EVIDENCE
    # (1.10) in tests/mpi/test_split.py (real pairs)
    split_forgeries = forgery_rules("test_split.py")
    witness_forgeries = forgery_rules("test_witness_run.py")
    framework_forgeries = forgery_rules("test_frameworks.py")  # rules 1.11: real library runs
    serving_forgeries = forgery_rules("test_serving_run.py")  # rules 1.13: real serving runs
    resume_forgeries = forgery_rules("test_resume_run.py")  # rules 1.21: real resume runs
    # and the warning STATE-HUGEPAGES its case in tests/e2e/test_what_changes_the_figure.py
    # (NEGATIVE_CASES count verdicts)
    assert {r.id for r in load_rules().rules} - no_bundle_data == (
        set(NEGATIVE_CASES) | forgery_rules("test_forgeries.py") | witness_forgeries | split_forgeries
        | framework_forgeries | serving_forgeries | resume_forgeries | {"STATE-HUGEPAGES"})


def test_mutated_tree_exit_status_and_counts(mutated: Any) -> None:
    report, paths = mutated
    assert report["exit_status"] == 3 and report["verdict"] == "integrity-failure"
    open_only = sum(load_rules().rule(r).severity == "open" and NEGATIVE_CASES[r][i].division == "open"
                    for r, i in CASE_IDS)
    assert report["summary"]["valid"] == open_only > 0  # closed-shaped runs are fine in open/
    assert report["summary"]["bundles"] == len(CASE_IDS) + 1  # the duplicate is placed twice
    assert report["summary"]["internal_errors"] == 0
    by_path = {f["path"] for f in report["findings"]}
    assert by_path  # every finding carries a path
    [dup] = [p for k, p in paths.items() if k[0] == "DUPLICATE-RUN"]
    twins = [b for b in report["bundles"] if b["path"].rsplit("/", 1)[0] == dup.rsplit("/", 1)[0]
             and any(f["rule"] == "DUPLICATE-RUN" for f in b["findings"])]
    assert len(twins) == 2


def test_structural_failure_skips_plan_dependent_rules(mutated: Any) -> None:
    report, paths = mutated
    [b] = [b for b in report["bundles"] if b["path"] == paths[("RANKS-MULTIPLE", 0)]]
    reasons = {n["rule"]: n["reason"] for n in b["not_checked"]}
    assert reasons.get("BYTES-PLAN") == "no run data or plan"
    assert reasons.get("HOST-MEMORY") == "no plan"
    assert not [f for f in b["findings"] if f["rule"] == "BUNDLE-SCHEMA"]


def test_bad_durations_skip_recomputation(mutated: Any) -> None:
    report, paths = mutated
    [b] = [b for b in report["bundles"] if b["path"] == paths[("RESULT-TIMES", 0)]]
    assert {"rule": "METRICS-RECOMPUTE", "reason": "records with non-positive durations (see RESULT-TIMES)"} \
        in b["not_checked"]


# ----------------------------------------------------------------------------------------------
# Honest trees, exit statuses, CLI contract


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MLCKPT_DEBUG"}
    return subprocess.run([str(CHECK), *args], text=True, capture_output=True, timeout=timeout,
                          env=env, check=False)


def test_honest_tree_passes(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "tree", honest_bundles)
    proc = run_cli(str(root), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert_report_valid(report)
    assert report["verdict"] == "valid" and report["findings"] == []
    assert [b["verdict"] for b in report["bundles"]] == ["open", "open"]
    assert {b["workload"] for b in report["bundles"]} == {"llama3_8b", "llama_7b"}
    assert any(b["path"].endswith(".tar.gz") for b in report["bundles"])
    for b in report["bundles"]:
        assert b["integrity"] == "ok" and b["org"] == ORG and b["system"] == SYSTEM
        assert b["metrics"]["write_bandwidth_mean_gib_s"] > 0 and b["metrics"]["num_writes"] == 1
        assert b["run_id"] and re.fullmatch(r"[0-9a-f]{64}", b["keyid"])
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == ["PASS", "PASS"]
    assert lines[-1] == "checked 2 bundles: 2 valid, 0 invalid (0 findings)"
    assert proc.stderr == ""


def test_sample_tree_passes() -> None:
    """The committed sample tree (submissions/, made by submissions/make_sample.py) is valid."""
    proc = run_cli(str(REPO / "submissions"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # two sync runs (one packed) and an async+tiers run (submissions/make_sample.py)
    assert proc.stdout.splitlines()[-1] == "checked 3 bundles: 3 valid, 0 invalid (0 findings)"
    assert not list((REPO / "submissions").rglob("*.pem")), "no private key in the sample tree"


def test_host_rules_without_bundle_data(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    report = check(honest_tree(tmp_path / "t", honest_bundles), honest_bundles)
    for b in report["bundles"]:
        skipped = {n["rule"] for n in b["not_checked"]}
        assert {"DISK-SPACE", "FOLDER-USABLE", "IO-ENGINE"} <= skipped
        assert "METRICS-RECOMPUTE" not in skipped and "BYTES-PLAN" not in skipped
        assert "BANDWIDTH-PLAUSIBLE" not in skipped  # the description declares maxima


# ----------------------------------------------------------------------------------------------
# The asynchronous, tiered run


def judge_one(h: Mapping[str, Path], root: Path, source: str = ASYNC,
              mutate: Callable[[Path], None] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(report, bundle result) for a tree holding one copy of ``source``, edited by ``mutate`` and
    re-signed with the organisation's trusted key."""
    write_system(root, h)
    shutil.copy(h["dir"] / "trusted-keys.yaml", root / "trusted-keys.yaml")
    folder = root / "open" / ORG / "results" / SYSTEM / "llama3_8b" / h[source].name
    shutil.copytree(h[source], folder)
    if mutate:
        mutate(folder)
        resign(folder, key(h, "org"))
    report = check(root, h, jobs=1)
    [b] = report["bundles"]
    return report, b


def test_honest_async_bundle_passes(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    report, b = judge_one(honest_bundles, tmp_path / "t")
    assert report["exit_status"] == 0 and report["verdict"] == "valid"
    assert (b["verdict"], b["integrity"], b["findings"]) == ("open", "ok", [])
    assert b["metrics"]["num_writes"] == b["metrics"]["num_reads"] == 2
    # every rule of the pipeline was evaluated on it, none skipped
    skipped = {n["rule"] for n in b["not_checked"]}
    assert not skipped & {"PIPELINE-DECLARED", "ASYNC-TIMELINE", "TIER-DRAIN-VERIFIED", "TIER-RESTORE-SOURCE",
                          "COLD-READ", "METRICS-RECOMPUTE", "RESULT-TIMES", "HOST-MEMORY", "BYTES-PLAN"}
    # and the run exercises what those rules look at
    folder = honest_bundles[ASYNC]
    recs = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    writes = [r for r in recs if r["op"] == "write"]
    assert len(writes) == 8 and {r["mode"] for r in writes} == {"async"}
    assert all([st["tier"] for st in r["stages"]] == ["memory", "fast", "durable"] for r in writes)
    assert all(r["stages"][-1]["verified_bytes"] == r["bytes"] == RANK_BYTES for r in writes)
    assert all(r["compute_ns"] >= 50_000_000 for r in writes)
    assert {(r["checkpoint"], r["tier"]) for r in recs if r["op"] == "read"} == {(1, "durable"), (2, "fast")}
    run = json.loads((folder / "run.json").read_text())
    fs = run["pipeline"]["fast_fs"][run["hosts"][0]["host"]]  # the filesystem of the fixture's folder
    assert isinstance(fs, str) and fs
    assert run["pipeline"] == {"mode": "async", "compute_interval_s": 0.05, "fast": "fast-tier",
                               "fast_keep": 1, "fast_fs": {h["host"]: fs for h in run["hosts"]}}
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["mode"], summary["tiers"]) == ("async", ["memory", "fast", "durable"])


def test_tier_rules_without_bundle_data(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    """A bundle records neither the fast tier's free space nor its state before the run (the runner's
    gates measured them): TIER-SPACE and TIER-USABLE are not checked, as DISK-SPACE and
    FOLDER-USABLE are not, rather than passed for want of data."""
    _, b = judge_one(honest_bundles, tmp_path / "t")
    skipped = {n["rule"] for n in b["not_checked"]}
    assert {"DISK-SPACE", "FOLDER-USABLE", "TIER-SPACE", "TIER-USABLE"} <= skipped, b["not_checked"]


def fast_read_from_cache(fast_fs: dict[str, str]) -> Callable[[Path], None]:
    """Restore 2 (fast tier) entirely from the page cache, with run.json naming the fast tier's
    filesystem per host ("HOST": the run's own host)."""
    def name_hosts(run: dict[str, Any]) -> None:
        run["pipeline"]["fast_fs"] = {run["hosts"][0]["host"] if h == "HOST" else h: fs
                                      for h, fs in fast_fs.items()}
    return both(lambda f: edit_json(f, "run.json", name_hosts),
                records(each("read", 2, lambda r: r.update(resident_bytes=r["cached_check_bytes"]))))


@pytest.mark.parametrize(("fast_fs", "exempt"), [
    ({"HOST": "tmpfs"}, True), ({"HOST": "ramfs"}, True),
    ({"HOST": "ext4"}, False),  # a disk: its restores are storage restores and must start cold
    ({"other-host": "tmpfs"}, False),  # memory on another host says nothing of this host's fast tier
])
def test_cold_read_exempts_only_a_memory_backed_fast_tier(honest_bundles: dict[str, Path], tmp_path: Path,
                                                          fast_fs: dict[str, str], exempt: bool) -> None:
    _, b = judge_one(honest_bundles, tmp_path / "t", mutate=fast_read_from_cache(fast_fs))
    cold = [f["message"] for f in b["findings"] if f["rule"] == "COLD-READ"]
    if exempt:
        assert b["findings"] == [] and b["verdict"] == "open"
    else:
        assert cold == ["read 2: restores must start from a cold page cache: expected at most 1% resident "
                        "before a restore, got 100.0% resident"]


def test_host_memory_counts_a_memory_backed_fast_tier(honest_bundles: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """A tmpfs fast tier holds 2 checkpoints (fast_keep 1 + the one in flight) in host memory: the
    checker counts it as the runner's gate does (from run.json's pipeline.fast_fs)."""
    need = 4 * (2 * RANK_BYTES + RING) + 2 * 4 * RANK_BYTES  # state + staging + ring, + the tier
    assert need == 359_071_744

    def tmpfs_short_by_one(f: Path) -> None:
        fast_tier_on("tmpfs")(f)
        edit_json(f, "system.json", setitem("hosts.0.memory_available_bytes", need - 1))
    _, b = judge_one(honest_bundles, tmp_path / "short", mutate=tmpfs_short_by_one)
    [host] = json.loads((honest_bundles[ASYNC] / "run.json").read_text())["hosts"]
    assert [f["message"] for f in b["findings"] if f["rule"] == "HOST-MEMORY"] == [
        f"host {host['host']}: host memory must hold the resident state of its ranks: expected at least "
        "342.44 MiB, got 342.44 MiB available"]

    def tmpfs_exactly(f: Path) -> None:
        fast_tier_on("tmpfs")(f)
        edit_json(f, "system.json", setitem("hosts.0.memory_available_bytes", need))
    _, b = judge_one(honest_bundles, tmp_path / "exact", mutate=tmpfs_exactly)
    assert b["findings"] == []


def test_stages_differing_between_ranks_are_a_finding_not_a_checker_fault(
        honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    """One rank's write skips the fast tier: PIPELINE-DECLARED names it; recomputing the metrics
    (stage timings across ranks) must not turn the bundle into a checker fault."""
    def skip_fast(recs: list[dict[str, Any]]) -> None:
        r = rec(recs, "write", 1, 1)
        r["stages"] = [st for st in r["stages"] if st["tier"] != "fast"]
    report, b = judge_one(honest_bundles, tmp_path / "t", mutate=lambda f: edit_records(f, skip_fast))
    assert not [f for f in b["findings"] if f["rule"] == "INTERNAL"], b["findings"]
    assert report["exit_status"] == 1 and b["verdict"] == "invalid"
    assert any(f["rule"] == "PIPELINE-DECLARED" and f["message"].startswith(
        "write 1 rank 1: every checkpoint follows the configured mode and tiers") and f["message"].endswith(
        "got mode async, stages memory → durable") for f in b["findings"]), b["findings"]


def test_exit_1_for_rule_errors_only(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles, pack_7b=False)
    folder = root / "open" / ORG / "results" / SYSTEM / "llama3_8b" / honest_bundles["llama3_8b"].name
    edit_json(folder, "summary.json", setitem("write_bandwidth_mean_gib_s", 1e6))
    resign(folder, key(honest_bundles, "org"))
    out = tmp_path / "r.json"
    proc = run_cli(str(root), "--json", str(out))
    assert proc.returncode == 1, proc.stdout
    report = json.loads(out.read_text())
    assert report["verdict"] == "invalid"
    assert {f["rule"] for f in report["findings"]} == {"METRICS-RECOMPUTE", "RESULT-VERDICT"}
    assert all({"rule", "severity", "path", "message"} <= set(f) for f in report["findings"])
    fail = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL ")]
    assert fail == [f"FAIL open/{ORG}/results/{SYSTEM}/llama3_8b/{folder.name}"]
    assert "  METRICS-RECOMPUTE [invalid] every reported metric must equal its recomputation" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "checked 2 bundles: 1 valid, 1 invalid (2 findings)"


def test_exit_3_for_untrusted_signer(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles, pack_7b=False)
    folder = root / "open" / ORG / "results" / SYSTEM / "llama_7b" / honest_bundles["llama_7b"].name
    resign(folder, key(honest_bundles, "rogue"))
    proc = run_cli(str(root), "--jobs", "1")
    assert proc.returncode == 3, proc.stdout
    assert ("BUNDLE-KEY [invalid] bundle.dsse.json: the bundle must be signed by a key registered"
            in proc.stdout)
    assert "signed by untrusted key" in proc.stdout
    assert proc.stdout.splitlines()[-1] == ("checked 2 bundles: 1 valid, 1 invalid "
                                            "(1 finding, 1 failed integrity)")


def test_exit_4_for_a_checker_fault_other_bundles_still_checked(
        honest_bundles: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles)
    real = checker.bundle_check.stage_schema

    def broken(st: checker.bundle_check.State) -> None:
        if st.leaf.workload == "llama_7b":
            raise KeyError("deliberate fault")
        real(st)
    monkeypatch.setattr(checker.bundle_check, "PIPELINE", replace_step("schema", broken))
    status = run([str(root), "--jobs", "1", "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert status == 4
    assert "Traceback" not in out + err
    report = json.loads((tmp_path / "r.json").read_text())
    assert_report_valid(report)
    assert report["verdict"] == "internal-error"
    by_workload = {b["workload"]: b for b in report["bundles"]}
    assert by_workload["llama3_8b"]["verdict"] == "open"
    bad = by_workload["llama_7b"]
    assert bad["verdict"] == "internal-error"
    [f] = bad["findings"]
    assert (f["rule"], f["severity"]) == ("INTERNAL", "internal")
    assert "checker fault in stage schema: KeyError" in f["message"]
    assert "not of this submission" in f["message"]
    assert any(line.startswith("ERROR ") for line in out.splitlines())
    assert out.splitlines()[-1].startswith("checked 2 bundles: 1 valid, 0 invalid, 1 checker fault")


def test_exit_4_in_worker_processes_too(honest_bundles: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles)
    monkeypatch.setattr(checker.bundle_check, "PIPELINE", replace_step("rules", lambda st: 1 / 0))
    report = check(root, honest_bundles, jobs=2)
    assert report["exit_status"] == 4
    assert [b["verdict"] for b in report["bundles"]] == ["internal-error"] * 2


@pytest.mark.parametrize(("args", "fragment"), [
    (["/no/such/tree"], "/no/such/tree: not a folder"),
    (["{root}", "--rules", "9.9"], "--rules: unknown rules version '9.9'; known: 1.0"),
    (["{root}", "--jobs", "0"], "--jobs: must be at least 1"),
    (["{root}", "--jobs", "many"], "invalid int value: 'many'"),
    (["{root}", "--trusted-keys", "/no/such/keys.yaml"], "cannot read trusted keys"),
    (["{root}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ([], "the following arguments are required: ROOT"),
])
def test_usage_errors_exit_2_with_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "open").mkdir(parents=True)
    proc = run_cli(*[a.format(root=root) for a in args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and fragment in proc.stderr, proc.stderr
    assert proc.stderr.startswith("mlckpt-check: error: ")


def test_missing_trusted_keys_is_a_usage_error(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles)
    (root / "trusted-keys.yaml").unlink()
    proc = run_cli(str(root))
    assert proc.returncode == 2 and "no trusted keys: give --trusted-keys FILE" in proc.stderr
    proc = run_cli("check", str(root), "--trusted-keys", str(honest_bundles["dir"] / "trusted-keys.yaml"))
    assert proc.returncode == 0, proc.stdout  # explicit subcommand, explicit keys


def test_forced_rules_version_and_jobs_agree(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles)
    a = check(root, honest_bundles, jobs=1)
    b = check(root, honest_bundles, jobs=2, forced_rules="1.22")
    assert a["bundles"] == b["bundles"] and a["exit_status"] == b["exit_status"] == 0
    assert a["rules_versions"] == b["rules_versions"] == ["1.22"]
    # 1.10 knows neither records format 8 nor 1.11's configuration keys: refused by its schemas
    older = check(root, honest_bundles, jobs=2, forced_rules="1.10")
    assert older["exit_status"] == 1 and older["rules_versions"] == ["1.10"]
    assert all("records_format: 7 was expected" in {f["actual"] for f in x["findings"]}
               for x in older["bundles"])
    # An older rules version judges these newer bundles by its own schemas: records format 3 is
    # not one of them, so they fail there (never silently pass).
    old = check(root, honest_bundles, jobs=2, forced_rules="1.1")
    assert old["exit_status"] == 1 and old["rules_versions"] == ["1.1"]
    assert all("BUNDLE-SCHEMA" in {f["rule"] for f in b["findings"]} for b in old["bundles"])


def test_tree_layout_findings(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles)
    (root / "open" / ORG / "notes.txt").write_text("x")
    (root / "drafts").mkdir()
    os.symlink(root / "open" / ORG / "results", root / "open" / ORG / "results-link")
    (root / "open" / ORG / "systems" / "unused.yaml").write_text("system_name: [")
    report = check(root, honest_bundles)
    assert report["exit_status"] == 1
    assert all(b["verdict"] == "open" for b in report["bundles"])
    got = {(f["rule"], f["path"]) for f in report["tree_findings"]}
    assert got == {("BUNDLE-LAYOUT", "drafts"), ("BUNDLE-LAYOUT", f"open/{ORG}/notes.txt"),
                   ("BUNDLE-LAYOUT", f"open/{ORG}/results-link"),
                   ("SYSTEM-DESCRIPTION", f"open/{ORG}/systems/unused.yaml")}
    assert any("a symlink" in f["message"] for f in report["tree_findings"])


def test_empty_tree_is_invalid(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "t" / "open").mkdir(parents=True)
    report = check(tmp_path / "t", honest_bundles)
    assert report["exit_status"] == 1
    assert [f["actual"] for f in report["tree_findings"]] == ["no bundles found"]


def test_symlinked_bundle_is_not_followed(honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles)
    wdir = root / "open" / ORG / "results" / SYSTEM / "llama3_8b"
    os.symlink(honest_bundles["llama3_8b"], wdir / "0000000000000abc")
    report = check(root, honest_bundles)
    [b] = [b for b in report["bundles"] if b["path"].endswith("0000000000000abc")]
    assert [f["rule"] for f in b["findings"]] == ["BUNDLE-PATHS"]
    assert report["exit_status"] == 3


def test_human_output_escapes_control_characters(honest_bundles: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root = honest_tree(tmp_path / "t", honest_bundles, pack_7b=False)
    folder = root / "open" / ORG / "results" / SYSTEM / "llama3_8b" / honest_bundles["llama3_8b"].name
    edit_json(folder, "run.json", setitem("hosts.0.host", "evil\x1b[2J\r\nhost"))
    resign(folder, key(honest_bundles, "org"))
    assert run([str(root), "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert "evil\\x1b[2J\\r\\nhost" in out


def test_a_finding_is_listed_under_the_path_of_the_place_it_names() -> None:
    """The report's path comes from the finding's place (Finding.where), never from its wording."""
    from checker.rulesets import finding_dict
    from mlckpt.rules.engine import Finding, Outcome, make_finding

    rules = load_rules(DEFAULT_RULES_VERSION)
    rule = rules.rules[0]
    placed = make_finding(rule, Outcome(False, 1, 2, where="records.jsonl"))
    assert placed.where == "records.jsonl" and placed.message.startswith("records.jsonl: ")
    paths = {"records.jsonl": "org/results/sys/w/r1/records.jsonl",
             "run.json": "org/results/sys/w/r1/run.json"}
    assert finding_dict(placed, "org/results/sys/w/r1", paths)["path"] == paths["records.jsonl"]
    # a message that merely begins like a place is the bundle's
    worded = Finding(rule.id, rule.severity, "run.json: looks placed", where=None)
    assert finding_dict(worded, "org/results/sys/w/r1", paths)["path"] == "org/results/sys/w/r1"
    unknown = make_finding(rule, Outcome(False, 1, 2, where="host-a"))
    assert finding_dict(unknown, "org/results/sys/w/r1", paths)["path"] == "org/results/sys/w/r1"
