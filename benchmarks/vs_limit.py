"""mlckpt against the machine's limit: fio and a minimal Python O_DIRECT engine against `mlckpt
run`, on the same filesystem, with the same bytes and the same number of writers, alternated.

    python benchmarks/vs_limit.py [--config RANKS:SCALE ...] [--rounds 3] [--writes 3] [--reads 3]
                                  [--folder DIR] [--limit auto|fio|python|both] [--gap auto|S]
                                  [--buffers thp|4k] [--breakdown] [--set KEY=VALUE ...]
                                  [--workload llama3_8b] [--json FILE]

For every configuration (default ``8:0.0125``, the embedded default of 1.31 GiB on 8 ranks, and
``4:0.04``, 4.19 GiB on 4 ranks) it runs ``mlckpt, limit, mlckpt, limit, ...`` (ROUNDS of each:
this kind of VM disk drifts by up to 2x between runs).  It prints every op's bandwidth, then per
configuration the medians (GB/s = 1e9 B/s and GiB/s) of the limit engines and of mlckpt (all ops,
op 1 of each round, ops 2+), the ratio mlckpt / limit, each mlckpt run paired with the limit rounds
just before and after it, and the per-op spread.  The headline ratio uses, per direction, the
*best* limit engine: a "limit" that mlckpt beats is not the machine's limit.  A ratio below 0.90
(the target) prints ``BELOW TARGET``.  This is a measurement, not a test: the exit status is 0
whatever the ratios, and 1 only when nothing could be measured.

Each limit round copies mlckpt's lifecycle: io.direct=true, checkpoint.num_writes new files (the
earlier ones kept), eviction, then checkpoint.num_reads reads in mlckpt's order ((k - 1) mod
num_writes), then deletion.  Before each op the limit leaves the device idle for as long as mlckpt
did between ops (``--gap auto``: the median idle time, measured from records.jsonl, before ops of
that kind, while ranks fill the next checkpoint or verify the last restore).

fio (``--limit fio``; ``auto`` uses both engines when fio is installed): one job per mlckpt rank
(processes, like ranks), one file per job holding that rank's bytes from mlckpt's plan.
``rw=write`` then ``rw=read``, ``direct=1``, ``bs`` = io.block_size, ``ioengine=libaio`` with
``iodepth`` = io.threads (the same number of requests in flight per writer as mlckpt's synchronous
threads; fio cannot run a thread pool on one file, and libaio is what fio/DeepNVMe comparisons
use).  ``end_fsync=1`` is counted in fio's runtime.  ``fallocate=none`` because mlckpt does not
preallocate: fio then creates an empty file and extends it, as mlckpt does.  Files are deleted
before each write, and ``invalidate=1`` applies before each read.  Bandwidth = bytes of all jobs /
the longest job's runtime, which is mlckpt's ``Σ bytes / max over ranks``.  fio rounds each job's
size down to a multiple of bs, so it moves up to one block per rank less.  Rates are compared,
and both byte counts are printed.

Python (``--limit python``): one process per rank, io.threads threads each issuing blocking
O_DIRECT ``pwritev``/``preadv`` of io.block_size from one pre-touched buffer, then fsync.  Same
files, timed between a barrier and the last byte durable or read.

Buffers (``--buffers thp``, the default): mlckpt's ``alloc()`` asks for transparent huge pages,
so a 4 MiB request reaches the virtio disk as a few segments instead of 1024 pages, which
max_segments (254 here) splits into 5 requests.  The limit engines therefore get THP buffers too:
fio via ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc >= 2.35), Python via
``MADV_HUGEPAGE`` on a private mapping.  ``--buffers 4k`` measures plain pages; on the 2-vCPU
development VM that cost fio 17 % of its write and 31 % of its read bandwidth (benchmarks/README.md).

``--breakdown`` also runs mlckpt once per configuration under mpiexec, with timing wrappers around
the engine's internals (file creation, the request phase, the truncate+fsync phase and the
directory fsync), and prints where each rank's write time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import mmap
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import bench

GB = 1e9
GiB = float(1 << 30)
TARGET = 0.90
PAGE = 4096


# ------------------------------------------------------------------------------------ plan
@dataclass
class Case:
    workload: str
    ranks: int
    scale: float
    extra: list[str]
    rank_bytes: list[int] = field(default_factory=list)
    files_per_rank: list[int] = field(default_factory=list)
    block_size: int = 0
    threads: int = 0

    @property
    def overrides(self) -> list[str]:
        return [f"workload={self.workload}", "division=open", f"scale={self.scale}",
                f"ranks={self.ranks}", "io.direct=true", *self.extra]

    @property
    def total(self) -> int:
        return sum(self.rank_bytes)

    def label(self) -> str:
        return f"{self.workload} scale={self.scale} ranks={self.ranks}"


def resolve(case: Case) -> Case:
    from mlckpt.plan.config import setup

    s = setup(case.overrides)
    if s.config["checkpoint"]["restore"] != "own":
        raise SystemExit("vs_limit: only checkpoint.restore=own is compared (reads = bytes written)")
    case.rank_bytes = [rp.bytes for rp in s.plan.rank_plans]
    case.files_per_rank = [len(rp.files) for rp in s.plan.rank_plans]
    case.block_size = int(s.config["io"]["block_size"])
    case.threads = int(s.config["io"]["threads"])
    return case


# ------------------------------------------------------------------------------------ results
@dataclass
class Phase:
    """One timed write or read of all ranks."""

    bytes: int
    duration_s: float
    rank_durations_s: list[float]
    cpu_s: float | None = None  # CPU seconds of all writers over the op (None: not measured)

    @property
    def gbs(self) -> float:
        return self.bytes / self.duration_s / GB


@dataclass
class Round:
    """The ops of one limit round or one mlckpt run, in order."""

    writes: list[Phase]
    reads: list[Phase]


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _spread(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    cv = statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 else 0.0
    return f"min {min(xs):.2f} med {_med(xs):.2f} max {max(xs):.2f} (cv {cv:.0%}, n={len(xs)})"


# ------------------------------------------------------------------------------------ fio
def fio_version() -> str | None:
    exe = shutil.which("fio")
    if not exe:
        return None
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _fio_job(case: Case, folder: Path, rw: str) -> str:
    lines = ["[global]", f"directory={folder}", f"rw={rw}", f"bs={case.block_size}", "direct=1",
             "ioengine=libaio", f"iodepth={case.threads}", "fallocate=none"]
    lines += ["end_fsync=1"] if rw == "write" else ["invalidate=1"]
    for r, nbytes in enumerate(case.rank_bytes):
        lines += [f"[rank{r}]", f"filename=rank{r}.dat", f"size={nbytes}"]
    return "\n".join(lines) + "\n"


def fio_phase(case: Case, folder: Path, rw: str, buffers: str) -> Phase:
    job = folder / f"{rw}.fio"
    job.write_text(_fio_job(case, folder, rw))
    env = dict(os.environ)
    if buffers == "thp":  # glibc >= 2.35: malloc madvises MADV_HUGEPAGE, as mlckpt's alloc does
        env["GLIBC_TUNABLES"] = ":".join(
            x for x in (env.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1") if x)
    out = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True,
                         timeout=3600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"fio {rw} failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    doc = json.loads(out.stdout[out.stdout.index("{"):])
    jobs = doc["jobs"]
    errs = [j["jobname"] for j in jobs if j.get("error")]
    if errs:
        raise RuntimeError(f"fio {rw}: jobs {errs} reported errors")
    durs = [j["job_runtime"] / 1e3 for j in jobs]
    # fio's usr_cpu/sys_cpu: percent of the job's runtime, all its threads.
    cpu = sum((float(j["usr_cpu"]) + float(j["sys_cpu"])) / 100 * j["job_runtime"] / 1e3 for j in jobs)
    return Phase(sum(int(j[rw]["io_bytes"]) for j in jobs), max(durs), durs, cpu)


def _ckpt_dirs(folder: Path, writes: int) -> list[Path]:
    return [folder / f"ckpt-{k:04d}" for k in range(1, writes + 1)]


def _restored(writes: int, reads: int) -> list[int]:
    """Checkpoint (0-based) that read k restores: mlckpt's (k - 1) mod num_writes."""
    return [k % writes for k in range(reads)]


