"""Load on the witness: many concurrent witnessed runs (simulated clients) for a fixed time.

    .venv/bin/python benchmarks/witness_load.py [--runs 200] [--seconds 60]

Starts a real `mlckpt witness serve` on the loopback address with a fresh key and journal, then
keeps ``--runs`` clients busy for ``--seconds``: each opens a run, measures a round trip, writes
and restores checkpoints (a start and an end event each), closes it, and starts the next.  Every
receipt's latency is timed at the client.  Afterwards every journal is reloaded (hash chain
checked) and compared with what the clients were told: no acknowledged event may be missing or
duplicated.  Prints events/s and the receipt latency p50/p99/max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from mlckpt import bundle
from mlckpt.witness.journal import Journal

BIN = Path(sys.executable).parent


async def client(session: aiohttp.ClientSession, url: str, until: float, latencies: list[float],
                 acked: dict[str, list[int]]) -> None:
    async def post(path: str, body: Any) -> Any:
        t0 = time.perf_counter()
        async with session.post(url + path, json=body) as resp:
            doc = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{path}: {resp.status} {doc}")
        latencies.append(time.perf_counter() - t0)
        return doc

    while time.monotonic() < until:
        out = await post("/v1/runs", {"plan_digest": "ab" * 32, "config": {"ranks": 8}, "client": "load"})
        run = out["run"]
        seqs = acked.setdefault(run, [out["seq"]])
        token = (await post(f"/v1/runs/{run}/pings", {}))["token"]
        seqs.append((await post(f"/v1/runs/{run}/pongs", {"token": token}))["seq"])
        for op in ("write", "read"):
            for k in (1, 2, 3):
                for kind in ("start", "end"):
                    event = {"kind": kind, "op": op, "index": k}
                    seqs.append((await post(f"/v1/runs/{run}/events", event))["seq"])
        seqs.append((await post(f"/v1/runs/{run}/close", {}))["seq"])


async def load(url: str, runs: int, seconds: float) -> tuple[list[float], dict[str, list[int]], float]:
    latencies: list[float] = []
    acked: dict[str, list[int]] = {}
    until = time.monotonic() + seconds
    t0 = time.monotonic()
    conn = aiohttp.TCPConnector(limit=runs)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(client(session, url, until, latencies, acked) for _ in range(runs)))
    return latencies, acked, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "witness.pem"
        bundle.generate_key(key)
        journal = Path(tmp) / "journal"
        proc = subprocess.Popen([str(BIN / "mlckpt"), "witness", "serve", "--listen", "127.0.0.1:0",
                                 "--key", str(key), "--journal", str(journal)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = re.search(r"(http://\S+)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
            latencies, acked, wall = asyncio.run(load(url, args.runs, args.seconds))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        runs = Journal(journal).load()  # the hash chain of every file checked
        lost = dup = 0
        for run, seqs in acked.items():
            on_disk = [e["seq"] for e in runs.get(run, [])]
            lost += len(set(seqs) - set(on_disk))
            dup += len(on_disk) - len(set(on_disk)) + len(seqs) - len(set(seqs))
        events = sum(len(s) for s in acked.values())
        lat = sorted(latencies)
        p = {q: lat[min(len(lat) - 1, int(q / 100 * len(lat)))] * 1e3 for q in (50, 99)}
        result = {"clients": args.runs, "seconds": round(wall, 1), "runs": len(acked),
                  "runs_closed": sum(1 for r in runs.values() if r and r[-1]["kind"] == "close"),
                  "events_acked": events, "events_per_s": round(events / wall, 1),
                  "lost": lost, "duplicated": dup, "latency_ms_p50": round(p[50], 2),
                  "latency_ms_p99": round(p[99], 2), "latency_ms_max": round(lat[-1] * 1e3, 2),
                  "latency_ms_mean": round(statistics.fmean(lat) * 1e3, 2)}
        print(json.dumps(result, indent=1))
        return 0 if lost == dup == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
