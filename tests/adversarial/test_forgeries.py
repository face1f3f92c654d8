"""The forgery suite: a trusted vendor edits real runner bundles to look better and re-signs them
with its own trusted key through the project's signing.  Every integrity rule then holds; each
forgery must still fail, under the rule named for it (and only rules expected to see the same
edit), while the honest neighbours in the same tree pass.

The bundles come from real ``mlckpt run``s on this machine's disk (sync with O_DIRECT, buffered
with and without fsync, asynchronous, tiered, on tmpfs); each forgery sits in a tree of its own
beside two honest neighbours, with the tree's trusted keys and released runners.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import paths
from support.forge import (
    Rec,
    edit_json,
    edit_records,
    edit_yaml,
    end_of,
    read_json,
    read_records,
    resign,
    resummarize,
    set_duration,
    shift,
)

from checker.tree_check import check_tree
from mlckpt import bundle
from mlckpt.bundle.released import entry
from mlckpt.rules import load_rules
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import workload_from_config

MLCKPT = Path(sys.executable).parent / "mlckpt"
REPO = paths.REPO
ORG, SYSTEM = "example-org", "laptop-ext4"
DESCRIPTION = """\
description_format: 1
system_name: {name}
submitter: Example Org
availability: available
storage: {{product: ext4 on virtio, type: local-nvme, usable_capacity_tib: 1,
          max_write_gib_s: 100, max_read_gib_s: 100}}
clients: {{count: 1, model: test VM, memory_gib: 24}}
network: {{type: none}}
"""
COMMON = ("workload=llama3_8b", "division=open", "ranks=4", "system=laptop-ext4.yaml")
# name -> overrides.  Ops of ~0.1-0.5 s on this machine's disk: long enough that an edit worth
# making exceeds the bounds of rules.yaml's ``evidence``.
RUNS: dict[str, tuple[str, ...]] = {
    "sync": ("scale=0.006", "checkpoint.num_writes=3", "checkpoint.num_reads=3", "io.direct=true"),
    "neighbour": ("scale=0.006", "checkpoint.num_writes=2", "checkpoint.num_reads=2", "io.direct=true"),
    "async": (
        "scale=0.006",
        "checkpoint.num_writes=3",
        "checkpoint.num_reads=2",
        "io.direct=true",
        "checkpoint.mode=async",
        "checkpoint.compute_interval_s=0.05",
    ),
    "neighbour_async": (
        "scale=0.002",
        "checkpoint.num_writes=2",
        "checkpoint.num_reads=1",
        "io.direct=false",
        "checkpoint.mode=async",
        "checkpoint.compute_interval_s=0.2",
    ),
    "buffered": ("scale=0.004", "checkpoint.num_writes=2", "checkpoint.num_reads=2", "io.direct=false"),
    "nofsync": (
        "scale=0.004",
        "checkpoint.num_writes=2",
        "checkpoint.num_reads=1",
        "io.direct=false",
        "checkpoint.fsync=false",
    ),
    "tiers": (
        "scale=0.002",
        "checkpoint.num_writes=2",
        "checkpoint.num_reads=2",
        "io.direct=false",
        "checkpoint.tiers.fast=fast",
    ),
    "memtiers": (
        "scale=0.002",
        "checkpoint.num_writes=2",
        "checkpoint.num_reads=2",
        "io.direct=false",
        "checkpoint.tiers.fast=/dev/shm/mlckpt-forgeries-fast",
    ),
    "tmpfs": (
        "scale=0.002",
        "checkpoint.num_writes=1",
        "checkpoint.num_reads=1",
        "io.direct=false",
        "checkpoint.folder=/dev/shm/mlckpt-forgeries",
        "rules_version=1.8",  # from 1.9 a folder in memory is refused before any I/O (MEMORY-FOLDER)
    ),
}
NEIGHBOURS = ("neighbour", "neighbour_async")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real bundles, signed with keys/org.pem (trusted for example-org), plus the keys."""
    d = tmp_path_factory.mktemp("forgeries")
    for name in ("org", "other"):
        bundle.generate_key(d / "keys" / f"{name}.pem")
    (d / "laptop-ext4.yaml").write_text(DESCRIPTION.format(name=SYSTEM))
    # the forgeries need honest bases: beside a busy machine a try may come out disturbed, so each
    # run is tried up to six times (each try keeps its bundle; the last printed is the result's)
    env = {**os.environ, "XDG_CONFIG_HOME": str(d / "xdg"), "MLCKPT_RETRY_DISTURBED": "5"}
    env.pop("MLCKPT_DEBUG", None)
    out = {"dir": d}
    for name, extra in RUNS.items():
        if name in ("tmpfs", "memtiers") and not Path("/dev/shm").is_dir():
            continue
        folder = () if any(a.startswith("checkpoint.folder=") for a in extra) else ("checkpoint.folder=ck",)
        proc = subprocess.run(
            [
                str(MLCKPT),
                "run",
                *COMMON,
                *extra,
                *folder,
                f"signing.key={d / 'keys' / 'org.pem'}",
                f"output.root=results/{name}",
            ],
            cwd=d,
            env=env,
            text=True,
            capture_output=True,
            timeout=900,
            check=False,
        )
        # the tmpfs run restores from memory: verdict invalid, exit 5 (its bundle is kept)
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith(("finding:", "warning:"))]
        assert proc.returncode == (5 if name == "tmpfs" else 0), (name, proc.stderr, found)
        for _ in range(4):
            if name != "tmpfs" or not any("[RECORDS-SKEW]" in ln for ln in found):
                break
            # rules 1.8's 10 ms skew floor: a rank descheduled on a busy machine (rules 1.10 raised
            # it); the forgeries need a base whose only fault is its warm restores, so run again
            proc = subprocess.run(proc.args, cwd=d, env=env, text=True, capture_output=True, timeout=300,
                                  check=False)
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith(("finding:", "warning:"))]
            assert proc.returncode == 5, (proc.stderr, found)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("bundle: ")][-1]  # the last try's
        out[name] = Path(line[len("bundle: ") :])
    return out


# ------------------------------------------------------------------------------ the forgeries
Edit = Callable[[Path, dict[str, Path]], None]


