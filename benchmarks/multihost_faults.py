#!/usr/bin/env python3
"""How fast faults on several hosts end, on simulated hosts (needs root).

    sudo .venv/bin/python benchmarks/multihost_faults.py [--rounds N]

For each fault, N rounds of 2 hosts × 4 ranks (rank 0's host down: 3 hosts), small scaled
llama3_8b, ``io.timeout_s=20``: the seconds from the fault to mpiexec's return, from mpiexec's
return until no process of the job is left on any host, and until no file of the run is left, the
exit statuses and whether the one ``mlckpt: error:`` line came out.  The hosts, the launcher and the
fault seam are the tests' (benchmarks/lab/hostbed.py, tests/support/fault_launcher.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from lab.hostbed import HostBed, unavailable
from lab.processes import tagged_pids

REPO = Path(__file__).resolve().parents[1]

MPIEXEC = Path(sys.executable).parent / "mpiexec"


def one(bed: HostBed, hosts: int, fault: str, action: str, work: Path) -> dict[str, object]:
    token = uuid.uuid4().hex
    ready = work / "ready"
    ready.unlink(missing_ok=True)
    ckpt = work / f"ckpt-{token[:6]}"
    env = {**os.environ, "MLCKPT_TEST_FAULT": fault, "MLCKPT_TEST_FAULT_READY": str(ready),
           "MLCKPT_FAULTS_TEST_TOKEN": token, "XDG_CONFIG_HOME": str(work / "config")}
    n = 4 * hosts
    cmd = [*bed.enter("h0", work), str(MPIEXEC), "-launcher", "ssh", "-launcher-exec", str(bed.launcher),
           "-hosts", ",".join(bed.names[:hosts]), "-n", str(n), "-ppn", "4", sys.executable,
           str(REPO / "tests" / "support" / "fault_launcher.py"), "run", "workload=llama3_8b", f"ranks={n}",
           "scale=0.0002", "division=open", "checkpoint.num_writes=2", "checkpoint.num_reads=2",
           f"checkpoint.folder={ckpt}", "io.timeout_s=20"]
    proc = subprocess.Popen(cmd, cwd=work, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    t_fault = None
    if action != "kill":
        while not ready.exists():
            time.sleep(0.01)
        pid = bed.host_pid(f"h{int(fault.split(':')[1]) // 4 + 1}", int(ready.read_text()))
        t_fault = time.monotonic()
        if action == "cut":
            bed.cut("h2")
        elif action == "off":
            bed.power_off("h1")
        elif action == "stop":
            os.kill(pid, signal.SIGSTOP)
        if action != "stop":
            ready.unlink()
    else:
        t_fault = time.monotonic()  # the rank kills itself at its write 2: measured from its start
    out, _ = proc.communicate(timeout=300)
    t_exit = time.monotonic()
    gone = files = None
    while time.monotonic() - t_exit < 30 and (gone is None or files is None):
        if gone is None and not tagged_pids(token):
            gone = time.monotonic() - t_exit
        if files is None and (not ckpt.exists() or not any(p.is_file() for p in ckpt.rglob("*"))):
            files = time.monotonic() - t_exit
        time.sleep(0.05)
    if action == "cut":
        bed.heal("h2")
    return {"exit_s": t_exit - t_fault, "procs_s": gone, "files_s": files, "status": proc.returncode,
            "line": sum(ln.startswith("mlckpt: error: ") for ln in out.splitlines())}


FAULTS = [  # name, hosts, fault seam, action
    ("rank 5 killed on h2 (from the start)", 2, "kill:5:write:2", "kill"),
    ("rank 6 stopped on h2 (read 1)", 2, "pause:6:read:1", "stop"),
    ("h2 cut off (write 1)", 2, "pause:4:write:1", "cut"),
    ("h1 (rank 0) powered off (write 1)", 3, "pause:0:write:1", "off"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"multihost_faults: {why}", file=sys.stderr)
        return 2
    print(f"{'fault':36} {'fault→exit s':>13} {'exit→no process s':>18} {'exit→no file s':>15}  "
          "statuses  lines")
    with tempfile.TemporaryDirectory() as tmp:
        for name, hosts, fault, action in FAULTS:
            rows = []
            for r in range(args.rounds):
                bed = HostBed(Path(tmp) / f"bed-{action}-{r}", 3).up()
                try:
                    work = Path(tmp) / f"work-{action}-{r}"
                    work.mkdir()
                    rows.append(one(bed, hosts, fault, action, work))
                finally:
                    bed.down()

            def med(key: str, rows: list[dict[str, object]] = rows) -> str:
                vals = [float(x[key]) for x in rows if x[key] is not None]  # type: ignore[arg-type]
                missing = len(rows) - len(vals)
                return f"{statistics.median(vals):.2f}" + (f" ({missing} never)" if missing else "")

            print(f"{name:36} {med('exit_s'):>13} {med('procs_s'):>18} {med('files_s'):>15}  "
                  f"{sorted({x['status'] for x in rows})}  {sorted({x['line'] for x in rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
