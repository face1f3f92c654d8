"""Synthetic, valid, deterministic bundles: what the leaderboard, compare and the browser tests
build their trees from.  Each bundle is signed by its organisation's key (derived from its name),
its records are made from the bandwidths asked for, and its summary is the checker's own
recomputation, so the checker passes it as it would a real one.  ``GOLDEN_TREE`` is the tree of
the golden outputs (every class kind, a packed bundle, repeated rank counts, missing values)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from checker import cli
from mlckpt import __version__, bundle
from mlckpt.plan.config import setup
from mlckpt.rules import HostSpec, rank_shift, verdict
from mlckpt.rules.checks.evidence import recomputed_summary
from mlckpt.rules.rundata import DATA_SCHEME, RunData
from mlckpt.units import GiB as GIB
from mlckpt.workload.pipeline import DURABLE, FAST, MEMORY, Pipeline

# ----------------------------------------------------------------------------------------------
# Synthetic, valid, deterministic bundles


SYNTHETIC_RECORDS_FORMAT = 2  # records format of rules 1.1


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


@dataclass(frozen=True)
class Spec:
    """One synthetic bundle: whose, what it ran, and how fast each stage went.

    Checkpoint pipeline (mlckpt/workload/pipeline.py): ``mode`` sync|async, ``fast`` the fast-tier
    folder (tiered), ``compute_s`` the training interval.  Stage speeds: ``memory_gib_s`` (the copy
    into host staging), ``fast_gib_s`` (the fast-tier write), ``write_gib_s`` (the durable tier: the
    whole write in sync one-tier runs, else the background persist or drain); restores read at
    ``read_gib_s`` from the durable tier and at ``fast_read_gib_s`` from the fast tier."""

    org: str
    system: str
    workload: str
    division: str = "open"
    ranks: int = 4
    hosts: int = 1
    scale: float = 1.0
    writes: int = 2
    reads: int = 2
    write_gib_s: float = 10.0
    read_gib_s: float = 12.0
    straggle: float = 1.2
    seed: int = 0
    accelerator: str | None = None
    desc_accelerator: str | None = None
    extra: Sequence[str] = ()
    started: str = "2026-01-02T03:04:05.000Z"
    run_id: str | None = None
    pack: bool = False
    tree_division: str | None = None
    mode: str = "sync"
    fast: str | None = None
    fast_keep: int = 1
    compute_s: float = 0.0
    memory_gib_s: float = 200.0
    fast_gib_s: float = 60.0
    fast_read_gib_s: float = 80.0
    fast_fs: str = "xfs"

    def overrides(self) -> list[str]:
        # Synthetic records carry no kernel counters: they are judged by rules 1.1 (records
        # format 2), which the checker keeps for bundles made under it.
        out = ["rules_version=1.1", f"workload={self.workload}", f"division={self.division}",
               f"ranks={self.ranks}", f"checkpoint.num_writes={self.writes}",
               f"checkpoint.num_reads={self.reads}"]
        if self.mode != "sync":
            out.append(f"checkpoint.mode={self.mode}")
        if self.fast is not None:
            out += [f"checkpoint.tiers.fast={self.fast}", f"checkpoint.tiers.fast_keep={self.fast_keep}"]
        if self.compute_s:
            out.append(f"checkpoint.compute_interval_s={self.compute_s}")
        if self.scale != 1.0:
            out.append(f"scale={self.scale}")
        if self.accelerator:
            out.append(f"accelerator={self.accelerator}")
        return [*out, *self.extra, f"system={self.system}.yaml"]


def make_bundle(root: Path, **fields: Any) -> Path:
    """Write one signed bundle of ``Spec(**fields)`` into ``root`` (tree layout, under its
    ``tree_division``/ if given, else its own division) and return its folder (or archive, with
    ``pack``)."""
    spec = Spec(**fields)
    s = setup(spec.overrides())
    rng = random.Random(f"{spec.division}/{spec.org}/{spec.system}/{spec.workload}/{spec.ranks}/{spec.scale}/"
                        f"{spec.seed}")
    run_id = spec.run_id or f"{rng.getrandbits(64):016x}"
    per_host = spec.ranks // spec.hosts
    hosts = tuple(HostSpec(f"{spec.system}-n{h:02d}", tuple(range(h * per_host, (h + 1) * per_host)),
                           (4 << 40) - (1 << 30)) for h in range(spec.hosts))
    ctx = s.context(hosts, complete=True)
    timeline = Timeline(spec, s.config, rng, {r: h.name for h in hosts for r in h.ranks})
    records = timeline.run(s.plan, rank_shift(ctx))
    org_dir = root / (spec.tree_division or spec.division) / spec.org
    desc_path = org_dir / "systems" / f"{spec.system}.yaml"
    # One description per system (the first bundle of a system writes it; later ones embed it).
    desc = (yaml.safe_load(desc_path.read_text()) if desc_path.is_file() else
            system_description(spec.system, spec.org, accelerator=spec.desc_accelerator or spec.accelerator,
                               clients=spec.hosts))
    sysdoc = {"hosts": [_host_facts(h.name) for h in hosts], "description": desc}
    manifest = _manifest(spec, s, run_id, hosts, rank_shift(ctx))
    # summary.json as the runner writes it: the checker's own recomputation
    summary = recomputed_summary(s.rules, RunData(manifest, s.config, {}, records, sysdoc), s.plan)
    found = [*s.rules.evaluate(ctx, ["config", "host"]).findings,
             *s.rules.evaluate(replace(ctx, run=RunData(manifest, s.config, summary, records, sysdoc)),
                               ["result"]).findings]
    manifest["findings"] = [f.to_dict() for f in found]
    manifest["verdict"] = verdict(found, spec.division)
    (org_dir / "systems").mkdir(parents=True, exist_ok=True)
    (org_dir / "systems" / f"{spec.system}.yaml").write_text(yaml.safe_dump(desc, sort_keys=True))
    folder = org_dir / "results" / spec.system / spec.workload / str(manifest["name"])
    _write(folder, manifest, s.config, records, summary, sysdoc)
    bundle.sign_bundle(folder, org_key(spec.org), bundle.Predicate(
        run_id=run_id, mlckpt_version=__version__, runner_code_sha256="0" * 64,
        rules_version=s.rules.version, workload=spec.workload, division=spec.division, started=spec.started,
        ended=manifest["ended"], extra={"ranks": spec.ranks, "scaled": manifest["scaled"],
                                        "verdict": manifest["verdict"]}))
    _trust(root, spec.org)
    if spec.pack:
        archive = bundle.pack(folder, folder.parent / f"{manifest['name']}.tar.gz")
        shutil.rmtree(folder)
        return archive
    return folder


class Timeline:
    """The records of a synthetic run, op by op on one clock: each rank's share of an op at the
    asked speed, one rank the slowest and the others up to ``straggle`` faster."""

    def __init__(self, spec: Spec, cfg: Any, rng: random.Random, host_of: dict[int, str]) -> None:
        self.spec, self.cfg, self.rng, self.host_of = spec, cfg, rng, host_of
        self.pipe = Pipeline.of(cfg)
        self.records: list[dict[str, Any]] = []
        self.t = 1_000_000_000_000 + rng.randrange(10**9)
        self.wall = 1_800_000_000.0
        self.compute_ns = int(spec.compute_s * 1e9) + 1_000_000  # the interval, plus making the next one
        self.durable_at: dict[int, int] = {}  # rank -> when its previous checkpoint became durable
        self.last: dict[int, dict[str, Any]] = {}  # rank -> its previous write record

    def run(self, plan: Any, shift: int) -> list[dict[str, Any]]:
        spec, pipe = self.spec, self.pipe
        restore = str(self.cfg["checkpoint"]["restore"])
        w = [(sum(f.bytes for f in rp.files), len(rp.files)) for rp in plan.rank_plans]
        rd = []
        for r in range(spec.ranks):
            files = [x.file for x in plan.restore_reads(r, restore, shift)]
            rd.append((sum(f.bytes for f in files), len(files)))
        for k in range(1, spec.writes + 1):
            if pipe.background:
                self.pipelined_write(k, w)
            else:
                self.op("write", k, k, w, spec.write_gib_s)
        if pipe.background:
            self.final_drain()
        for k in range(1, spec.reads + 1):
            ckpt = (k - 1) % spec.writes + 1
            writers = [{self.host_of[x.writer] for x in plan.restore_reads(r, restore, shift)}
                       for r in range(spec.ranks)]
            tiers = [pipe.restore_tier(ckpt, spec.writes, writers[r], self.host_of[r])
                     for r in range(spec.ranks)]
            self.op("read", k, ckpt, rd, spec.fast_read_gib_s if set(tiers) == {FAST} else spec.read_gib_s,
                    tiers)
        return self.records

    def _factor(self, r: int, slow: int) -> float:
        s = self.spec.straggle
        return 1.0 if r == slow else self.rng.uniform(1 / s, 1 / s + (1 - 1 / s) * 0.5)

    def op(self, kind: str, index: int, ckpt: int, per_rank: list[tuple[int, int]], gib_s: float,
           tiers: Sequence[str] = ()) -> None:
        """A sync one-tier write (the stage is the whole op, barrier to durable) or a restore."""
        rng, io_cfg = self.rng, self.cfg["io"]
        total = sum(b for b, _ in per_rank)
        dur = total / (gib_s * GIB) * rng.uniform(0.95, 1.05)
        slow = rng.randrange(self.spec.ranks)
        end = self.t
        for r, (nbytes, nfiles) in enumerate(per_rank):
            f = self._factor(r, slow)
            t0 = self.t + rng.randrange(20_000)
            t1 = t0 + max(1, int(dur * f * 1e9))
            end = max(end, t1)
            rec: dict[str, Any] = {"op": kind, "index": index, "checkpoint": ckpt, "rank": r,
                                   "host": self.host_of[r], "t0_ns": t0, "t1_ns": t1,
                                   "wall_start": round(self.wall, 6), "bytes": nbytes, "files": nfiles,
                                   "fsync": kind == "write", "direct": io_cfg["direct"],
                                   "dontcache": io_cfg["dontcache"]}
            if kind == "read":
                rec.update(resident_bytes=0, cached_check_bytes=nbytes, verified_bytes=nbytes, mismatches=0,
                           tier=tiers[r])
            else:
                stage = {"tier": DURABLE, "t0_ns": t0, "t1_ns": t1, "bytes": nbytes,
                         "direct": io_cfg["direct"]}
                rec.update(mode="sync", staged_ns=t1, backpressure_ns=0, exposed_ns=0,
                           compute_ns=self.compute_ns, stages=[stage])
            self.records.append(rec)
        self.wall += (end - self.t) / 1e9 + 1.0
        self.t = end + 1_000_000_000

    def pipelined_write(self, k: int, per_rank: list[tuple[int, int]]) -> None:
        """An async and/or tiered write, per rank: the back-pressure wait (the previous checkpoint
        still in the background), the blocking stage, then the background stages while training
        goes on for ``compute_ns`` (mlckpt/run/phases/writes.py: WritePhase.checkpoint)."""
        spec, rng, pipe = self.spec, self.rng, self.pipe
        speed = {MEMORY: spec.memory_gib_s, FAST: spec.fast_gib_s, DURABLE: spec.write_gib_s}
        total = sum(b for b, _ in per_rank)
        spans = {stage: (total / (speed[stage] * GIB) * rng.uniform(0.95, 1.05), rng.randrange(spec.ranks))
                 for stage in pipe.stages}
        resume = self.t
        for r, (nbytes, nfiles) in enumerate(per_rank):
            t0 = self.t + rng.randrange(20_000)
            bp = max(0, self.durable_at.get(r, 0) - t0)
            if r in self.last:
                self.last[r]["exposed_ns"] = bp
            stages = self._stages(r, nbytes, t0 + bp + 2_000, spans)
            staged = stages[0]["t1_ns"] + 1_000
            rec = self._write_record(k, r, t0, stages, nbytes, nfiles, staged, bp)
            self.records.append(rec)
            self.last[r] = rec
            self.durable_at[r] = rec["t1_ns"]
            resume = max(resume, staged + self.compute_ns)
        self.wall += (resume - self.t) / 1e9
        self.t = resume + 50_000  # the next checkpoint's barrier

    def _stages(self, r: int, nbytes: int, clock: int, spans: dict[str, tuple[float, int]]
                ) -> list[dict[str, Any]]:
        stages = []
        for i, stage in enumerate(self.pipe.stages):
            dur, slow = spans[stage]
            end = clock + max(1, int(dur * self._factor(r, slow) * 1e9))
            st: dict[str, Any] = {"tier": stage, "t0_ns": clock, "t1_ns": end, "bytes": nbytes}
            if stage != MEMORY:
                st["direct"] = self.cfg["io"]["direct"]
            if stage == DURABLE:  # a drain from the fast tier verifies every page
                st.update(verified_bytes=nbytes, mismatches=0)
            stages.append(st)
            clock = st["t1_ns"] + (1_000 if i == 0 else 3_000)
        if not self.pipe.tiered:
            del stages[-1]["verified_bytes"], stages[-1]["mismatches"]
        return stages

    def _write_record(self, k: int, r: int, t0: int, stages: list[dict[str, Any]], nbytes: int, nfiles: int,
                      staged: int, bp: int) -> dict[str, Any]:
        io_cfg = self.cfg["io"]
        return {"op": "write", "index": k, "checkpoint": k, "rank": r, "host": self.host_of[r],
                "t0_ns": t0, "t1_ns": stages[-1]["t1_ns"], "wall_start": round(self.wall, 6), "bytes": nbytes,
                "files": nfiles, "fsync": True, "direct": io_cfg["direct"],
                "dontcache": io_cfg["dontcache"], "mode": self.pipe.mode, "staged_ns": staged,
                "backpressure_ns": bp, "exposed_ns": 0, "compute_ns": self.compute_ns, "stages": stages}

    def final_drain(self) -> None:
        """After the last checkpoint: wait until it is durable (that wait is its exposed time)."""
        end = self.t
        for rec in self.last.values():
            trained = rec["staged_ns"] + self.compute_ns
            rec["exposed_ns"] = max(0, rec["t1_ns"] - trained)
            end = max(end, rec["t1_ns"], trained)
        self.wall += (end - self.t) / 1e9 + 1.0
        self.t = end + 1_000_000_000


def _manifest(spec: Spec, s: Any, run_id: str, hosts: Sequence[HostSpec], shift: int) -> dict[str, Any]:
    cfg, pipe = s.config, Pipeline.of(s.config)
    stamp = spec.started.replace("-", "").replace(":", "")[:15] + "Z"
    return {
        "run_format": 2, "run_id": run_id, "name": f"{stamp}-{spec.workload}-{spec.ranks}r-{run_id}",
        "status": "complete", "mlckpt_version": __version__, "rules_version": s.rules.version,
        "workload": spec.workload, "division": spec.division, "scaled": spec.scale != 1.0,
        "scale": cfg["scale"],
        "ranks": spec.ranks, "hosts": [{"host": h.name, "ranks": list(h.ranks)} for h in hosts],
        "rank_shift": shift, "verdict": "", "findings": [], "overrides": spec.overrides(),
        "started": spec.started, "ended": spec.started[:11] + "23:59:59.000Z",
        "records_format": SYNTHETIC_RECORDS_FORMAT, "data_scheme": DATA_SCHEME, "system_name": spec.system,
        "pipeline": {"mode": pipe.mode, "compute_interval_s": pipe.compute_interval_s, "fast": pipe.fast,
                     "fast_keep": pipe.fast_keep,
                     "fast_fs": {h.name: spec.fast_fs for h in hosts} if pipe.tiered else {}},
    }


def _write(folder: Path, manifest: dict[str, Any], cfg: Any, records: list[dict[str, Any]],
           summary: dict[str, Any], sysdoc: dict[str, Any]) -> None:
    folder.mkdir(parents=True)

    def dump(fname: str, doc: Any) -> None:
        (folder / fname).write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")

    dump("run.json", manifest)
    (folder / "config.yaml").write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    (folder / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    dump("summary.json", summary)
    dump("system.json", sysdoc)
    (folder / "run.log").write_text(f"synthetic test run {manifest['name']}\n")


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
    # Open, scaled by another factor (the laptop preset's): its own class, never ranked beside ×0.01.
    {"org": "zeta", "system": "z1", "workload": "llama3_8b", "ranks": 8, "scale": 0.0125,
     "write_gib_s": 7.0, "read_gib_s": 9.0},
    # Open, full scale, other workloads: restore=repopulate, markup in a description, no reads.
    {"org": "zeta", "system": "z2", "workload": "llama_7b", "ranks": 4,
     "extra": ("checkpoint.restore=repopulate",), "desc_accelerator": "<b>mi300x</b> | 8/node",
     "write_gib_s": 11.0, "read_gib_s": 14.0},
    {"org": "acme", "system": "fast", "workload": "llama_7b_zero3", "ranks": 4, "reads": 0,
     "write_gib_s": 9.5},
    # Open, scaled, asynchronous and tiered checkpoints: each mode its own class.  Async: training
    # waits for the copy into host memory (~1 GiB at 150 GiB/s); acme's persist (20 GiB/s) fits in
    # the 0.2 s of training, zeta's (8 GiB/s, 0.5 GiB) does not fit in 0.02 s: back-pressure.
    {"org": "acme", "system": "fast", "workload": "llama3_8b", "ranks": 8, "scale": 0.01, "seed": 2,
     "writes": 3, "mode": "async", "compute_s": 0.2, "memory_gib_s": 150.0, "write_gib_s": 20.0,
     "read_gib_s": 24.0},
    {"org": "zeta", "system": "z1", "workload": "llama3_8b", "ranks": 4, "scale": 0.01, "seed": 2,
     "writes": 3, "mode": "async", "compute_s": 0.02, "memory_gib_s": 100.0, "write_gib_s": 8.0,
     "read_gib_s": 10.0},
    # Sync with a fast tier (60 GiB/s) drained at 12 GiB/s: restore 1 from the durable tier, restore
    # 2 from the fast tier (it keeps the newest checkpoint).
    {"org": "acme", "system": "fast", "workload": "llama3_8b", "ranks": 8, "scale": 0.01, "seed": 4,
     "fast": "/mnt/nvme/ckpt", "compute_s": 0.5, "fast_gib_s": 60.0, "write_gib_s": 12.0,
     "read_gib_s": 14.0, "fast_read_gib_s": 70.0},
    # Async with a memory-backed fast tier keeping both checkpoints: every restore from the fast
    # tier, so no read bandwidth of the durable tier to show.
    {"org": "zeta", "system": "z1", "workload": "llama3_8b", "ranks": 4, "scale": 0.01, "seed": 3,
     "mode": "async", "fast": "/dev/shm/ckpt", "fast_keep": 2, "fast_fs": "tmpfs", "compute_s": 0.1,
     "memory_gib_s": 120.0, "fast_gib_s": 40.0, "write_gib_s": 9.0, "fast_read_gib_s": 90.0},
)


def build_tree(root: Path, spec: Sequence[dict[str, Any]] = GOLDEN_TREE) -> Path:
    for kw in spec:
        make_bundle(root, **kw)
    return root


def lb_cli(root: Path, fmt_name: str, out: Path, *extra: str) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    status = cli.run(["leaderboard", str(root), "--format", fmt_name, "--out", str(out), *extra])
    assert status == 0
    return out.read_text(encoding="utf-8")


def board_json(root: Path, tmp: Path) -> dict[str, Any]:
    return json.loads(lb_cli(root, "json", tmp / "lb.json"))