@dataclass(frozen=True)
class Forgery:
    name: str
    source: str  # which run it is made from
    edit: Edit
    fragment: str  # part of the named rule's message
    also: frozenset[str] = field(default_factory=frozenset)  # other rules the same edit may reach
    system: str = SYSTEM
    org: str = ORG
    signer: str = "org"
    # the named rule's severity: a disturbed rule's forgery is invalid only where an invalid rule of
    # ``also`` fired too (an op recorded shorter than the busy host's late counters allow)
    verdict: str = "invalid"


def recs_edit(fn: Callable[[list[Rec]], Any], *, summary: bool = True) -> Edit:
    def edit(folder: Path, _: dict[str, Path]) -> None:
        edit_records(folder, lambda rs: [fn(rs), None][1])
        if summary:
            resummarize(folder)

    return edit


def doc_edit(name: str, fn: Callable[[Any], Any]) -> Edit:
    def edit(folder: Path, _: dict[str, Path]) -> None:
        (edit_yaml if name.endswith(".yaml") else edit_json)(folder, name, fn)

    return edit


def chain(*edits: Edit) -> Edit:
    def edit(folder: Path, runs: dict[str, Path]) -> None:
        for e in edits:
            e(folder, runs)

    return edit


def ops(recs: list[Rec], op: str) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for r in recs:
        if r["op"] == op:
            out.setdefault(r["index"], []).append(r)
    return out


def dur(r: Rec) -> int:
    return end_of(r) - r["t0_ns"]


def faster(op: str, factor: float, *, later_start: bool = False) -> Callable[[list[Rec]], None]:
    """Every ``op`` ``factor``× shorter: its end earlier (or its start later)."""

    def fn(recs: list[Rec]) -> None:
        for group in ops(recs, op).values():
            for r in group:
                set_duration(r, int(dur(r) / factor), from_start=later_start)

    return fn


