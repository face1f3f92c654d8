#!/usr/bin/env python3
"""TEST-ONLY: several simulated hosts on one machine, for the multi-host fault tests.

    python benchmarks/lab/hostbed.py up N DIR     bring up a login host h0 and hosts h1..hN, print their
                                         pids, keep them up until interrupted

Each host is a ``sleep`` holding its own network, UTS (hostname), mount and PID namespaces, so a
process on it sees its own hostname, its own loopback and address, its own node-local tmpfs at
``DIR/local`` and only its own processes; killing that ``sleep`` (PID 1 of the host's PID
namespace) kills everything on the host at once, as a power cut would.  A switch namespace holds a
bridge; every host has one veth into it (``10.77.0.(i+1)/24``).  Cutting a host's cable detaches
its switch port from the bridge, so its packets are dropped silently, as in a real partition
(the link stays up, nothing answers).  Each host sees an ``/etc/hosts`` naming every host, bound
over the machine's one inside its mount namespace.  Everything else, the checkpoint folder
included, is the machine's filesystem: the shared storage.

mpiexec runs on h0 (a login node with no ranks) and starts its proxies on h1..hN through
``DIR/launch``, a stand-in for ssh that enters the named host's namespaces.

Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN), ``unshare``/``nsenter`` and ``ip`` (iproute2);
:func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
LOCAL_MIB = 64  # each host's node-local tmpfs
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's libfaketime


def _sh(*argv: str) -> None:
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=30)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def _in_own_namespace(pid: int, kind: str = "net") -> None:
    """Wait until ``pid`` has left this process's namespace of ``kind`` (unshare is quick, not
    instant)."""
    mine = os.readlink(f"/proc/self/ns/{kind}")
    until = time.monotonic() + 10
    while os.readlink(f"/proc/{pid}/ns/{kind}") == mine:
        assert time.monotonic() < until, f"{pid} never entered a {kind} namespace of its own"
        time.sleep(0.01)


def _child_of(pid: int) -> int:
    """unshare --fork's child: PID 1 of the new PID namespace."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    until = time.monotonic() + 10
    while time.monotonic() < until:
        kids = path.read_text().split()
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise RuntimeError(f"unshare {pid} started no child")


def unavailable() -> str | None:
    """Why simulated hosts cannot be made here, or None."""
    if sys.platform != "linux":
        return "simulated hosts need Linux namespaces"
    if os.geteuid() != 0:
        return "simulated hosts need root (network and mount namespaces)"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"simulated hosts need {tool!r} (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"namespaces refused here: {probe.stderr.strip()}"
    return None