def fio_round(case: Case, folder: Path, buffers: str, writes: int, reads: int,
              gaps: dict[str, float]) -> Round:
    """The limit with mlckpt's lifecycle: W checkpoints into new files (earlier ones kept), then
    R reads of them in mlckpt's order, then everything deleted.  Before each op the device idles
    for ``gaps[op]`` seconds, as it does in mlckpt while ranks fill or verify."""
    shutil.rmtree(folder, ignore_errors=True)
    dirs = _ckpt_dirs(folder, writes)
    out = Round([], [])
    for d in dirs:
        d.mkdir(parents=True)
        time.sleep(gaps["write"])
        out.writes.append(fio_phase(case, d, "write", buffers))
    for c in _restored(writes, reads):
        time.sleep(gaps["read"])
        out.reads.append(fio_phase(case, dirs[c], "read", buffers))
    shutil.rmtree(folder, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------ Python reference
def _py_rank(paths: list[str], order: list[int], nbytes: int, bs: int, threads: int, huge: bool,
             gaps: dict[str, float], barrier: Any, results: Any) -> None:
    """One rank of the minimal O_DIRECT reference: writes (+fsync) of every path, eviction, then
    reads in ``order``; each op starts at a barrier."""
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    size = -(-nbytes // PAGE) * PAGE
    # MAP_PRIVATE as mlckpt's alloc(): Python's default MAP_SHARED anonymous memory is shmem, which
    # THP backs only if shmem_enabled allows it (it is "never" by default).
    buf = mmap.mmap(-1, max(size, PAGE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            buf.madvise(mmap.MADV_HUGEPAGE)
    chunk = os.urandom(1 << 20)
    for off in range(0, size, len(chunk)):  # touches every page, incompressible content
        n = min(len(chunk), size - off)
        buf[off:off + n] = chunk[:n]
    mv = memoryview(buf)
    pool = ThreadPoolExecutor(threads)
    list(pool.map(lambda _: None, range(threads)))  # start the threads outside the timed region
    nreq = -(-size // bs)

    def run(fd: int, call: Any) -> None:
        counter = itertools.count()

        def worker() -> None:
            while (i := next(counter)) < nreq:
                off = i * bs
                end = min(off + bs, size)
                while off < end:
                    n = call(fd, [mv[off:end]], off)
                    if n <= 0:  # end of file: the padded tail of a size that is not a page multiple
                        break
                    off += n

        for f in [pool.submit(worker) for _ in range(threads)]:
            f.result()

    wd, rd = [], []
    for path in paths:
        time.sleep(gaps["write"])
        barrier.wait()
        t0 = time.perf_counter_ns()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
        run(fd, os.pwritev)
        if size != nbytes:
            os.ftruncate(fd, nbytes)
        os.fsync(fd)
        os.close(fd)
        wd.append((time.perf_counter_ns() - t0) / 1e9)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    for c in order:
        time.sleep(gaps["read"])
        barrier.wait()
        t0 = time.perf_counter_ns()
        fd = os.open(paths[c], os.O_RDONLY | os.O_DIRECT)
        run(fd, os.preadv)
        os.close(fd)
        rd.append((time.perf_counter_ns() - t0) / 1e9)
    results.put((nbytes, wd, rd))
    pool.shutdown()


def py_round(case: Case, folder: Path, buffers: str, writes: int, reads: int,
             gaps: dict[str, float]) -> Round:
    shutil.rmtree(folder, ignore_errors=True)
    dirs = _ckpt_dirs(folder, writes)
    for d in dirs:
        d.mkdir(parents=True)
    order = _restored(writes, reads)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(case.ranks), ctx.Queue()
    procs = [ctx.Process(target=_py_rank,
                         args=([str(d / f"rank{r}.dat") for d in dirs], order, n, case.block_size,
                               case.threads, buffers == "thp", gaps, barrier, results))
             for r, n in enumerate(case.rank_bytes)]
    for p in procs:
        p.start()
    got = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    shutil.rmtree(folder, ignore_errors=True)
    total = sum(g[0] for g in got)

    def phase(i: int, which: int) -> Phase:
        durs = [g[which][i] for g in got]
        return Phase(total, max(durs), durs)

    return Round([phase(i, 1) for i in range(writes)], [phase(i, 2) for i in range(reads)])


# ------------------------------------------------------------------------------------ mlckpt
@dataclass
class MlckptRun(Round):
    ops: list[dict[str, Any]]  # summary.json "ops"
    start_skew_ms: list[float]  # per op: max - min of the ranks' t0 (same host clock)
    gaps: dict[str, list[float]]  # idle device time before ops 2.. (previous op's end to start)
    read_valid: bool
    bundle: str
    round: int = 0  # index of the limit run just before this mlckpt run


def mlckpt_round(case: Case, work: Path, writes: int, reads: int, runner: list[str] | None = None,
                 env: dict[str, str] | None = None) -> MlckptRun:
    out, ck = work / "results", work / "ckpt"
    ovs = [*case.overrides, f"checkpoint.num_writes={writes}", f"checkpoint.num_reads={reads}",
           f"output.root={out}", f"checkpoint.folder={ck}"]
    bundle = bench.run_mlckpt(ovs, launcher=runner, env=env)
    summary = bundle.summary
    phases: dict[str, list[Phase]] = {"write": [], "read": []}
    skew = []
    gaps: dict[str, list[float]] = {"write": [], "read": []}
    prev_end = None
    for (op, _), rs in bundle.ops().items():
        durs = [(r["t1_ns"] - r["t0_ns"]) / 1e9 for r in rs]
        cpu = sum(r["cpu_ns"] for r in rs) / 1e9 if all("cpu_ns" in r for r in rs) else None
        phases[op].append(Phase(sum(int(r["bytes"]) for r in rs), max(durs), durs, cpu))
        t0s = [r["t0_ns"] for r in rs]
        skew.append((max(t0s) - min(t0s)) / 1e6)
        if prev_end is not None:
            gaps[op].append((min(t0s) - prev_end) / 1e9)
        prev_end = max(r["t1_ns"] for r in rs)
    return MlckptRun(phases["write"], phases["read"], summary["ops"], skew, gaps,
                     bool(summary.get("read_valid", True)), str(bundle.path))


# ------------------------------------------------------------------------------------ breakdown shim
_SHIM_WRAPPED = ("write_files", "read_files", "_run", "_create", "_fsync_dir")


def shim_main(out_dir: str, overrides: list[str]) -> int:
    """Runs on every rank under mpiexec: mlckpt.run.mpi_main with engine internals timed."""
    from mlckpt import engine

    log: list[tuple[str, int, int]] = []

    def wrap(name: str) -> None:
        orig = getattr(engine, name, None)
        if orig is None:
            return

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return orig(*a, **k)
            finally:
                log.append((name, t, time.perf_counter_ns()))

        setattr(engine, name, timed)

    for name in _SHIM_WRAPPED:
        wrap(name)
    from mpi4py import MPI

    from mlckpt.run.runner import mpi_main

    rc = mpi_main(overrides)
    with open(os.path.join(out_dir, f"rank{MPI.COMM_WORLD.Get_rank()}.json"), "w") as fh:
        json.dump(log, fh)
    return rc


def breakdown(case: Case, work: Path, writes: int) -> None:
    """Where a rank's write time goes: create, requests, truncate+fsync, directory fsync."""
    from mlckpt.cli.run_cmd import find_mpiexec

    logs = work / "shim"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    runner = [find_mpiexec(None), "-n", str(case.ranks), sys.executable, os.path.abspath(__file__),
              "--shim", str(logs), "--"]
    run = mlckpt_round(case, work, writes, 1, runner=runner)
    parts: dict[str, list[float]] = {k: [] for k in ("create", "requests", "finish", "fsync_dir")}
    for p in sorted(logs.glob("rank*.json")):
        log = json.loads(p.read_text())
        ops = [(a, b) for n, a, b in log if n == "write_files"]
        for a, b in ops[1:] if len(ops) > 1 else ops:  # first op reported separately below
            inner = sorted((x for x in log if a <= x[1] and x[2] <= b and x[0] != "write_files"),
                           key=lambda x: x[1])
            runs = [x for x in inner if x[0] == "_run"]
            share = {"create": sum(x[2] - x[1] for x in inner if x[0] == "_create"),
                     "requests": runs[0][2] - runs[0][1] if runs else 0,
                     "finish": sum(x[2] - x[1] for x in runs[1:]),
                     "fsync_dir": sum(x[2] - x[1] for x in inner if x[0] == "_fsync_dir")}
            for k, v in share.items():
                parts[k].append(v / (b - a))
    if not parts["requests"]:
        print("  breakdown: engine internals not found (mlckpt.engine changed); skipped")
        return
    print(f"  breakdown of write time per rank (ops 2..{writes}, all ranks; median share "
          "of the rank's write duration):")
    print("    " + ", ".join(f"{k} {_med(v):.1%} (max {max(v):.1%})" for k, v in parts.items()))
    w = [p.gbs for p in run.writes]
    print(f"    this run's writes: {' '.join(f'{x:.2f}' for x in w)} GB/s; reads "
          f"{' '.join(f'{p.gbs:.2f}' for p in run.reads)} GB/s")
    shutil.rmtree(run.bundle, ignore_errors=True)


# ------------------------------------------------------------------------------------ report
def verdict(ratio: float) -> str:
    return "ok" if ratio >= TARGET else "BELOW TARGET"


def _ops(rounds: list[Any], op: str, which: str = "all") -> list[float]:
    """GB/s of every op of kind ``op`` over ``rounds``: all, only the first, or the rest."""
    sl = {"all": slice(None), "first": slice(0, 1), "rest": slice(1, None)}[which]
    return [p.gbs for r in rounds for p in getattr(r, op + "s")[sl]]


def _cpu(rounds: list[Any], op: str) -> float:
    """Median CPU seconds per GiB moved over the ops of kind ``op`` (nan: not measured)."""
    return _med([p.cpu_s / (p.bytes / GiB) for r in rounds for p in getattr(r, op + "s")
                 if p.cpu_s is not None and p.bytes])


def _row(label: str, w: float, r: float, n: str = "") -> str:
    return f"  {label:40s}{w:11.2f}{w * GB / GiB:7.2f}{r:11.2f}{r * GB / GiB:7.2f}  {n}"


def report_case(case: Case, limits: dict[str, list[Round]], runs: list[MlckptRun]) -> dict[str, Any]:
    print(f"\n== summary: {case.label()}: {case.total / GiB:.3f} GiB per checkpoint, "
          f"{case.ranks} writers, {len(runs)} mlckpt runs")
    out: dict[str, Any] = {"case": case.label(), "bytes": case.total, "ranks": case.ranks}
    print(f"  {'median GB/s (1e9) and GiB/s (2^30)':40s}{'write GB/s':>11s}{'GiB/s':>7s}"
          f"{'read GB/s':>11s}{'GiB/s':>7s}")
    med: dict[str, dict[str, dict[str, float]]] = {}
    for who, rounds in [*limits.items(), ("mlckpt", runs)]:
        med[who] = {which: {op: _med(_ops(rounds, op, which)) for op in ("write", "read")}
                    for which in ("all", "first", "rest")}
        m = med[who]["all"]
        nw, nr = len(_ops(rounds, "write")), len(_ops(rounds, "read"))
        label = who if who == "mlckpt" else f"limit: {who}"
        print(_row(label, m["write"], m["read"], f"({nw} writes, {nr} reads)"))
        for which, text in (("first", "op 1 of each round"), ("rest", "ops 2+ of each round")):
            print(_row(f"  {text}", med[who][which]["write"], med[who][which]["read"]))
    # The headline compares with the best limit engine, per direction: a "limit" that mlckpt
    # beats is not the machine's limit.
    best = {op: max(limits, key=lambda e: med[e]["all"][op]) for op in ("write", "read")}
    ratio = {op: med["mlckpt"]["all"][op] / med[best[op]]["all"][op] for op in ("write", "read")}
    print(f"  RATIO mlckpt / limit: write {ratio['write']:.2f} (limit = {best['write']}) "
          f"[{verdict(ratio['write'])}]   read {ratio['read']:.2f} (limit = {best['read']}) "
          f"[{verdict(ratio['read'])}]   (medians over ops; target >= {TARGET:.2f})")
    out.update(ratio_write=ratio["write"], ratio_read=ratio["read"], limit_write_engine=best["write"],
               limit_read_engine=best["read"], mlckpt=med["mlckpt"])
    for name, rounds in limits.items():
        r = {which: {op: med["mlckpt"][which][op] / med[name][which][op] for op in ("write", "read")}
             for which in ("all", "first", "rest")}
        # Paired: each mlckpt run against the mean of the limit rounds just before and after it.
        paired: dict[str, list[float]] = {"write": [], "read": []}
        for run in runs:
            nb = rounds[max(run.round - 1, 0):run.round + 1]  # the limit rounds before and after it
            if nb:
                for op in paired:
                    paired[op].append(_med(_ops([run], op))
                                      / statistics.fmean(_med(_ops([x], op)) for x in nb))
        print(f"    vs {name:6s}: write {r['all']['write']:.2f} (op 1 {r['first']['write']:.2f}, "
              f"ops 2+ {r['rest']['write']:.2f}), read {r['all']['read']:.2f} (op 1 "
              f"{r['first']['read']:.2f}, ops 2+ {r['rest']['read']:.2f}); paired per run: write "
              f"{' '.join(f'{x:.2f}' for x in paired['write'])}, read "
              f"{' '.join(f'{x:.2f}' for x in paired['read'])}")
        out[name] = {"median": med[name], "ratio": r, "paired": paired}
    cpu = {who: {op: _cpu(rounds, op) for op in ("write", "read")}
           for who, rounds in [*limits.items(), ("mlckpt", runs)]}
    print("  CPU s per GiB moved (all writers' user + system over each op, median): " + "; ".join(
        f"{who} write {c['write']:.3f} read {c['read']:.3f}" for who, c in cpu.items()
        if not (math.isnan(c["write"]) and math.isnan(c["read"]))))
    if "fio" in cpu:
        print(f"  CPU ratio mlckpt / fio: write {cpu['mlckpt']['write'] / cpu['fio']['write']:.2f}, "
              f"read {cpu['mlckpt']['read'] / cpu['fio']['read']:.2f}")
    out["cpu_s_per_gib"] = {who: c for who, c in cpu.items()  # strict JSON: no NaN for the unmeasured
                            if not (math.isnan(c["write"]) and math.isnan(c["read"]))}
    print("  per-op spread, GB/s:")
    for who, rounds in [*limits.items(), ("mlckpt", runs)]:
        print(f"    {who:6s}  write {_spread(_ops(rounds, 'write'))}")
        print(f"    {'':6s}  read  {_spread(_ops(rounds, 'read'))}")
    strag = {op: [o["straggler_ratio"] for r in runs for o in r.ops if o["op"] == op]
             for op in ("write", "read")}
    skew = [s for r in runs for s in r.start_skew_ms]
    print(f"  mlckpt stragglers (max/median rank duration per op): write med {_med(strag['write']):.2f} "
          f"max {max(strag['write'], default=0):.2f}; read med {_med(strag['read']):.2f} max "
          f"{max(strag['read'], default=0):.2f}; rank start skew after the barrier: med "
          f"{_med(skew):.1f} ms, max {max(skew, default=0):.1f} ms")
    if not all(r.read_valid for r in runs):
        print("  WARNING: some mlckpt read results are marked invalid (cache residency)")
    return out


def limit_step(case: Case, engines: list[str], limits: dict[str, list[Round]], work: Path, i: int,
               args: argparse.Namespace, gaps: dict[str, float]) -> None:
    # The engines take turns going first: on this VM the run right after another is often slower.
    for e in engines if i % 2 else engines[::-1]:
        rnd = (fio_round if e == "fio" else py_round)(case, work / "limit", args.buffers,
                                                      args.writes, args.reads, gaps)
        limits[e].append(rnd)
        print(f"  [{i}] limit {e:6s} write {' '.join(f'{p.gbs:.2f}' for p in rnd.writes)} GB/s   "
              f"read {' '.join(f'{p.gbs:.2f}' for p in rnd.reads)} GB/s   (gaps {gaps['write']:.2f}"
              f"/{gaps['read']:.2f} s, {bench.load()})", flush=True)


def choose_gaps(arg: str, runs: list[MlckptRun]) -> dict[str, float]:
    """Idle time before each limit op: fixed, or the median idle time mlckpt's device had before
    an op of the same kind (ranks filling the next checkpoint, verifying the previous restore)."""
    if arg != "auto":
        return {"write": float(arg), "read": float(arg)}
    return {op: _med([g for r in runs for g in r.gaps[op]]) if any(r.gaps[op] for r in runs) else 0.0
            for op in ("write", "read")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--shim"]:
        return shim_main(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", metavar="RANKS:SCALE",
                    help="ranks and scale of one comparison (repeatable; default 8:0.0125 4:0.04)")
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--rounds", type=int, default=3, help="mlckpt runs per configuration (default 3)")
    ap.add_argument("--writes", type=int, default=3, help="checkpoint.num_writes per run (default 3)")
    ap.add_argument("--reads", type=int, default=3, help="checkpoint.num_reads per run (default 3)")
    ap.add_argument("--folder", help="filesystem under test (default: a temporary folder in cwd)")
    ap.add_argument("--limit", choices=("auto", "fio", "python", "both"), default="auto",
                    help="how to measure the limit (auto: fio and python if fio is installed, else python)")
    ap.add_argument("--buffers", choices=("thp", "4k"), default="thp",
                    help="I/O buffers of the limit engines: thp = transparent huge pages, as mlckpt's "
                    "alloc() asks for (default); 4k = plain pages (fio's default)")
    ap.add_argument("--gap", default="auto", metavar="auto|SECONDS",
                    help="idle time before each limit op (auto: mlckpt's measured median)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra mlckpt override for both sides, e.g. io.threads=8 (repeatable)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the engine's write phases per rank (one extra run per config)")
    ap.add_argument("--json", help="also write the summary figures to this file")
    args = ap.parse_args(argv)

    fio = fio_version()
    engines = {"auto": ["fio", "python"] if fio else ["python"], "fio": ["fio"],
               "python": ["python"], "both": ["fio", "python"]}[args.limit]
    if "fio" in engines and not fio:
        print("vs_limit: fio not found (apt-get install fio); use --limit python", file=sys.stderr)
        return 1
    cases = []
    for spec in args.config or ["8:0.0125", "4:0.04"]:
        ranks, scale = spec.split(":")
        cases.append(resolve(Case(args.workload, int(ranks), float(scale), list(args.set))))

    own = args.folder is None
    base = Path(tempfile.mkdtemp(prefix=".mlckpt-vslimit-", dir=os.getcwd()) if own else args.folder)
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vslimit-", dir=base))
    from mlckpt.host.facts import host_facts

    with contextlib.suppress(Exception):
        facts = host_facts(work, "")
        fs = facts["filesystem"]
        print(f"host: {facts['cpu_model']}, {facts['cpu_cores']} CPUs, "
              f"{facts['memory_total_bytes'] / GiB:.1f} GiB RAM, kernel {facts['kernel']}; "
              f"{fs.get('fs_type')} on {fs.get('source')} ({fs.get('mount_options')})")
    print(f"folder: {work} ({bench.load()}); limit engines: {', '.join(engines)}"
          + (f" ({fio})" if fio and "fio" in engines else "") + f", {args.buffers} buffers")
    if args.buffers == "thp":
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        libc = os.confstr("CS_GNU_LIBC_VERSION") or "?"
        print(f"  THP: {thp.read_text().strip() if thp.exists() else 'n/a'}; {libc} (fio gets "
              "GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which needs glibc >= 2.35)")
    measured = []
    try:
        for case in cases:
            print(f"\n== {case.label()} ({' '.join(case.overrides)}): {case.total:,} B = "
                  f"{case.total / GiB:.3f} GiB per checkpoint; per rank {min(case.rank_bytes):,}.."
                  f"{max(case.rank_bytes):,} B in {max(case.files_per_rank)} files (the limit: 1 "
                  f"file per rank); io.block_size {case.block_size}, io.threads {case.threads}")
            limits: dict[str, list[Round]] = {e: [] for e in engines}
            runs: list[MlckptRun] = []
            # mlckpt, limit, mlckpt, limit, ...: the limit round after each mlckpt run idles the
            # device between ops as long as mlckpt's runs so far did (--gap auto).
            for i in range(args.rounds):
                try:
                    run = mlckpt_round(case, work, args.writes, args.reads)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"  [{i + 1}] mlckpt FAILED: {exc}")
                else:
                    run.round = i
                    runs.append(run)
                    ws = " ".join(f"{p.gbs:.2f}" for p in run.writes)
                    rs = " ".join(f"{p.gbs:.2f}" for p in run.reads)
                    g = " ".join(f"{x:.2f}" for x in run.gaps["write"] + run.gaps["read"])
                    print(f"  [{i + 1}] mlckpt        write {ws} GB/s   read {rs} GB/s   (gaps {g} s, "
                          f"{bench.load()})", flush=True)
                    shutil.rmtree(run.bundle, ignore_errors=True)
                limit_step(case, engines, limits, work, i + 1, args, choose_gaps(args.gap, runs))
            if not runs:
                continue
            measured.append(report_case(case, limits, runs))
            if args.breakdown:
                try:
                    breakdown(case, work, args.writes)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"  breakdown FAILED: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1) + "\n")
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