def slow_ranks_start_late(recs: list[Rec]) -> None:
    """Ranks slower than the median claim they left the barrier late: 0.6 × the median."""
    for group in ops(recs, "read").values():
        med = sorted(dur(r) for r in group)[len(group) // 2]
        for r in group:
            if dur(r) >= med:
                set_duration(r, int(0.6 * med), from_start=True)


def slow_ranks_start_a_little_late(recs: list[Rec]) -> None:
    """Ranks slower than the median claim they left the barrier late, by less than RECORDS-SKEW's
    bound: each shortened to the median, but by at most 10 % of its time (the host's first rank to
    leave stays: moving it moves the whole host's start, COUNTERS-LATE's to judge)."""
    for kind in ("write", "read"):
        for group in ops(recs, kind).values():
            med = sorted(dur(r) for r in group)[len(group) // 2 - 1]
            first = min(r["t0_ns"] for r in group)
            for r in group:
                if dur(r) > med and r["t0_ns"] != first:  # (a few µs apart: no two ranks' times alike)
                    set_duration(r, max(med + 7919 * (r["rank"] + 1), int(0.9 * dur(r))), from_start=True)


def per_rank_summary(folder: Path) -> None:
    """summary.json as rules 1.19 timed an op (each rank from its own start), labelled 1.20's."""
    from mlckpt.metrics import summarize

    resummarize(folder)
    mine = summarize(read_records(folder), max_resident_fraction=1.0, summary_format=9)

    def fn(summary: dict[str, Any]) -> None:
        for key in ("write_bandwidth_mean_gib_s", "read_bandwidth_mean_gib_s", "write_duration_mean_s",
                    "read_duration_mean_s"):
            summary[key] = mine[key]

    edit_json(folder, "summary.json", fn)


def slowest_copies_fastest(recs: list[Rec]) -> None:
    for op in ("write", "read"):
        for group in ops(recs, op).values():
            fast, slow = min(group, key=dur), max(group, key=dur)
            new = copy.deepcopy(fast)
            new["rank"] = slow["rank"]
            new.pop("host_counters", None)
            if "host_counters" in slow:
                new["host_counters"] = slow["host_counters"]
            recs[recs.index(slow)] = new


def op_copied(recs: list[Rec]) -> None:
    """Restore 3 given restore 2's per-rank durations."""
    reads = ops(recs, "read")
    for a, b in zip(
        sorted(reads[2], key=lambda r: r["rank"]), sorted(reads[3], key=lambda r: r["rank"]), strict=True
    ):
        b["t1_ns"] = b["t0_ns"] + dur(a)


def rank_copied(recs: list[Rec]) -> None:
    """Rank 3's write durations given rank 1's, op by op."""
    for group in ops(recs, "write").values():
        src, dst = (next(r for r in group if r["rank"] == k) for k in (1, 3))
        set_duration(dst, dur(src))


def drop_op(op: str) -> Callable[[list[Rec]], list[Rec]]:
    """The slowest ``op`` but the first and the last removed, the later ones renumbered (the count
    is fixed in the config).  (Dropping the first or the last op leaves no gap between two ops'
    counters: see the README.)"""

    def fn(recs: list[Rec]) -> list[Rec]:
        groups = ops(recs, op)
        middle = [k for k in groups if 1 < k < len(groups)]
        worst = max(middle, key=lambda k: max(dur(r) for r in groups[k]))
        kept = [r for r in recs if not (r["op"] == op and r["index"] == worst)]
        nw = len(ops(recs, "write")) - (op == "write")
        for r in kept:
            if r["op"] == op and r["index"] > worst:
                r["index"] -= 1
                if op == "write":
                    r["checkpoint"] -= 1
            if r["op"] == "read":
                r["checkpoint"] = (r["index"] - 1) % nw + 1
        return kept

    return fn


def drop_op_edit(op: str) -> Edit:
    key = "num_writes" if op == "write" else "num_reads"

    def edit(folder: Path, _: dict[str, Path]) -> None:
        edit_records(folder, drop_op(op))
        edit_yaml(folder, "config.yaml", lambda c: c["checkpoint"].__setitem__(key, c["checkpoint"][key] - 1))
        resummarize(folder)

    return edit


def drop_slowest_rank(adjust: bool) -> Edit:
    def edit(folder: Path, _: dict[str, Path]) -> None:
        recs = read_records(folder)
        totals: dict[int, int] = {}
        for r in recs:
            totals[r["rank"]] = totals.get(r["rank"], 0) + dur(r)
        slow = max((k for k in totals if k != 0), key=lambda k: totals[k])
        kept = [r for r in recs if r["rank"] != slow]
        if adjust:
            for r in kept:
                r["rank"] -= r["rank"] > slow
        edit_records(folder, lambda _: kept)
        if adjust:
            edit_yaml(folder, "config.yaml", lambda c: c.__setitem__("ranks", 3))
            edit_json(
                folder, "run.json", lambda r: r.update(ranks=3, hosts=[{**r["hosts"][0], "ranks": [0, 1, 2]}])
            )
        resummarize(folder)

    return edit


def full_scale() -> Edit:
    """The scaled run labelled full scale: the full plan's bytes per rank, the times kept."""

    def edit(folder: Path, _: dict[str, Path]) -> None:
        config = read_json_yaml(folder)
        plan = make_plan(workload_from_config(config["workload"]), int(config["ranks"]), 1.0)

        def fn(recs: list[Rec]) -> None:
            for r in recs:
                files = plan.rank_plans[r["rank"]].files
                r["bytes"] = sum(f.bytes for f in files)
                for key in ("resident_bytes", "cached_check_bytes", "verified_bytes"):
                    if key in r:
                        r[key] = r["bytes"] if key != "resident_bytes" else 0
                for st in r.get("stages", ()):
                    st["bytes"] = r["bytes"]

        edit_records(folder, fn)
        edit_yaml(folder, "config.yaml", lambda c: c.__setitem__("scale", 1.0))
        edit_json(folder, "run.json", lambda r: r.update(scale=1.0, scaled=False))
        resummarize(folder)

    return edit


def relabel(workload: str) -> Edit:
    """The run presented as another workload (its definition in config.yaml, its name in
    run.json and the predicate), the records untouched."""

    def edit(folder: Path, _: dict[str, Path]) -> None:
        import yaml

        other = yaml.safe_load((REPO / "workloads" / "workload" / f"{workload}.yaml").read_text())

        def fn(c: dict[str, Any]) -> None:
            c["workload"].update(name=workload, model=other["model"], parallelism=other["parallelism"])

        edit_yaml(folder, "config.yaml", fn)
        edit_json(folder, "run.json", lambda r: r.update(workload=workload))

    return edit


def read_json_yaml(folder: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((folder / "config.yaml").read_text())


def two_hosts(boot: bool, counters: bool = False) -> Edit:
    """Ranks 2-3 relabelled as a second host, "vm-b", with host facts copied from the first."""

    def edit(folder: Path, _: dict[str, Path]) -> None:
        recs = read_records(folder)
        first = recs[0]["host"]
        for r in recs:
            if r["rank"] >= 2:
                r["host"] = "vm-b"
        edit_records(folder, lambda _: recs)

        def hosts(run: dict[str, Any]) -> None:
            run["hosts"] = [{"host": first, "ranks": [0, 1]}, {"host": "vm-b", "ranks": [2, 3]}]
            if run.get("calibration"):  # rules 1.8: the invented host's own timing, copied too
                cal = run["calibration"]["hosts"][0]
                run["calibration"]["hosts"] = [{**cal, "ranks": 2}, {**cal, "host": "vm-b", "ranks": 2}]

        edit_json(folder, "run.json", hosts)

        def facts(system: dict[str, Any]) -> None:
            b = copy.deepcopy(system["hosts"][0])
            b["hostname"] = "vm-b"
            if boot:
                b["boot_id"] = "0" * 8 + b["boot_id"][8:]
            system["hosts"].append(b)

        edit_json(folder, "system.json", facts)
        resummarize(folder)

    return edit


def claim(path: str, value: Any, doc: str = "config.yaml") -> Edit:
    def fn(d: Any) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[last] = value

    return doc_edit(doc, fn)


def each(op: str, fn: Callable[[Rec], None]) -> Callable[[list[Rec]], None]:
    def apply(recs: list[Rec]) -> None:
        for r in recs:
            if r["op"] == op:
                fn(r)

    return apply


def no_backpressure(stall_too: bool) -> Callable[[list[Rec]], None]:
    def fn(recs: list[Rec]) -> None:
        for r in recs:
            if r["op"] == "write" and r["backpressure_ns"] > 0:
                bp = r["backpressure_ns"]
                r["backpressure_ns"] = 0
                if stall_too:  # the stall starts later by the back-pressure: training never waited
                    r["t0_ns"] += bp
                    r["wall_start"] += bp / 1e9
                    r["exposed_ns"] = 0

    return fn


def snapshot_faster(folder: Path, _: dict[str, Path]) -> None:
    """The snapshot into memory claimed 4× faster than the host's memory can copy (the stall
    shrinks by as much).  Set from the host's own measured copy rate, not as a multiple of the
    honest snapshot's: beside a busy core an honest snapshot can run 20× below that rate."""
    copy = {h["hostname"]: h["memory_copy_gib_s"] for h in read_json(folder, "system.json")["hosts"]}
    limit = load_rules().data["evidence"]["physics"]["memory_copy_multiple"] * 2**30  # × GiB/s

    def fn(recs: list[Rec]) -> None:
        for r in recs:
            if r["op"] == "write":
                host_bytes = sum(x["bytes"] for x in recs if x["op"] == "write" and x["index"] == r["index"]
                                 and x["host"] == r["host"])
                mem = r["stages"][0]
                want = max(1, int(host_bytes / (4 * limit * copy[r["host"]]) * 1e9))
                cut = max(0, mem["t1_ns"] - mem["t0_ns"] - want)
                mem["t1_ns"] -= cut
                r["staged_ns"] -= cut
                r["compute_ns"] += cut

    recs_edit(fn)(folder, _)


def longer_training(recs: list[Rec]) -> None:
    writes = ops(recs, "write")
    for k in sorted(writes)[:-1]:
        for r in writes[k]:
            r["compute_ns"] += 2_000_000_000


def later_iso(stamp: str, seconds: float) -> str:
    import datetime

    when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) + datetime.timedelta(seconds=seconds)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def interval_recorded_shorter(recs: list[Rec]) -> None:
    """The run trained a second after its first checkpoint, and records the 0.05 s it claims: every
    op from the second write on comes 0.95 s later than the recorded training explains."""
    first_done = max(end_of(r) for r in ops(recs, "write")[1])
    for r in recs:
        if r["t0_ns"] > first_done:
            shift(r, 950_000_000)


def sync_as_async(folder: Path, _: dict[str, Path]) -> None:
    """A synchronous O_DIRECT run presented as asynchronous: each write split into a snapshot at
    half the host's measured copy rate and a background persist ending where the write ended, the
    rest of the interval counted as training; the counters read as soon after the stall as they
    were after the write, and the configuration, run.json and summary made to match."""
    copy = {h["hostname"]: h["memory_copy_gib_s"] for h in read_json(folder, "system.json")["hosts"]}

    def fn(recs: list[Rec]) -> None:
        for group in ops(recs, "write").values():
            for host in {r["host"] for r in group}:
                hr = [r for r in group if r["host"] == host]
                snap = int(sum(r["bytes"] for r in hr) / (0.5 * copy[host] * 2**30) * 1e9)
                end = max(r["t1_ns"] for r in hr)
                for r in hr:
                    staged = r["t0_ns"] + snap
                    memory = {"bytes": r["bytes"], "t0_ns": r["t0_ns"], "t1_ns": staged, "tier": "memory"}
                    r["stages"] = [memory, {**r["stages"][0], "t0_ns": staged}]
                    r.update(mode="async", staged_ns=staged, backpressure_ns=0, exposed_ns=0,
                             compute_ns=r["compute_ns"] + r["t1_ns"] - staged)
                    r.pop("requests", None)
                    r.pop("phases_ns", None)
                for r in hr:
                    if "host_counters" in r:
                        after = r["host_counters"]["after"]
                        after["t_ns"] = max(x["staged_ns"] for x in hr) + after["t_ns"] - end
        interval = min(r["compute_ns"] for r in recs if r["op"] == "write") / 1e9
        claim = {"mode": "async", "compute_interval_s": interval}
        edit_yaml(folder, "config.yaml", lambda c: c["checkpoint"].update(claim))
        edit_json(folder, "run.json", lambda r: r["pipeline"].update(claim))

    recs_edit(fn)(folder, _)


def fast_restores_durable(folder: Path, _: dict[str, Path]) -> None:
    """A tiered run's restores served by its fast tier in memory presented as read from the
    durable tier, cold, the fast tier said to keep no checkpoint once durable (fast_keep=0)."""
    def fn(recs: list[Rec]) -> None:
        for r in recs:
            if r["op"] == "read" and r["tier"] == "fast":
                r.update(tier="durable", resident_bytes=0)

    edit_yaml(folder, "config.yaml", lambda c: c["checkpoint"]["tiers"].update(fast_keep=0))
    edit_json(folder, "run.json", lambda r: r["pipeline"].update(fast_keep=0))
    recs_edit(fn)(folder, _)


def files_as_objects(folder: Path, _: dict[str, Path]) -> None:
    """A run on files presented as one on an S3 store: the configuration, run.json's storage
    block, every host's filesystem facts and the records' counters (no block device) as an
    object run writes them."""
    endpoint, bucket, prefix = "10.0.0.5:9000", "ckpt", "vendor"

    def config(c: dict[str, Any]) -> None:
        c["checkpoint"]["folder"] = f"s3://{bucket}/{prefix}"
        c["storage"]["s3"].update(part_size=5242880, inflight=4)

    def facts(s: dict[str, Any]) -> None:
        for h in s["hosts"]:
            h.update(block_device=None, filesystem={"fs_type": "s3", "mount_point": f"s3://{bucket}/{prefix}",
                                                   "source": endpoint})

    def fn(recs: list[Rec]) -> None:
        for r in recs:
            r.update(direct=False)
            r.pop("requests", None)
            r.pop("phases_ns", None)
            for st in r.get("stages", ()):
                st["direct"] = False
            hc = r.get("host_counters")
            if hc:
                hc["device"] = None
                for sample in (hc["before"], hc["after"]):
                    for key in ("busy_ms", "read_bytes", "written_bytes"):
                        sample.pop(key, None)

    edit_yaml(folder, "config.yaml", config)
    edit_json(folder, "run.json", lambda r: r.update(storage={
        "addressing_style": "path", "bucket": bucket, "client": "botocore 1.44.18", "endpoint_host": endpoint,
        "inflight": 4, "kind": "s3", "part_size": 5242880, "prefix": prefix, "region": "us-east-1",
        "verify_tls": True}))
    edit_json(folder, "system.json", facts)
    recs_edit(fn)(folder, _)


def interval_claimed_shorter(folder: Path, runs: dict[str, Path]) -> None:
    """The async run claims 10 ms of training between checkpoints where it trained 50 ms, so that
    it is listed under the shorter interval: each checkpoint's recorded training 40 ms shorter and
    everything after it 40 ms earlier (counters, wall clock and run.json's end too), so that the
    clocks agree with the claim; the persists keep their own times."""
    cut = 40_000_000

    def fn(recs: list[Rec]) -> None:
        for k in sorted(ops(recs, "write")):
            group = [r for r in recs if r["op"] == "write" and r["index"] == k]
            taken = max(end_of(r) for r in group)
            for r in group:
                r["compute_ns"] -= cut
            for r in recs:
                if r["t0_ns"] > taken:
                    shift(r, -cut)

    nw = len(ops(read_records(folder), "write"))
    recs_edit(fn)(folder, runs)
    edit_yaml(folder, "config.yaml", lambda c: c["checkpoint"].update(compute_interval_s=0.01))
    def run(r: dict[str, Any]) -> None:
        r["pipeline"].update(compute_interval_s=0.01)
        r.update(ended=later_iso(r["ended"], -0.04 * nw))

    edit_json(folder, "run.json", run)
    resummarize(folder)


def copy_of(source: str, *, new_id: bool = True, shift_ns: int = 0) -> Edit:
    """The source run's bundle content as another submission (new run id, clocks shifted)."""

    def edit(folder: Path, runs: dict[str, Path]) -> None:
        shutil.rmtree(folder)
        shutil.copytree(runs[source], folder)
        if shift_ns:
            edit_records(folder, lambda rs: [shift(r, shift_ns) for r in rs] and None)
            resummarize(folder)
        if new_id:
            edit_json(
                folder,
                "run.json",
                lambda r: r.update(run_id="00000000deadbeef", name=r["name"][:-16] + "00000000deadbeef"),
            )

    return edit


def system_name(name: str) -> Edit:
    return doc_edit("run.json", lambda r: r.__setitem__("system_name", name))


NOMAX = "nomax-ext4"  # the system again, its declared storage maximum removed


def no_storage_max(folder: Path, _: dict[str, Path]) -> None:
    def fn(system: dict[str, Any]) -> None:
        for key in ("max_read_gib_s", "max_write_gib_s"):
            system["description"]["storage"].pop(key, None)

    edit_json(folder, "system.json", fn)
    edit_json(folder, "run.json", lambda r: r.update(system_name=NOMAX))


def facts_edit(**values: Any) -> Edit:
    return doc_edit("system.json", lambda s: [h.update(values) for h in s["hosts"]] and None)


SUMMARY = "summary.json"
COUNTERS = frozenset({"DEVICE-COUNTERS", "COUNTERS-LATE"})  # an edited op can reach the late counters too
# An op made shorter in its records keeps the requests' honest latencies: some request is then
# longer than the op (rules 1.10), or its requests no longer fit in it (rules 1.17).
SHORTENED = frozenset({"RECORDS-REQUESTS", "REQUESTS-BUSY"})
# A run relabelled as another plan keeps its requests: their count is the old plan's (rules 1.17).
REPLANNED = frozenset({"REQUESTS-PLANNED"})
# A rank dropped, a scale or a host invented leaves what the kernel charged to each host's ranks as
# the run made it: more (or less) than the edited records move (rules 1.18).
OWN = frozenset({"OWN-BYTES"})
FORGERIES: dict[str, list[Forgery]] = {
    "SUMMARY-EXACT": [
        Forgery(
            "dlio-save-3x",
            "sync",
            doc_edit(
                SUMMARY,
                lambda s: s["metric"].update(
                    save_checkpoint_io_mean_GB_per_second=3
                    * s["metric"]["save_checkpoint_io_mean_GB_per_second"]
                ),
            ),
            "metric.save_checkpoint_io_mean_GB_per_second",
        ),
        Forgery(
            "dlio-load-duration-3x",
            "sync",
            doc_edit(
                SUMMARY,
                lambda s: s["metric"].update(
                    load_checkpoint_duration_mean_seconds=s["metric"][
                        "load_checkpoint_duration_mean_seconds"
                    ]
                    / 3
                ),
            ),
            "metric.load_checkpoint_duration_mean_seconds",
        ),
        Forgery(
            "checkpoint-bytes-full-scale",
            "sync",
            doc_edit(SUMMARY, lambda s: s.update(checkpoint_bytes=s["checkpoint_bytes"] * 500)),
            "summary.checkpoint_bytes",
        ),
        Forgery(
            "restore-bytes-10x",
            "sync",
            doc_edit(SUMMARY, lambda s: s.update(restore_bytes=s["restore_bytes"] * 10)),
            "summary.restore_bytes",
        ),
        Forgery(
            "dlio-checkpoint-size-full-scale",
            "sync",
            doc_edit(
                SUMMARY,
                lambda s: s["metric"].update(
                    checkpoint_size_GB=500 * s["metric"]["checkpoint_size_GB"]
                ),
            ),
            "metric.checkpoint_size_GB",
        ),
        Forgery(
            "dlio-hosts-doubled",  # what MLPerf's tables read as the client count
            "sync",
            doc_edit(SUMMARY, lambda s: s.update(num_hosts=2 * s["num_hosts"],
                                                 host_memory_GB=2 * s["host_memory_GB"])),
            "summary.num_hosts",
        ),
        Forgery(
            "dlio-read-guarantee-on-a-warm-run",
            "tmpfs",
            doc_edit(SUMMARY, lambda s: s.update(mlckpt_read_guarantee="cold_verified")),
            "summary.mlckpt_read_guarantee",
            also=frozenset({"COLD-READ"}),  # the honest run's own finding
        ),
        Forgery(
            "read-valid-on-a-warm-run",
            "tmpfs",
            doc_edit(SUMMARY, lambda s: s.update(read_valid=True)),
            "summary.read_valid",
            also=frozenset({"COLD-READ"}),
        ),
    ],
    "METRICS-RECOMPUTE": [
        Forgery(
            "slow-ranks-left-a-little-late-timed-from-their-own-start",
            "sync",
            chain(recs_edit(slow_ranks_start_a_little_late, summary=False), lambda f, _: per_rank_summary(f)),
            "summary.write_bandwidth_mean_gib_s",
            # the phases a rank recorded outlast an op moved later by more than their slack
            also=COUNTERS | SHORTENED | {"RECORDS-SKEW"},
        ),
        Forgery(
            "headline-2x",
            "sync",
            doc_edit(
                SUMMARY, lambda s: s.update(write_bandwidth_mean_gib_s=2 * s["write_bandwidth_mean_gib_s"])
            ),
            "write_bandwidth_mean_gib_s",
        ),
        Forgery(
            "one-op-faster",
            "sync",
            doc_edit(
                SUMMARY, lambda s: s["ops"][0].update(bandwidth_gib_s=5 * s["ops"][0]["bandwidth_gib_s"])
            ),
            "ops[0].bandwidth_gib_s",
        ),
    ],
    # rules 1.12: a start after the counters, or counters read after an op, past the host's allowance
    # is a busy host's, or an op recorded as starting later or ending earlier than it did; either
    # way no result
    "COUNTERS-LATE": [
        Forgery(
            "writes-3x-end-earlier", "sync", recs_edit(faster("write", 3)), "before the counters were read",
            also=SHORTENED, verdict="disturbed",
        ),
        Forgery(
            "reads-3x-start-later",
            "sync",
            recs_edit(faster("read", 3, later_start=True)),
            "the leader's start at most",
            also=SHORTENED, verdict="disturbed",
        ),
        Forgery(
            "stall-without-back-pressure",
            "async",
            recs_edit(no_backpressure(stall_too=True)),
            "the leader's start at most",
            # a stall removed that was longer than TRAINING-INTERVAL's bound (on a busy host) leaves
            # training's wait before the next barrier unexplained as well
            also=frozenset({"RECORDS-SKEW", "ASYNC-TIMELINE", "TRAINING-INTERVAL"}), verdict="disturbed",
        ),
    ],
    "DEVICE-COUNTERS": [
        Forgery(
            "fsync-claimed-everywhere",
            "nofsync",
            chain(claim("checkpoint.fsync", True), recs_edit(each("write", lambda r: r.update(fsync=True)))),
            "written by device",
            also=frozenset({"FSYNC-EVERY-WRITE"}),
        ),
        Forgery(
            "buffered-relabelled-direct",
            "buffered",
            chain(
                claim("io.direct", True),
                recs_edit(
                    lambda rs: (
                        [
                            [r.update(direct=True), [s.update(direct=True) for s in r.get("stages", ())]]
                            for r in rs
                        ]
                        and None
                    )
                ),
            ),
            "page cache grows by less than",
        ),
        # the writes after the dropped one now follow their predecessor's training by a whole op
        Forgery("worst-write-dropped", "sync", drop_op_edit("write"), "between consecutive ops",
                also=frozenset({"TRAINING-INTERVAL"})),
        Forgery("worst-read-dropped", "sync", drop_op_edit("read"), "between consecutive ops"),
        Forgery(
            "warm-tmpfs-reads-claimed-cold",
            "tmpfs",
            recs_edit(each("read", lambda r: r.update(resident_bytes=0))),
            "restores from a memory filesystem resident in memory",
        ),
        Forgery(
            "tmpfs-relabelled-ext4",
            "tmpfs",
            chain(
                recs_edit(each("read", lambda r: r.update(resident_bytes=0))),
                doc_edit(
                    "system.json",
                    lambda s: [h["filesystem"].update(fs_type="ext4") for h in s["hosts"]] and None,
                ),
            ),
            "the block device of the ext4 checkpoint folder",
        ),
    ],
    "RECORDS-MODE": [
        Forgery(
            "fsync-claimed-in-config-only",
            "nofsync",
            claim("checkpoint.fsync", True),
            "fsync=False",
            also=frozenset({"FSYNC-EVERY-WRITE"}),
        ),
        Forgery(
            "direct-flags-on-buffered-records",
            "buffered",
            recs_edit(each("write", lambda r: r.update(direct=True))),
            "direct=True",
            also=COUNTERS,
        ),
        Forgery(
            "residency-against-more-bytes",
            "sync",
            recs_edit(each("read", lambda r: r.update(cached_check_bytes=r["cached_check_bytes"] * 100))),
            "residency measured over all",
        ),
    ],
    "RECORDS-SKEW": [
        Forgery(
            "slow-ranks-left-the-barrier-late",
            "sync",
            recs_edit(slow_ranks_start_late),
            "leave the barrier within",
            also=COUNTERS | {"RECORDS-COPIES"} | SHORTENED,
        ),
    ],
    "RECORDS-COPIES": [
        Forgery(
            "slowest-rank-copies-fastest",
            "sync",
            recs_edit(slowest_copies_fastest),
            "the same timings as",
            also=COUNTERS,
        ),
        Forgery(
            "restore-3-copies-restore-2",
            "sync",
            recs_edit(op_copied),
            "nanosecond timings never repeat",
            also=COUNTERS | SHORTENED,  # when restore 3 was the slower one, its requests outlast the copy
        ),
        Forgery(
            "rank-3-copies-rank-1",
            "sync",
            recs_edit(rank_copied),
            "per-op durations of its own",
            also=COUNTERS | SHORTENED,  # rank 3's own requests may outlast rank 1's durations
        ),
    ],
    "RESULT-COUNTS": [
        Forgery("slowest-rank-dropped", "sync", drop_slowest_rank(adjust=False), "one record per rank",
                also=OWN),
    ],
    "BYTES-PLAN": [
        Forgery(
            "slowest-rank-dropped-ranks-3",
            "sync",
            drop_slowest_rank(adjust=True),
            "files",
            also=COUNTERS | {"SUMMARY-EXACT", "BUNDLE-PREDICATE"} | REPLANNED | OWN,
        ),
        Forgery(
            "another-workload-label", "sync", relabel("llama_7b"), "files",
            also=frozenset({"SUMMARY-EXACT"}) | REPLANNED
        ),
    ],
    "HOST-PHYSICS": [
        Forgery(
            "full-scale-label",
            "sync",
            full_scale(),
            "measured memory copy rate",
            also=COUNTERS | {"BANDWIDTH-PLAUSIBLE", "HOST-MEMORY"} | REPLANNED | OWN,
        ),
        Forgery(
            "10TB-s-restores-storage-max-removed",
            "sync",
            chain(recs_edit(faster("read", 20000)), no_storage_max),
            "measured memory copy rate",
            also=COUNTERS | SHORTENED,
            system=NOMAX,
        ),
        Forgery("snapshot-faster-than-memory", "async", snapshot_faster, "(memory stage)", also=COUNTERS),
    ],
    "HOST-CLOCKS": [
        Forgery("one-host-as-two", "sync", two_hosts(boot=False), "share boot id", also=COUNTERS | OWN),
        Forgery(
            "one-host-as-two-new-boot-id", "sync", two_hosts(boot=True), "run on one clock",
            also=COUNTERS | OWN,
        ),
        Forgery(
            "wall-clock-narrowed",
            "sync",
            # summary.json's DLIO end follows run.json's, as a coherent forger writes it
            chain(doc_edit("run.json", lambda r: r.update(ended=r["started"])),
                  lambda folder, _: resummarize(folder)),
            "inside the run",
        ),
        Forgery(
            "one-start-edited",
            "sync",
            recs_edit(lambda rs: rs[-1].update(wall_start=rs[-1]["wall_start"] - 0.5)),
            "one wall-minus-monotonic offset per host",
        ),
    ],
    "ASYNC-EVIDENCE": [
        Forgery(
            "training-interval-lengthened",
            "async",
            recs_edit(longer_training),
            "training ends before the next checkpoint's barrier",
        ),
        Forgery(
            "back-pressure-zeroed",
            "async",
            recs_edit(
                lambda rs: (
                    [r.update(backpressure_ns=0, exposed_ns=0) for r in rs if r["op"] == "write"] and None
                )
            ),
            "back-pressure of at least",
        ),
    ],
    "TRAINING-INTERVAL": [
        Forgery(
            "interval-recorded-shorter",
            "async",
            chain(doc_edit("run.json", lambda r: r.update(ended=later_iso(r["ended"], 0.95))),
                  recs_edit(interval_recorded_shorter)),
            "s later on every host: an interval recorded shorter than trained",
            # the next write's counters moved with it, away from the persist they had overlapped
            also=frozenset({"STALL-WRITES"}),
        ),
    ],
    "ASYNC-TIMELINE": [
        Forgery(
            "interval-claimed-shorter-later-ops-moved-earlier",
            "async",
            interval_claimed_shorter,
            "(one staging slot)",
            # the next checkpoint's recorded wait no longer covers the persist it waited for, its
            # counters' window may overlap that persist's end, and the first restore now begins
            # before the last checkpoint was durable
            also=frozenset({"ASYNC-EVIDENCE", "STALL-WRITES", "RESULT-TIMES"}),
        ),
        Forgery(
            "back-pressure-removed",
            "async",
            recs_edit(no_backpressure(stall_too=False)),
            "an ordered checkpoint timeline",
            also=frozenset({"ASYNC-EVIDENCE"}),
        ),
    ],
    "TIER-RESTORE-SOURCE": [
        Forgery(
            "fast-tier-restores-counted-durable",
            "tiers",
            recs_edit(each("read", lambda r: r.update(tier="durable"))),
            "fast tier",
            also=COUNTERS,
        ),
    ],
    "DUPLICATE-CONTENT": [
        Forgery("resubmitted-new-run-id", "sync", copy_of("neighbour"), "the same record timings"),
        Forgery(
            "resubmitted-other-system",
            "sync",
            chain(copy_of("neighbour"), system_name("other-ext4")),
            "the same record timings",
            system="other-ext4",
        ),
        Forgery(
            "resubmitted-other-organisation",
            "sync",
            chain(copy_of("neighbour")),
            "the same record timings",
            org="other-org",
            signer="other",
        ),
        Forgery(
            "resubmitted-clocks-shifted",
            "sync",
            copy_of("neighbour", shift_ns=3_600_000_000_000),
            "the same record timings",
            also=frozenset({"HOST-CLOCKS"}),
        ),
    ],
    "RUNNER-RELEASED": [
        Forgery("invented-runner-digest", "sync", lambda f, r: None, "not a released runner"),
    ],
    "STALL-WRITES": [
        Forgery("sync-presented-as-async", "sync", sync_as_async, "had time for in the"),
    ],
    "OWN-BYTES": [
        # the durable device read none of it either (DEVICE-COUNTERS); OWN-BYTES holds even where
        # another tenant's reads of that device make up the bytes
        Forgery("fast-tier-restores-durable-fast-keep-0", "memtiers", fast_restores_durable,
                "ranks read at least", also=COUNTERS),
    ],
    "OBJECT-BYTES": [
        Forgery("files-presented-as-objects", "sync", files_as_objects, "through the block layer"),
    ],
}
PREDICATES = {"invented-runner-digest": {"runner_code_sha256": "ab" * 32}}
CASES = [(rule, f) for rule, fs in FORGERIES.items() for f in fs]


def place(root: Path, src: Path, system: str, org: str, name: str | None = None) -> str:
    run = read_json(src, "run.json")
    dest = root / "open" / org / "results" / system / run["workload"] / (name or run["name"])
    shutil.copytree(src, dest)
    sysfile = root / "open" / org / "systems" / f"{system}.yaml"
    if not sysfile.exists():
        import yaml

        sysfile.parent.mkdir(parents=True, exist_ok=True)
        embedded = read_json(src, "system.json").get("description")
        sysfile.write_text(yaml.safe_dump(embedded) if embedded else DESCRIPTION.format(name=system))
    return str(dest.relative_to(root))


def tree_for(runs: dict[str, Path], root: Path, forgery: Forgery, rule: str) -> tuple[dict[str, Any], str]:
    d = runs["dir"]
    keys = {n: bundle.load_private_key(d / "keys" / f"{n}.pem") for n in ("org", "other")}
    pubs = {n: (d / "keys" / f"{n}.pem.pub").read_text().strip() for n in ("org", "other")}
    root.mkdir(parents=True)
    (root / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{pubs["org"]}"]\n'
        f'  other-org: ["{pubs["other"]}"]\n'
    )
    (root / "released-runners.yaml").write_text(
        'mlckpt_released_runners: "1.0"\nrunners:\n' + entry("0.1.0", bundle.code_digest(), "2026-11-24")
    )
    for n in NEIGHBOURS:
        place(root, runs[n], SYSTEM, ORG)
    work = root.parent / "work"
    shutil.copytree(runs[forgery.source], work)
    forgery.edit(work, runs)
    if forgery.system != SYSTEM:
        edit_json(
            work,
            "system.json",
            lambda s: s.get("description") and s["description"].update(system_name=forgery.system),
        )
    run = read_json(work, "run.json")
    signed = {
        k: run[k]
        for k in ("run_id", "workload", "division", "started", "ended", "ranks", "scaled", "verdict")
    }
    resign(work, keys[forgery.signer], **signed, **PREDICATES.get(forgery.name, {}))
    path = place(root, work, forgery.system, forgery.org)
    trusted = bundle.TrustedKeys.load(root / "trusted-keys.yaml")
    return check_tree(root, trusted), path


# What another tenant of the machine did, judged over a phase's ops: a forgery that drops or moves ops
# changes the phase (dropping the slowest restore left the rest of a run made beside the suite and the
# tenant past its foreign share), and may say so beside its own rule, never instead of it (the hits
# above) and never so as to change the verdict (disturbed under an invalid rule stays invalid).
ENVIRONMENT = frozenset({"FOREIGN-IO"})


@pytest.mark.parametrize(("rule", "forgery"), CASES, ids=[f"{r}:{f.name}" for r, f in CASES])
def test_forgery_is_caught_under_its_rule(
    rule: str, forgery: Forgery, runs: dict[str, Path], tmp_path: Path
) -> None:
    if forgery.source not in runs:
        pytest.skip("no tmpfs at /dev/shm")
    report, path = tree_for(runs, tmp_path / "tree", forgery, rule)
    by_path = {b["path"]: b for b in report["bundles"]}
    forged = by_path[path]
    hits = [f for f in forged["findings"] if f["rule"] == rule]
    assert hits, f"{rule} did not fire: {[(f['rule'], f['message'][-160:]) for f in forged['findings']]}"
    assert any(forgery.fragment in f["message"] for f in hits), [f["message"] for f in hits]
    assert forged["integrity"] == "ok"  # re-signed with a trusted key: every signature holds
    fired = {f["rule"] for f in forged["findings"]}
    assert fired <= {rule, "RESULT-VERDICT", *forgery.also, *ENVIRONMENT}, fired
    assert forged["verdict"] == ("invalid" if fired & forgery.also else forgery.verdict), fired
    for p, b in by_path.items():  # the honest neighbours pass; the copied one is a duplicate too
        if p == path:
            continue
        if rule == "DUPLICATE-CONTENT" and p.endswith(runs["neighbour"].name):
            assert {f["rule"] for f in b["findings"]} == {"DUPLICATE-CONTENT"}, b["findings"]
        else:
            assert b["verdict"] == "open" and not b["findings"], (p, b["findings"])


def test_honest_runs_pass_every_rule(runs: dict[str, Path], tmp_path: Path) -> None:
    """Every honest run of the fixture (but the warm tmpfs one) in one tree: no finding at all."""
    root = tmp_path / "tree"
    d = runs["dir"]
    root.mkdir()
    pub = (d / "keys" / "org.pem.pub").read_text().strip()
    (root / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{pub}"]\n'
    )
    (root / "released-runners.yaml").write_text(
        'mlckpt_released_runners: "1.0"\nrunners:\n' + entry("0.1.0", bundle.code_digest(), "2026-11-24")
    )
    for name in RUNS:
        if name in runs and name != "tmpfs":
            place(root, runs[name], SYSTEM, ORG)
    report = check_tree(root, bundle.TrustedKeys.load(root / "trusted-keys.yaml"))
    bad = {
        b["path"]: [(f["rule"], f["message"][-160:]) for f in b["findings"]]
        for b in report["bundles"]
        if b["findings"] or b["verdict"] != "open"
    }
    assert not bad
    assert report["summary"]["bundles"] == len([n for n in RUNS if n in runs and n != "tmpfs"])
    not_checked = {n["rule"] for b in report["bundles"] for n in b["not_checked"]}
    assert not {"DEVICE-COUNTERS", "HOST-PHYSICS", "RUNNER-RELEASED", "DUPLICATE-CONTENT"} & not_checked


def test_a_start_moved_later_changes_no_figure(runs: dict[str, Path], tmp_path: Path) -> None:
    """Rules 1.20 time every rank from its host's first rank to leave the barrier: slow ranks that
    claim they left it late (each within RECORDS-SKEW's bound), summarised by the project's own
    code, show every figure the honest run shows, to the last digit."""
    forged = tmp_path / "forged"
    shutil.copytree(runs["sync"], forged)
    before = read_records(forged)
    recs_edit(slow_ranks_start_a_little_late)(forged, runs)
    after = read_records(forged)
    moved = [a for a, b in zip(after, before, strict=True) if a["t0_ns"] != b["t0_ns"]]
    assert len(moved) >= 6  # of the slower half of 4 ranks in each of 6 ops, those not the first to leave
    honest, claimed = read_json(runs["sync"], "summary.json"), read_json(forged, "summary.json")
    assert claimed["summary_format"] >= 10  # every rank timed from the barrier since format 10
    for key in ("write_bandwidth_mean_gib_s", "read_bandwidth_mean_gib_s", "write_duration_max_s",
                "read_slowest_rank_bandwidth_min_gib_s", "read_iops_mean"):
        assert claimed[key] == honest[key], key


def test_forgery_suite_size() -> None:
    assert len(CASES) >= 40


def test_compare_and_report_show_recomputed_figures(runs: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A bundle whose summary claims 3× the bandwidth: ``compare`` and the check report show
    what its records give (the same as the untouched bundle), never the claim."""
    import json

    from checker import cli

    d = runs["dir"]
    honest, forged = tmp_path / "honest", tmp_path / "forged"
    shutil.copytree(runs["sync"], honest)
    shutil.copytree(runs["sync"], forged)

    def claim_3x(s: dict[str, Any]) -> None:
        for k in ("write_bandwidth_mean_gib_s", "read_bandwidth_mean_gib_s"):
            s[k] *= 3
        s["metric"]["save_checkpoint_io_mean_GB_per_second"] *= 3
    edit_json(forged, "summary.json", claim_3x)
    resign(forged, bundle.load_private_key(d / "keys" / "org.pem"))
    trusted = tmp_path / "trusted-keys.yaml"
    pub = (d / "keys" / "org.pem.pub").read_text().strip()
    trusted.write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{pub}"]\n')
    assert cli.run(["compare", str(honest), str(forged), "--json", "--trusted-keys", str(trusted)]) == 0
    doc = json.loads(capsys.readouterr().out)
    m = {x["key"]: x for x in doc["metrics"]}
    claimed = read_json(forged, "summary.json")
    for key in ("write_bandwidth_mean_gib_s", "read_bandwidth_mean_gib_s"):
        assert m[key]["a"] == m[key]["b"] != claimed[key]
        assert m[key]["ratio_b_over_a"] == pytest.approx(1.0)
