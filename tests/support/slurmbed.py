"""A real one-node Slurm for the tests: munged, slurmctld and slurmd from Debian's packages, started
in a folder of their own with a generated configuration, stopped afterwards.

The node declares 16 CPUs whatever the machine has (``SlurmdParameters=config_overrides``), so a
step of 4 or 8 tasks runs on a 2-core CI machine as it would on a real compute node.  The daemons
run as root (as on CI) with no cgroups (``proctrack/linuxproc``, ``task/none``): what is tested is
how mlckpt meets srun, sbatch and scancel, not Slurm's confinement.

    bed = start(tmp_path / "slurm")      # or: python tests/support/slurmbed.py FOLDER (until Ctrl-C)
    subprocess.run(["srun", "-n", "4", "--mpi=pmi2", ...], env=bed.env)
    bed.stop()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue")
CPUS = 16
KILL_WAIT_S = 30  # Slurm's default: SIGTERM, then SIGKILL this much later


def unavailable() -> str | None:
    """Why no Slurm can be started here (None: it can)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"Slurm is not installed (no {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (as on CI); not root here"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Slurm:
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def logs(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                       for p in sorted(self.root.glob("*.log")))

    def run(self, *args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, text=True, capture_output=True, timeout=timeout,
                              check=False, **kw)  # type: ignore[call-overload, no-any-return]

    def wait_idle(self, timeout: float = 60) -> None:
        """Until no job is in the queue (a cancelled job's step has ended)."""
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            if not self.run("squeue", "-h", timeout=20).stdout.strip():
                return
            time.sleep(0.5)
        raise TimeoutError("jobs still queued:\n" + self.run("squeue", timeout=20).stdout)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def _config(root: Path, host: str, ports: tuple[int, int], socket_path: Path) -> str:
    return f"""ClusterName=mlckpt-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait={KILL_WAIT_S}
SlurmdParameters=config_overrides
NodeName={host} CPUs={CPUS} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


def start(root: Path, timeout: float = 60) -> Slurm:
    """munged, slurmctld and slurmd in ``root`` (wiped first); returns once the node is idle."""
    shutil.rmtree(root, ignore_errors=True)
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(parents=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    sock = root / "munge" / "munge.socket"
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_config(root, host, (_free_port(), _free_port()), sock))
    bed = Slurm(root, {**os.environ, "SLURM_CONF": str(conf)})
    for k in [k for k in bed.env if k.startswith(("SLURM_", "PMI_", "PMIX_", "OMPI_"))]:
        if k != "SLURM_CONF":
            del bed.env[k]
    log = open(root / "munged.log", "ab")
    bed.procs.append(subprocess.Popen(
        [_exe("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
         f"--pid-file={root / 'munge' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'seed'}",
         f"--log-file={root / 'munged.log'}"], stdout=log, stderr=log, start_new_session=True))
    try:
        _wait(lambda: sock.exists(), timeout, "munged's socket", bed)
        for daemon in ("slurmctld", "slurmd"):
            out = open(root / f"{daemon}.out.log", "ab")
            bed.procs.append(subprocess.Popen([_exe(daemon), "-D", "-f", str(conf)], env=bed.env,
                                              stdout=out, stderr=out, start_new_session=True))
        _wait(lambda: "idle" in bed.run("sinfo", "-h", "-o", "%t", timeout=20).stdout, timeout,
              "the node to be idle", bed)
    except BaseException:
        bed.stop()
        raise
    return bed


def _wait(ready: object, timeout: float, what: str, bed: Slurm) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            if ready():  # type: ignore[operator]
                return
        if any(p.poll() is not None for p in bed.procs):
            raise RuntimeError(f"a Slurm daemon ended while waiting for {what}:\n{bed.logs()}")
        time.sleep(0.3)
    raise TimeoutError(f"no {what} after {timeout:g} s:\n{bed.logs()}")


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mlckpt-slurm").absolute()
    bed = start(folder)
    print(f"export SLURM_CONF={bed.env['SLURM_CONF']}", flush=True)
    print(f"# a one-node Slurm in {folder}; Ctrl-C stops it", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        bed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
