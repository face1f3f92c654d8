"""gpu_stall.py: the async stall with GPU-resident state against the bare pinned device-to-host copy
of the same bytes.

Each round runs, in alternating order:

- mlckpt: ``checkpoint.mode=async state.source=gpu`` with a training interval that keeps the GPU
  busy; the stall of each write is read from records.jsonl (max over ranks of staged − t0, the
  wait for the previous persist included), and its device copy (device_copy_ns, the memory stage).
- bare: the same number of processes, each with its rank's bytes on the same GPU, copying them into
  a page-aligned host mapping pinned in place (cudaHostRegister) on a stream of its own, all
  released by one barrier; the duration is the slowest process's, as mlckpt's stall is.

Prints each round, the medians and the ratio mlckpt stall / bare copy (the target is ≤ 1.2).
Needs PyTorch and a CUDA device; exits 1 without them.

    python benchmarks/gpu_stall.py --ranks 4 --scale 0.05 --writes 4 --rounds 3 --interval 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab import bench

GiB = 2**30


def bare_worker(nbytes: int, reps: int, barrier: Any, out: Any, idx: int) -> None:
    """One process: ``nbytes`` on the GPU, copied ``reps`` times into a pinned host mapping."""
    import mmap

    import numpy as np
    import torch

    dev = torch.device("cuda", 0)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    host = np.frombuffer(m, dtype=np.uint8)
    host[::4096] = 0  # touched, as mlckpt's alloc does
    assert int(torch.cuda.cudart().cudaHostRegister(host.ctypes.data, nbytes, 0)) == 0
    dst = torch.from_numpy(host)
    stream = torch.cuda.Stream(dev)
    durs = []
    for _ in range(reps):
        barrier.wait()
        t0 = time.perf_counter_ns()
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        stream.synchronize()
        durs.append(time.perf_counter_ns() - t0)
    assert bytes(host[:64]) == bytes(src[:64].cpu().numpy())  # the copy happened
    out[idx] = durs
    torch.cuda.cudart().cudaHostUnregister(host.ctypes.data)


def bare_round(rank_bytes: list[int], reps: int) -> list[float]:
    """Seconds of each repetition: the slowest process's copy."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(rank_bytes))
    with ctx.Manager() as mgr:
        out = mgr.dict()
        procs = [ctx.Process(target=bare_worker, args=(n, reps, barrier, out, i))
                 for i, n in enumerate(rank_bytes)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        durs = [out[i] for i in range(len(rank_bytes))]
    return [max(d[k] for d in durs) / 1e9 for k in range(reps)]


def mlckpt_round(args: argparse.Namespace, work: Path) -> dict[str, list[float]]:
    """One async run with the GPU source: every write's stall and device copy (slowest rank)."""
    ovs = [f"workload={args.workload}", "division=open", f"scale={args.scale}", f"ranks={args.ranks}",
           "checkpoint.mode=async", f"checkpoint.compute_interval_s={args.interval}",
           f"checkpoint.num_writes={args.writes}", "checkpoint.num_reads=0", "state.source=gpu",
           "signing.key=none", f"output.root={work / 'results'}", f"checkpoint.folder={work / 'ckpt'}",
           *args.set]
    bundle = bench.run_mlckpt(ovs, timeout_s=3600, any_status=True)  # a disturbed run's figures too
    run = bundle.run
    writes = {index: rs for (_, index), rs in bundle.ops("write").items()}
    out: dict[str, list[float]] = {"stall": [], "copy": [], "backpressure": []}
    for _, rs in sorted(writes.items()):
        out["stall"].append(max(r["staged_ns"] - r["t0_ns"] for r in rs) / 1e9)
        out["copy"].append(max(r["device_copy_ns"] for r in rs) / 1e9)
        out["backpressure"].append(max(r["backpressure_ns"] for r in rs) / 1e9)
    out["rank_bytes"] = [int(r["bytes"]) for r in sorted(writes[1], key=lambda r: r["rank"])]  # type: ignore[misc]
    out["probe_d2h_gib_s"] = [e["d2h_gib_s"] for e in run["state"]["ranks"]]  # type: ignore[misc]
    out["device"] = run["state"]["ranks"][0]["device_name"]  # type: ignore[assignment]
    out["verdict"] = run["verdict"]  # type: ignore[assignment]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--writes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval", type=float, default=2.0, help="checkpoint.compute_interval_s")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except ImportError as exc:
        print(f"gpu_stall: needs PyTorch with a CUDA device ({exc})", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="gpu-stall-"))
    stalls: list[float] = []
    copies: list[float] = []
    bare: list[float] = []
    info: dict[str, Any] = {}
    for i in range(args.rounds):
        order = ("mlckpt", "bare") if i % 2 == 0 else ("bare", "mlckpt")
        for who in order:
            if who == "mlckpt":
                m = mlckpt_round(args, work)
                info = {k: m[k] for k in ("rank_bytes", "probe_d2h_gib_s", "device", "verdict")}
                stalls += m["stall"]
                copies += m["copy"]
                print(f"[{i + 1}] mlckpt stall {' '.join(f'{x * 1e3:.1f}' for x in m['stall'])} ms "
                      f"(device copy {' '.join(f'{x * 1e3:.1f}' for x in m['copy'])}, back-pressure "
                      f"{' '.join(f'{x * 1e3:.1f}' for x in m['backpressure'])}; verdict {m['verdict']})",
                      flush=True)
            else:
                if not info:
                    continue  # the bare copy needs mlckpt's per-rank bytes: it runs after the first
                b = bare_round(info["rank_bytes"], args.writes)
                bare += b
                print(f"[{i + 1}] bare   copy  {' '.join(f'{x * 1e3:.1f}' for x in b)} ms", flush=True)
    total = sum(info["rank_bytes"])
    ms, mc, mb = statistics.median(stalls), statistics.median(copies), statistics.median(bare)
    print(f"\n{args.ranks} ranks on {info['device']}, {total / GiB:.3f} GiB per checkpoint "
          f"({min(info['rank_bytes']) / GiB:.3f}..{max(info['rank_bytes']) / GiB:.3f} GiB per rank); "
          f"probe d2h per rank alone {min(info['probe_d2h_gib_s']):.1f}.."
          f"{max(info['probe_d2h_gib_s']):.1f} GiB/s")
    print(f"median stall {ms * 1e3:.1f} ms (device copy {mc * 1e3:.1f} ms), bare copy {mb * 1e3:.1f} ms "
          f"= {total / mb / GiB:.1f} GiB/s aggregate")
    print(f"RATIO stall / bare copy: {ms / mb:.2f} (target <= 1.2); device copy / bare copy {mc / mb:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"stall_s": stalls, "copy_s": copies, "bare_s": bare,
                                               "ratio": ms / mb, **info}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
