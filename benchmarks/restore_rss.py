"""Peak resident memory of each mlckpt rank against the state it must hold, and fill speed.

    python benchmarks/restore_rss.py [--ranks 4] [--scale 0.1] [--workload llama3_8b]
                                     [--writes 1] [--reads 1] [--folder DIR] [--fill-repeat 5]
                                     [--set KEY=VALUE ...]

Runs ``mlckpt run`` under mpiexec (the mpiexec next to this Python, as ``mlckpt run`` would) with
every rank wrapped by a small shim that records the rank's own /proc/self/status:

* ``VmRSS`` after Python, numpy, mpi4py and mlckpt are imported and MPI is initialised
  ("import baseline"), and just before the state arena is allocated ("pre-arena baseline": also
  Hydra, the rules, MPI's shared-memory segments: everything that is not state);
* ``VmHWM`` (the kernel's peak RSS of the process) after the arena is allocated, after every write,
  read and verification, and at exit: the peak and the phase that set it.

Meanwhile the parent polls ``VmRSS`` of the rank processes (children of hydra_pmi_proxy) every
``--interval`` seconds as a cross-check.  For each rank it prints the state bytes from the plan
(``max(own, restore)`` page-rounded, as the runner's arena), the peak RSS (the larger of VmHWM at
exit and the highest polled VmRSS), the raw ratio ``peak / state`` and the net ratio
``(peak - pre-arena baseline) / state``.  Target (full
residency): peak RSS <= 1.15 x state bytes.  Then it measures ``mlckpt.engine.fill`` on a 1 GiB
buffer on one core (target >= 4 GB/s per core), both per wall second and per CPU second of the
calling thread (the latter is less disturbed by other load on the machine).  GB = 1e9 bytes.

Exit status 0 whatever the ratios (a measurement); 1 if the run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GB = 1e9
GiB = float(1 << 30)
MiB = float(1 << 20)
RSS_TARGET = 1.15
FILL_TARGET_GBS = 4.0


def _status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS / VmHWM / RssAnon / RssFile / RssShmem of a process, in bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


# ------------------------------------------------------------------------------------ rank shim
def shim_main(out_dir: str, overrides: list[str]) -> int:
    """Every rank: mlckpt.run.mpi_main with VmRSS/VmHWM recorded at phase boundaries."""
    import numpy  # noqa: F401  (the baseline includes what every rank imports)
    from mpi4py import MPI

    from mlckpt import engine
    from mlckpt.run import runner as run_mod

    comm = MPI.COMM_WORLD
    comm.Barrier()
    marks: list[tuple[str, dict[str, int]]] = [("import baseline", _status())]
    arena = {"seen": False}

    orig_alloc = engine.alloc

    def alloc(nbytes: int) -> Any:
        if not arena["seen"] and nbytes > engine.VERIFY_SCRATCH_BYTES:
            arena["seen"] = True
            marks.append(("pre-arena baseline", _status()))
            buf = orig_alloc(nbytes)
            marks.append(("arena allocated", _status()))
            return buf
        return orig_alloc(nbytes)

    engine.alloc = alloc
    counters: dict[str, int] = {}

    def after(name: str) -> None:
        orig = getattr(engine, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            try:
                return orig(*a, **k)
            finally:
                # Per op (write_files/read_files), per file for verify.
                counters[name] = counters.get(name, 0) + 1
                marks.append((f"after {name} #{counters[name]}", _status()))

        setattr(engine, name, wrapped)

    for name in ("write_files", "read_files", "verify"):
        after(name)
    rc = run_mod.mpi_main(overrides)
    marks.append(("exit", _status()))
    with open(os.path.join(out_dir, f"rank{comm.Get_rank()}.json"), "w") as fh:
        json.dump({"rank": comm.Get_rank(), "pid": os.getpid(), "rc": rc, "marks": marks}, fh)
    return rc


# ------------------------------------------------------------------------------------ parent poller
def _children(pid: int) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rank_pids(root: int) -> list[int]:
    """Python processes below hydra_pmi_proxy in the tree under ``root`` (mpiexec)."""
    kids = _children(root)
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            try:
                comm = Path(f"/proc/{c}/comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("hydra_pmi_prox") or comm.startswith("mpiexec"):
                todo.append(c)
            elif comm.startswith("python"):
                found.append(c)
    return found


class Poller(threading.Thread):
    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.max_rss: dict[int, int] = {}
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            for pid in _rank_pids(self.root):
                rss = _status(pid).get("VmRSS", 0)
                self.max_rss[pid] = max(self.max_rss.get(pid, 0), rss)
            self.samples += 1


# ------------------------------------------------------------------------------------ fill speed
def fill_speed(nbytes: int, repeat: int) -> None:
    from mlckpt import engine
    from mlckpt.engine import PageId

    buf = engine.alloc(nbytes)
    key, pid = secrets.token_bytes(engine.KEY_BYTES), PageId(secrets.randbits(64), 0, 0, 0)
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.thread_time()
        engine.fill(buf, nbytes, key, pid)
        wall.append(nbytes / (time.perf_counter() - t) / GB)
        cpu.append(nbytes / max(time.thread_time() - c, 1e-9) / GB)
    for label, xs in (("per wall second", wall), ("per CPU second", cpu)):
        med = statistics.median(xs)
        mark = "ok" if med >= FILL_TARGET_GBS else "BELOW TARGET"
        print(f"  fill {nbytes / GiB:.2f} GiB, one core, {label:16s}: median {med:5.2f} GB/s "
              f"(min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})  [{mark}; target >= "
              f"{FILL_TARGET_GBS:.1f} GB/s]")
    del buf


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--shim"]:
        return shim_main(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--writes", type=int, default=1)
    ap.add_argument("--reads", type=int, default=1)
    ap.add_argument("--folder", help="checkpoint folder (default: a temporary folder in cwd)")
    ap.add_argument("--interval", type=float, default=0.05, help="polling interval, s")
    ap.add_argument("--fill-gib", type=float, default=1.0)
    ap.add_argument("--fill-repeat", type=int, default=5)
    ap.add_argument("--skip-fill", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra mlckpt override, e.g. io.direct=false (repeatable)")
    args = ap.parse_args(argv)

    from mlckpt.cli.run_cmd import find_mpiexec
    from mlckpt.plan.config import setup

    ovs = [f"workload={args.workload}", "division=open", f"scale={args.scale}",
           f"ranks={args.ranks}", f"checkpoint.num_writes={args.writes}",
           f"checkpoint.num_reads={args.reads}", *args.set]
    s = setup(ovs)
    restore = s.config["checkpoint"]["restore"]
    state = [s.plan.resident_bytes(r, restore, 0) for r in range(args.ranks)]
    print(f"mlckpt {' '.join(ovs)}: {s.plan.total_bytes / GiB:.2f} GiB per checkpoint; state per "
          f"rank (max(own, restore={restore}) page-rounded, rank shift 0) "
          f"{min(state) / GiB:.3f}..{max(state) / GiB:.3f} GiB; residency {s.config['residency']}")

    own = args.folder is None
    base = Path(tempfile.mkdtemp(prefix=".mlckpt-rss-", dir=os.getcwd()) if own else args.folder)
    logs = Path(tempfile.mkdtemp(prefix="mlckpt-rss-logs-"))
    cmd = [find_mpiexec(None), "-n", str(args.ranks), sys.executable, os.path.abspath(__file__),
           "--shim", str(logs), "--", *ovs, f"checkpoint.folder={base / 'ckpt'}",
           f"output.root={base / 'results'}"]
    try:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        poller = Poller(proc.pid, args.interval)
        poller.start()
        output, _ = proc.communicate()
        poller.done.set()
        poller.join()
        elapsed = time.perf_counter() - t
        if proc.returncode != 0:
            print(output.strip()[-2000:])
            print(f"restore_rss: mlckpt run failed (exit {proc.returncode})")
            return 1
        for line in output.splitlines():
            if line.startswith(("write ", "read ", "result:")):
                print(f"  {line}")
        docs = sorted((json.loads(p.read_text()) for p in logs.glob("rank*.json")),
                      key=lambda d: d["rank"])
    finally:
        shutil.rmtree(logs, ignore_errors=True)
        shutil.rmtree(base / "results", ignore_errors=True)
        if own:
            shutil.rmtree(base, ignore_errors=True)

    print(f"  run took {elapsed:.1f} s; parent polled VmRSS {poller.samples} times "
          f"every {args.interval * 1e3:.0f} ms")
    print(f"\n  {'rank':>4s} {'state MiB':>10s} {'import MiB':>10s} {'pre-arena':>10s} "
          f"{'VmHWM':>9s} {'polled':>8s} {'raw':>6s} {'net':>6s}  VmHWM first seen at")
    raw_all, net_all = [], []
    for d in docs:
        marks = {name: st for name, st in d["marks"]}
        st = state[d["rank"]]
        hwm = d["marks"][-1][1]["VmHWM"]
        first_at = next(name for name, m in d["marks"] if m.get("VmHWM", 0) >= hwm)
        polled = poller.max_rss.get(d["pid"], 0)
        # The kernel's RSS counters are batched per CPU: a poll can read a hair above VmHWM.
        peak = max(hwm, polled)
        imp = marks["import baseline"]["VmRSS"]
        pre = marks.get("pre-arena baseline", marks["import baseline"])["VmRSS"]
        raw, net = peak / st, (peak - pre) / st
        raw_all.append(raw)
        net_all.append(net)
        print(f"  {d['rank']:4d} {st / MiB:10.1f} {imp / MiB:10.1f} {pre / MiB:10.1f} "
              f"{hwm / MiB:9.1f} {polled / MiB:8.1f} {raw:6.3f} {net:6.3f}  {first_at}")
    worst_raw, worst_net = max(raw_all), max(net_all)
    print(f"\n  peak RSS / state, worst rank: raw {worst_raw:.3f} "
          f"[{'ok' if worst_raw <= RSS_TARGET else 'ABOVE TARGET'}], baseline subtracted "
          f"{worst_net:.3f} [{'ok' if worst_net <= RSS_TARGET else 'ABOVE TARGET'}]  "
          f"(target <= {RSS_TARGET:.2f} in full residency)")
    last = docs[0]["marks"]
    detail = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in last[-1][1].items())
    print(f"  rank 0 at exit: {detail}")

    if not args.skip_fill:
        print("\nfill speed (mlckpt.engine.fill: AES-CTR keystream + page tags)")
        fill_speed(int(args.fill_gib * GiB), args.fill_repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
