"""Load on the witness: many concurrent witnessed runs (simulated clients) for a fixed time, alone and
then beside a flood of strangers' opens.

    .venv/bin/python benchmarks/witness_load.py [--runs 200] [--seconds 60] [--flooders 4]

Starts a real `mlckpt witness serve` on the loopback address with a fresh key, journal and
trusted-keys file (one key per client, as one per vendor; bounds raised so that the clients'
own pace never meets them), then keeps ``--runs`` clients busy for ``--seconds``: each opens a
run (a signed open over the witness's challenge), measures a round trip, writes and restores
checkpoints (a start and an end event each), closes it, and starts the next.  Every receipt's
latency is timed at the client.  The same again with ``--flooders`` tasks posting unsigned and
stranger-signed opens as fast as the witness answers them.  Afterwards every journal is reloaded
(hash chain checked) and compared with what the clients were told: no acknowledged event may be
missing or duplicated, and no flood request may have left a file.  Prints, for each phase,
events/s, the honest receipt latency p50/p99/max, and the refusals/s of the flood.
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
from mlckpt.witness import protocol
from mlckpt.witness.journal import Journal

BIN = Path(sys.executable).parent


async def client(session: aiohttp.ClientSession, url: str, key: Any, witness_keyid: str, until: float,
                 latencies: list[float], acked: dict[str, list[int]]) -> None:
    async def call(method: str, path: str, body: Any = None) -> Any:
        t0 = time.perf_counter()
        async with session.request(method, url + path, json=body) as resp:
            doc = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{path}: {resp.status} {doc}")
        latencies.append(time.perf_counter() - t0)
        return doc

    while time.monotonic() < until:
        challenge = (await call("GET", "/v1/challenge"))["challenge"]
        doc = protocol.open_document(witness_keyid, challenge, "ab" * 32, {"ranks": 8}, "load")
        out = await call("POST", "/v1/runs", bundle.make_envelope(doc, key, protocol.OPEN_TYPE))
        run = out["run"]
        seqs = acked.setdefault(run, [out["seq"]])
        token = (await call("POST", f"/v1/runs/{run}/pings", {}))["token"]
        seqs.append((await call("POST", f"/v1/runs/{run}/pongs", {"token": token}))["seq"])
        for op in ("write", "read"):
            for k in (1, 2, 3):
                for kind in ("start", "end"):
                    event = {"kind": kind, "op": op, "index": k}
                    seqs.append((await call("POST", f"/v1/runs/{run}/events", event))["seq"])
        seqs.append((await call("POST", f"/v1/runs/{run}/close", {}))["seq"])


async def flooder(session: aiohttp.ClientSession, url: str, stranger: Any, until: float,
                  refused: list[int]) -> None:
    bodies = [json.dumps({"plan_digest": "ab" * 32, "config": {}}).encode(),
              json.dumps(bundle.make_envelope({"_type": "mlckpt-witness-open"}, stranger,
                                              protocol.OPEN_TYPE)).encode()]
    n = 0
    while time.monotonic() < until:
        async with session.post(url + "/v1/runs", data=bodies[n % 2]) as resp:
            await resp.read()
            if resp.status not in (401, 403):
                raise RuntimeError(f"a stranger's open answered {resp.status}")
        n += 1
    refused.append(n)


async def load(url: str, keys: list[Any], witness_keyid: str, seconds: float, flooders: int,
               stranger: Any) -> dict[str, Any]:
    latencies: list[float] = []
    acked: dict[str, list[int]] = {}
    refused: list[int] = []
    until = time.monotonic() + seconds
    t0 = time.monotonic()
    conn = aiohttp.TCPConnector(limit=len(keys) + flooders)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(client(session, url, k, witness_keyid, until, latencies, acked) for k in keys),
                             *(flooder(session, url, stranger, until, refused) for _ in range(flooders)))
    wall = time.monotonic() - t0
    lat = sorted(latencies)
    p = {q: lat[min(len(lat) - 1, int(q / 100 * len(lat)))] * 1e3 for q in (50, 99)}
    events = sum(len(s) for s in acked.values())
    return {"acked": acked, "flooders": flooders, "seconds": round(wall, 1), "runs": len(acked),
            "events_acked": events, "events_per_s": round(events / wall, 1),
            "flood_refusals_per_s": round(sum(refused) / wall, 1),
            "latency_ms_p50": round(p[50], 2), "latency_ms_p99": round(p[99], 2),
            "latency_ms_max": round(lat[-1] * 1e3, 2),
            "latency_ms_mean": round(statistics.fmean(lat) * 1e3, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--flooders", type=int, default=4, help="tasks posting strangers' opens in phase 2")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        bundle.generate_key(tmp / "witness.pem")
        keys = []
        for i in range(args.runs):
            bundle.generate_key(tmp / f"org{i}.pem")
            keys.append(bundle.load_private_key(tmp / f"org{i}.pem"))
        bundle.generate_key(tmp / "stranger.pem")
        stranger = bundle.load_private_key(tmp / "stranger.pem")
        (tmp / "trusted.yaml").write_text('mlckpt_trusted_keys: "1.0"\norganizations:\n' + "".join(
            f'  org{i}: ["{bundle.public_key_text(k)}"]\n' for i, k in enumerate(keys)))
        journal = tmp / "journal"
        proc = subprocess.Popen([str(BIN / "mlckpt"), "witness", "serve", "--listen", "127.0.0.1:0",
                                 "--key", str(tmp / "witness.pem"),
                                 "--trusted-keys", str(tmp / "trusted.yaml"),
                                 "--journal", str(journal), "--opens-per-minute", "100000",
                                 "--max-open", str(2 * args.runs)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = re.search(r"(http://\S+)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
            witness_keyid = bundle.keyid_of_key(bundle.load_private_key(tmp / "witness.pem"))
            phases = [asyncio.run(load(url, keys, witness_keyid, args.seconds, n, stranger))
                      for n in (0, args.flooders)]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        j = Journal(journal)
        left_open = j.load()  # the hash chain of every open file checked
        lost = dup = 0
        for phase in phases:
            for run, seqs in phase.pop("acked").items():
                entries = left_open.get(run) or j.archived(run) or []  # archives: chain checked too
                on_disk = [e["seq"] for e in entries]
                lost += len(set(seqs) - set(on_disk))
                dup += len(on_disk) - len(set(on_disk)) + len(seqs) - len(set(seqs))
        files = sum(1 for _ in journal.rglob("*.jsonl*"))
        runs = sum(phase["runs"] for phase in phases)
        print(json.dumps({"clients": args.runs, "phases": phases, "lost": lost, "duplicated": dup,
                          "journal_files": files, "runs": runs}, indent=1))
        return 0 if lost == dup == 0 and files == runs else 1


if __name__ == "__main__":
    sys.exit(main())