@dataclass
class HostBed:
    """A login host ``h0`` and hosts ``h1``..``hN`` (see the module docstring)."""

    root: Path
    n: int
    pids: dict[str, int] = field(default_factory=dict)  # host -> PID 1 of its namespaces
    holders: list[subprocess.Popen[bytes]] = field(default_factory=list)
    switch: int = 0

    @property
    def names(self) -> list[str]:
        return [f"h{i}" for i in range(1, self.n + 1)]

    @property
    def local(self) -> Path:
        """Each host's node-local tmpfs (one path, a different filesystem on every host)."""
        return self.root / "local"

    @property
    def launcher(self) -> Path:
        return self.root / "launch"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{int(host[1:]) + 1}"

    def up(self) -> HostBed:
        self.root.mkdir(parents=True, exist_ok=True)
        self.local.mkdir(exist_ok=True)
        hosts = self.root / "hosts"
        hosts.write_text("127.0.0.1 localhost\n"
                         + "".join(f"{self.address(h)} {h}\n" for h in ["h0", *self.names]))
        sw = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
        self.holders.append(sw)
        self.switch = sw.pid
        _in_own_namespace(sw.pid)
        _sh("nsenter", "-t", str(sw.pid), "-n", "ip", "link", "add", "br0", "type", "bridge")
        _sh("nsenter", "-t", str(sw.pid), "-n", "ip", "link", "set", "br0", "up")
        for host in ["h0", *self.names]:
            self._host(host, hosts)
        (self.root / "pids").write_text("".join(f"{h} {p}\n" for h, p in self.pids.items()))
        self.launcher.write_text(_LAUNCH.format(pids=self.root / "pids", clocks=self.root / "clocks",
                                                faketime=FAKETIME))
        self.launcher.chmod(0o755)
        return self

    def _host(self, host: str, hosts: Path) -> None:
        # A boot id of its own: MPI's transports (UCX) take one boot id for one machine and would
        # try shared memory between hosts.
        boot = self.root / f"{host}.boot_id"
        boot.write_text(f"{uuid.uuid4()}\n")
        setup = (f"hostname {host} && mount --bind {hosts} /etc/hosts && "
                 f"mount --bind {boot} /proc/sys/kernel/random/boot_id && "
                 f"mount -t tmpfs -o size={LOCAL_MIB}m tmpfs {self.local} && exec sleep infinity")
        # h0 keeps the machine's PID namespace and /proc: its launcher finds the hosts' pids there.
        # Its own monotonic and boot-time clocks (a time namespace, offset by the host's number),
        # as a separate machine has: runs check that differently named hosts do not share one.
        pid_ns = [] if host == "h0" else ["--pid", "--fork", "--mount-proc", "--time",
                                          f"--monotonic={int(host[1:]) * 1000}",
                                          f"--boottime={int(host[1:]) * 1000}"]
        holder = subprocess.Popen(["unshare", "--net", "--uts", "--mount", *pid_ns,
                                   "--propagation", "private", "--", "sh", "-c", setup])
        self.holders.append(holder)
        pid = holder.pid if host == "h0" else _child_of(holder.pid)
        _in_own_namespace(pid)
        self.pids[host] = pid
        port = f"v{host}"
        _sh("ip", "link", "add", port, "netns", str(self.switch), "type", "veth",
            "peer", "name", "eth0", "netns", str(pid))
        _sh("nsenter", "-t", str(self.switch), "-n", "ip", "link", "set", port, "master", "br0", "up")
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["ip", "addr", "add", f"{self.address(host)}/24", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"]):
            _sh("nsenter", "-t", str(pid), "-n", *cmd)
        until = time.monotonic() + 10  # the holder's own mounts (hostname, /etc/hosts, tmpfs) are done
        while subprocess.run([*self.enter(host), "mountpoint", "-q", str(self.local)]).returncode:
            assert time.monotonic() < until, f"{host}: its node-local tmpfs never appeared"
            time.sleep(0.02)

    def enter(self, host: str, wd: Path | None = None) -> list[str]:
        """The argv prefix that runs a command on ``host`` (in ``wd``, default this folder)."""
        pid = ["-p", "-T"] if host != "h0" else []
        where = f"--wd={wd or os.getcwd()}"
        return ["nsenter", "-t", str(self.pids[host]), "-n", "-u", "-m", *pid, where, "--"]

    def run(self, host: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.enter(host), *argv], capture_output=True, text=True, timeout=60)

    def host_pid(self, host: str, pid: int) -> int:
        """The machine's pid of the process that ``host`` knows as ``pid``."""
        ns = os.readlink(f"/proc/{self.pids[host]}/ns/pid")
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                    continue
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if nspid and int(nspid[-1]) == pid:
                return int(entry)
        raise ProcessLookupError(f"{host} has no process {pid}")

    def set_clock(self, host: str, offset_s: float) -> None:
        """Processes started on ``host`` from now on read its wall clock ``offset_s`` off (Debian's
        libfaketime, preloaded by the launcher: a real clock cannot be set per namespace).  Their
        monotonic clock moves by the same constant (libfaketime's sleeps fail with EINVAL when it
        is left alone), which no duration sees."""
        path = self.root / "clocks"
        clocks = dict(ln.split() for ln in path.read_text().splitlines()) if path.exists() else {}
        clocks[host] = f"{offset_s:+g}"
        path.write_text("".join(f"{h} {o}\n" for h, o in clocks.items() if float(o) != 0))

    def cut(self, host: str) -> None:
        """Unplug ``host``'s cable at the switch: its packets go nowhere, nothing tells it so."""
        _sh("nsenter", "-t", str(self.switch), "-n", "ip", "link", "set", f"v{host}", "nomaster")

    def heal(self, host: str) -> None:
        _sh("nsenter", "-t", str(self.switch), "-n", "ip", "link", "set", f"v{host}", "master", "br0")

    def power_off(self, host: str) -> None:
        """Every process on ``host`` dies at once (PID 1 of its namespace is killed), its cable
        cut first: a host without power closes no connection, nobody hears from it again."""
        self.cut(host)
        os.kill(self.pids[host], signal.SIGKILL)

    def down(self) -> None:
        for holder in self.holders:
            holder.kill()
        for holder in self.holders:
            holder.wait()
        for pid in self.pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# mpiexec's ssh stand-in: hydra calls it as ``launch [ssh options] HOST COMMAND...`` and, as with
# ssh, the command is one shell line on the far side.
_LAUNCH = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
pid=$(awk -v h="$host" '$1 == h {{ print $2 }}' {pids})
[ -n "$pid" ] || {{ echo "launch: no such host: $host" >&2; exit 255; }}
offset=$(awk -v h="$host" '$1 == h {{ print $2 }}' {clocks} 2>/dev/null)
if [ -n "$offset" ]; then
  export LD_PRELOAD={faketime} FAKETIME="$offset"
fi
nsenter -t "$pid" -n -u -m -p -T --wd="$PWD" -- sh -c "exec $*" &
wait $!
status=$?
# A host that went down answers nothing: ssh would wait (for its keepalive timeout), so do we.
[ -d /proc/"$pid" ] || exec sleep infinity
exit $status
"""


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "up":
        why = unavailable()
        if why:
            print(why, file=sys.stderr)
            return 2
        bed = HostBed(Path(argv[2]), int(argv[1])).up()
        for h, p in bed.pids.items():
            print(h, p, bed.address(h))
        print(f"mpiexec on h0: {' '.join(bed.enter('h0'))} mpiexec -launcher ssh "
              f"-launcher-exec {bed.launcher} -hosts {','.join(bed.names)} ...")
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        bed.down()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
