#!/usr/bin/env python3
"""Fan-out and direct loading across simulated hosts, each with a link of known bandwidth, the
storage's read rate bounded too: does the measured time to ready follow the sizer's model?

    sudo .venv/bin/python benchmarks/serving_hosts.py [--hosts 2] [--replicas N] [--tp 1]
        [--scale 0.004] [--link-mbit 80] [--storage-mbs 60] [--chunk-mib 4] [--repeat 3]

The hosts are ``benchmarks/lab/hostbed.py``'s (network, hostname, mount and PID namespaces, one
veth each into a bridge); ``mpiexec`` runs on the login host h0 and places --replicas × --tp ranks
in blocks over h1..hN, so that every byte fan-out exchanges between hosts crosses their veths.
Each host's veth is shaped with a token bucket (``tc qdisc ... tbf``) to --link-mbit in both
directions, and every rank's reads from the storage are throttled together to --storage-mbs
(MB/s, 10^6 B) by a block-I/O cgroup on the checkpoint folder's device.  The loads are
``benchmarks/serving_load.py``'s worker: O_DIRECT cold reads, every byte verified after, the
strategies alternated round by round.

Printed per strategy: the median time to ready over --repeat loads and its range, what the
sizer (``mlckpt.workload.serving.scale_up`` at this scale, hosts of --replicas/--hosts replicas,
the storage's rate as given and each host's network at the TCP payload rate one shaped link
carried, measured on the bed before the loads) predicts, the ratio, and for fan-out the rate at
which the hosts received bytes from each other (from the plan's per-host network bytes) against
--hosts × that link rate.  Needs root, iproute2's tc and a cgroup v1 blkio hierarchy (exits 2 saying which is
missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlckpt.workload.serving import ScaleUp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
BIN = Path(sys.executable).parent
BLKIO = Path("/sys/fs/cgroup/blkio")


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="llama3_8b")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=None, help="default: one a host")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--scale", type=float, default=0.008,
                    help="of the weights' bytes (0.008: 128 MB a replica of llama3_8b)")
    ap.add_argument("--link-mbit", type=float, default=80.0, help="each host's link, each way (Mbit/s)")
    ap.add_argument("--storage-mbs", type=float, default=60.0,
                    help="the storage's read rate, all ranks (MB/s)")
    ap.add_argument("--chunk-mib", type=int, default=16,
                    help="fan-out's round (default: the runner's 16 MiB, which the sizer models)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=None, help="for the shard files (default: under /var/tmp)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="the ranks' records and the figures")
    return ap


def unavailable() -> str | None:
    from lab.hostbed import unavailable as no_bed

    if why := no_bed():
        return why
    if shutil.which("tc") is None:
        return "shaped links need iproute2's tc"
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        return "a bounded storage rate needs a cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio"
    return None


def shape(bed: object, host: str, mbit: float) -> None:
    """Both directions of ``host``'s veth: its own egress, and the switch port's towards it."""
    from lab.hostbed import HostBed

    assert isinstance(bed, HostBed)
    rate = ["rate", f"{mbit}mbit", "burst", "256kb", "latency", "200ms"]
    for pid, dev in ((bed.pids[host], "eth0"), (bed.switch, f"v{host}")):
        subprocess.run(["nsenter", "-t", str(pid), "-n", "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                        *rate], check=True, capture_output=True, timeout=30)


_RECEIVE = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5001))
s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n, t = 0, None
while b := c.recv(1 << 20):
    t = t or time.monotonic()
    n += len(b)
print(n / (time.monotonic() - t))
"""
_SEND = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5001)); b = bytes(1 << 20)
for _ in range(int(sys.argv[2])): s.sendall(b)
s.close()
"""


def probe_link(bed: object, mib: int = 16) -> float:
    """What one shaped link carries, TCP payload bytes/s from h2 to h1: the rate the sizer is given
    (a line rate less the headers), measured on this bed before the loads."""
    from lab.hostbed import HostBed

    assert isinstance(bed, HostBed)
    rx = subprocess.Popen([*bed.enter("h1"), sys.executable, "-c", _RECEIVE], stdout=subprocess.PIPE,
                          text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        subprocess.run([*bed.enter("h2"), sys.executable, "-c", _SEND, bed.address("h1"), str(mib)],
                       check=True, timeout=120)
        return float(rx.communicate(timeout=120)[0])
    finally:
        rx.kill()


def device_of(folder: Path) -> str:
    """MAJ:MIN of the block device under ``folder`` (a partition's whole disk for blkio)."""
    st = os.stat(folder)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sysfs = Path(f"/sys/dev/block/{major}:{minor}")
    if (sysfs / "partition").exists():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{major}:{minor}"


def sized(args: argparse.Namespace, replicas: int, link: float | None = None) -> dict[str, ScaleUp]:
    """The sizer's answer per strategy; ``link``: each host's network in bytes/s (default:
    --link-mbit's line rate)."""
    import yaml

    from mlckpt.workload.model import workload_from_config
    from mlckpt.workload.serving import Links, ServingLayout, scale_up

    node = yaml.safe_load((ROOT / "workloads" / "workload" / f"{args.workload}.yaml").read_text())
    w = workload_from_config(node)
    per_host = replicas * args.tp // args.hosts
    layout = ServingLayout(w.name, w.model, args.tp, replicas, gpus_per_host=per_host)
    links = Links(storage=args.storage_mbs * 1e6, network=link or args.link_mbit * 1e6 / 8)
    return {s: scale_up(layout, 0, replicas, links, s, scale=args.scale)  # type: ignore[arg-type]
            for s in ("direct", "fanout")}


def predicted(args: argparse.Namespace, replicas: int, link: float | None = None) -> dict[str, float]:
    """The sizer's time to ready per strategy."""
    return {s: up.seconds for s, up in sized(args, replicas, link).items()}


def run(args: argparse.Namespace, replicas: int, folder: Path) -> dict[str, object]:
    from lab.hostbed import HostBed

    ranks = replicas * args.tp
    bed = HostBed(Path(tempfile.mkdtemp(prefix="mlckpt-hosts-")), args.hosts).up()
    group = BLKIO / f"mlckpt-serving-hosts-{os.getpid()}"
    try:
        for h in bed.names:
            shape(bed, h, args.link_mbit)
        link = probe_link(bed)
        group.mkdir()
        (group / "blkio.throttle.read_bps_device").write_text(
            f"{device_of(folder)} {int(args.storage_mbs * 1e6)}\n")
        worker = [sys.executable, "-m", "mpi4py", str(ROOT / "benchmarks" / "serving_load.py"), "--worker",
                  "--workload", args.workload, "--tp", str(args.tp), "--replicas", str(replicas),
                  "--hosts", str(args.hosts), "--scale", str(args.scale), "--repeat", str(args.repeat),
                  "--chunk-mib", str(args.chunk_mib), "--strategies", "direct,fanout",
                  "--folder", str(folder)]
        mpiexec = [str(BIN / "mpiexec"), "-launcher", "ssh", "-launcher-exec", str(bed.launcher),
                   "-hosts", ",".join(bed.names), "-n", str(ranks), "-ppn", str(ranks // args.hosts), *worker]
        # every process mpiexec starts, on every host, inherits the throttled group
        inner = f"echo $$ > {group / 'cgroup.procs'} && exec " + " ".join(mpiexec)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))},
               "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([*bed.enter("h0", folder), "sh", "-c", inner], capture_output=True, text=True,
                              env=env, timeout=3600, check=False)
        if proc.returncode != 0:
            sys.exit(f"serving_hosts: the ranks failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return {**json.loads(proc.stdout), "link_bytes_s": link}
    finally:
        bed.down()
        shutil.rmtree(bed.root, ignore_errors=True)
        if group.exists():
            group.rmdir()


def report(args: argparse.Namespace, replicas: int, doc: dict) -> dict[str, object]:
    import yaml

    from mlckpt.serving_metrics import by_strategy, held_to_plan
    from mlckpt.workload.model import workload_from_config
    from mlckpt.workload.serving import ServingLayout
    from mlckpt.workload.serving_load import load_plan

    node = yaml.safe_load((ROOT / "workloads" / "workload" / f"{args.workload}.yaml").read_text())
    w = workload_from_config(node)
    layout = ServingLayout(w.name, w.model, args.tp, replicas)
    hosts = [r["host"] for r in sorted(doc["runs"][0], key=lambda r: r["rank"])]
    for recs in doc["runs"]:
        problems = held_to_plan(load_plan(layout, recs[0]["strategy"], hosts, args.scale), recs)
        if problems:
            sys.exit("serving_hosts: a load's records differ from its plan:\n  " + "\n  ".join(problems))
    # what the hosts lack and receive from each other, at least once (the sizer's figure)
    network = args.hosts * sized(args, replicas)["fanout"].network_bytes
    link = float(doc["link_bytes_s"])
    figures, model = by_strategy(doc["runs"]), predicted(args, replicas, link)
    print(f"{args.workload}: {replicas} replicas of TP {args.tp} on {args.hosts} simulated hosts, scale "
          f"{args.scale}: {figures['direct']['placed_bytes'] / 1e6:,.1f} MB placed; each host's link "
          f"{args.link_mbit:g} Mbit/s each way, carrying {link / 1e6:.2f} MB/s of TCP payload (measured), "
          f"the storage {args.storage_mbs:g} MB/s; {args.repeat} rounds\n")
    print("  strategy    ready (median, range)        sizer     measured / sizer")
    out: dict[str, object] = {"link_bytes_s": link}
    for s, f in figures.items():
        ratio = f["ready_s"] / model[s]
        print(f"  {s:<10}  {f['ready_s']:7.3f} s ({f['ready_min_s']:.3f}-{f['ready_max_s']:.3f})   "
              f"{model[s]:7.3f} s   {ratio:6.3f}")
        out[s] = {**f, "sizer_s": model[s], "measured_over_sizer": ratio}
    rate = network / figures["fanout"]["ready_s"]
    links = args.hosts * link
    print(f"\n  fan-out: the hosts received {network / 1e6:,.1f} MB from each other, at "
          f"{rate / 1e6:.2f} MB/s in all: {rate / links:.3f} × the {args.hosts} links "
          f"({links / 1e6:.2f} MB/s)")
    print(f"  fan-out vs direct: {figures['direct']['ready_s'] / figures['fanout']['ready_s']:.2f}x")
    out["network_bytes"], out["network_over_links"] = network, rate / (args.hosts * link)
    return out


def main() -> int:
    args = args_parser().parse_args()
    if why := unavailable():
        print(f"serving_hosts: {why}", file=sys.stderr)
        return 2
    replicas = args.replicas or args.hosts
    if replicas * args.tp % args.hosts:
        print(f"serving_hosts: --replicas × --tp ({replicas * args.tp}) must split evenly over --hosts "
              f"({args.hosts})", file=sys.stderr)
        return 2
    folder = args.folder or Path(tempfile.mkdtemp(prefix="mlckpt-serving-hosts-", dir="/var/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        doc = run(args, replicas, folder.resolve())
        figures = report(args, replicas, doc)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "figures": figures, **doc}))
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
