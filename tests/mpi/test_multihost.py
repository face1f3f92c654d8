"""Faults on several hosts end cleanly on every host, on simulated hosts.

Each test runs ``mpiexec -launcher ssh`` on a login host h0 with 4 ranks on each of 2 or 3 hosts
(``benchmarks/lab/hostbed.py``: own network, hostname, mount, PID and clock namespaces; one shared
checkpoint folder; a node-local tmpfs each), injects one fault on a host, and checks what the
issue asks: a bounded end, exactly one ``mlckpt: error:`` line naming the rank and its host, the
documented exit status, no process of the job left on any host and no file of the run left on any
tier 10 s after mpiexec returned, and nothing that is not the run's touched.  The kill is a real
SIGKILL, the stop a real SIGSTOP, the partition a real unplugged cable (packets dropped, nothing
answers), the power cut kills every process of a host at once, the full disk is a real tmpfs.
Skipped where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab.hostbed import FAKETIME, HostBed, unavailable
from lab.processes import tagged_pids
from support import paths
from support.runs import snapshot

REPO = paths.REPO
LAUNCHER = paths.SUPPORT / "fault_launcher.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
PER_HOST = 4
WHY = unavailable()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(WHY is not None, reason=WHY or "")]

# mpiexec's status (MPICH 5.0.2) when a rank dies on one of several hosts: 255 when one of its
# proxies fails an assertion in the teardown (nearly always), else the dead rank's signal (9) or
# the status of a rank that the failure took down (a transport's crash, 11).  README: "several hosts".
DIED_STATUSES = {9, 11, 255}
MPICH_LINE = re.compile(r"^(Abort\(|=+$|=   |\[proxy:|\[mpiexec@|YOUR APPLICATION|This typically|Please see)")


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostBed]:
    b = HostBed(tmp_path_factory.mktemp("bed"), 3).up()
    yield b
    b.down()


@dataclass
class Ended:
    returncode: int
    out: str
    ended: float  # monotonic time mpiexec returned

    def error_line(self) -> str:
        """The one ``mlckpt: error:`` line; every other line is MPICH's, mlckpt's cleanup account
        or the run's progress."""
        assert "Traceback" not in self.out, self.out
        ours = [ln for ln in self.out.splitlines() if ln.startswith("mlckpt: error: ")]
        assert len(ours) == 1, self.out
        return ours[0]


class MultiJob:
    """``mpiexec`` on h0 over ``hosts`` hosts, running the test-only fault launcher."""

    def __init__(self, bed: HostBed, hosts: int, overrides: list[str], cwd: Path,
                 env: dict[str, str] | None = None) -> None:
        self.token = uuid.uuid4().hex
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("MLCKPT_", "PMI_", "HYDRA_")) or k == "MLCKPT_RETRY_DISTURBED"}
        full.update(env or {})
        full["MLCKPT_FAULTS_TEST_TOKEN"] = self.token
        n = hosts * PER_HOST
        cmd = [*bed.enter("h0", cwd), str(MPIEXEC), "-launcher", "ssh", "-launcher-exec", str(bed.launcher),
               "-hosts", ",".join(bed.names[:hosts]), "-n", str(n), "-ppn", str(PER_HOST),
               sys.executable, str(LAUNCHER), "run", "workload=llama3_8b", f"ranks={n}", "scale=0.0002",
               "division=open", "checkpoint.num_writes=2", "checkpoint.num_reads=2", *overrides]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=full, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float = 120) -> Ended:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in tagged_pids(self.token):
                os.kill(pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
            pytest.fail(f"mpiexec did not return within {timeout} s:\n{out}")
        return Ended(self.proc.returncode, out, time.monotonic())

    def ready_pid(self, path: Path, timeout: float = 90) -> int:
        """The faulted rank's pid once it wrote ``path``; the job's output if it ended first."""
        until = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended ({self.proc.returncode}) before the faulted rank wrote "
                            f"{path}:\n{self.proc.communicate()[0]}")
            if time.monotonic() > until:
                for pid in tagged_pids(self.token):
                    os.kill(pid, signal.SIGKILL)
                pytest.fail(f"timed out waiting for the faulted rank to write {path} ({timeout:g} s):\n"
                            f"{self.proc.communicate()[0]}")
            time.sleep(0.02)
        return int(path.read_text())


def no_process_within(token: str, seconds: float = 10.0) -> None:
    """Nothing of the job (mpiexec, proxies, ranks, guardians) on any host, within ``seconds``."""
    until = time.monotonic() + seconds
    while (left := tagged_pids(token)) and time.monotonic() < until:
        time.sleep(0.1)
    assert not left, f"processes of the job still running {seconds:g} s after mpiexec returned: {left}"


def run_files(bed: HostBed, folder: Path, hosts: int) -> list[str]:
    """This run's entries under ``folder`` as every host sees it (shared or node-local)."""
    found = []
    for h in bed.names[:hosts]:
        done = bed.run(h, "find", str(folder), "-mindepth", "1")
        found += [f"{h}:{p}" for p in done.stdout.split() if "/other" not in p]
    return sorted(set(found))


def nothing_left(bed: HostBed, folder: Path, hosts: int, seconds: float = 10.0) -> None:
    until = time.monotonic() + seconds
    while (left := run_files(bed, folder, hosts)) and time.monotonic() < until:
        time.sleep(0.1)
    assert not left, f"files of the run still there {seconds:g} s after mpiexec returned: {left}"


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """A checkpoint folder with someone else's files in it (a kept run of another user, with its
    marker): they must come through every fault untouched."""
    ckpt = tmp_path / "ckpt"
    other = ckpt / "other"
    (other / "ckpt-0001").mkdir(parents=True)
    (other / ".mlckpt-run").write_text("")
    (other / "ckpt-0001" / "zero_pp_rank_5_mp_rank_0_model_states.pt").write_bytes(os.urandom(8192))
    before = snapshot(other)
    yield tmp_path
    assert snapshot(other) == before




def fault_env(spec: str, ready: Path) -> dict[str, str]:
    return {"MLCKPT_TEST_FAULT": spec, "MLCKPT_TEST_FAULT_READY": str(ready)}


# ---------------------------------------------------------------------------------------------


def honest(status: int, out: str) -> None:
    """An honest run's end: valid, or disturbed by other processes and by nothing else.  The bed's
    hosts share one kernel and one disk, so each host's counters see the other hosts' ranks (and a
    neighbour's run) as other processes: a host's share of the device may pass FOREIGN-IO's, as
    it would beside a real tenant.  Never invalid."""
    findings = re.findall(r"^finding: \[([A-Z0-9-]+)\] \((\w+)\)", out, re.M)
    if status == 6:
        disturbed = {r for r, sev in findings if sev == "disturbed"}
        assert "verdict disturbed" in out and disturbed == {"FOREIGN-IO"}, out
    else:
        assert status == 0 and "verdict open" in out, out
    assert not [r for r, sev in findings if sev == "invalid"], out


def test_a_healthy_run_on_two_hosts_is_valid(bed: HostBed, work: Path) -> None:
    """The guardians link and stay out of the way: a valid result, nothing left."""
    job = MultiJob(bed, 2, [f"checkpoint.folder={work / 'ckpt'}"], work)
    end = job.wait()
    honest(end.returncode, end.out)
    assert "mlckpt: error" not in end.out
    no_process_within(job.token, 3)
    nothing_left(bed, work / "ckpt", 2, 0)


@pytest.mark.parametrize("hosts,rank,op", [(2, 5, "write 2"), (3, 9, "read 1")], ids=["2-hosts", "3-hosts"])
def test_a_rank_killed_on_another_host_is_named_there(bed: HostBed, work: Path, hosts: int, rank: int,
                                                      op: str) -> None:
    """The guardian of the dead rank's host names it (rank, host, op, file) while a neighbour's
    run on the spare host, on the same storage (a folder of its own: one run per folder), goes on
    unharmed."""
    kind, index = op.split()
    neighbour = None
    if hosts == 2:  # a healthy run of somebody else on h3, at the same time, same storage
        neighbour = subprocess.Popen(
            [*bed.enter("h3", work), sys.executable, "-m", "mlckpt", "run", "workload=llama3_8b", "ranks=4",
             "scale=0.0002", "division=open", f"checkpoint.folder={work / 'ckpt-neighbour'}",
             f"output.root={work / 'neighbour'}"],
            cwd=work, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    job = MultiJob(bed, hosts, [f"checkpoint.folder={work / 'ckpt'}"], work,
                   {"MLCKPT_TEST_FAULT": f"kill:{rank}:{kind}:{index}"})
    end = job.wait()
    host = f"h{rank // PER_HOST + 1}"
    line = end.error_line()
    assert re.match(rf"mlckpt: error: rank {rank} on {host} \(pid \d+\) died during {op}"
                    rf"( \(killed by signal 9, SIGKILL\))?, (writing|reading from) .*{work / 'ckpt'}",
                    line), line
    assert line.endswith("the MPI job was ended; removing this run's files"), line
    assert end.returncode in DIED_STATUSES, end.out
    no_process_within(job.token)
    if neighbour is not None:
        out, _ = neighbour.communicate(timeout=120)
        honest(neighbour.returncode, out)
    nothing_left(bed, work / "ckpt", hosts)


def test_a_killed_rank_in_a_tiered_run_leaves_no_tier_behind(bed: HostBed, work: Path) -> None:
    """Asynchronous, two tiers: the durable folder shared, the fast tier node-local on each host.
    Rank 5 dies on h2: h2's guardian sweeps the shared folder and its own fast tier, h1's its own."""
    fast = bed.local / f"fast-{uuid.uuid4().hex[:8]}"
    job = MultiJob(bed, 2, [f"checkpoint.folder={work / 'ckpt'}", f"checkpoint.tiers.fast={fast}",
                            "checkpoint.mode=async", "checkpoint.compute_interval_s=0"], work,
                   {"MLCKPT_TEST_FAULT": "kill:5:write:2"})
    end = job.wait()
    assert re.match(r"mlckpt: error: rank 5 on h2 \(pid \d+\) died during write 2", end.error_line()), end.out
    assert end.returncode in DIED_STATUSES, end.out
    no_process_within(job.token)
    nothing_left(bed, work / "ckpt", 2)
    nothing_left(bed, fast, 2)


def test_a_stopped_rank_on_another_host_is_named_by_rank_0(bed: HostBed, work: Path) -> None:
    ready = work / "ready"
    job = MultiJob(bed, 2, [f"checkpoint.folder={work / 'ckpt'}", "io.timeout_s=5"], work,
                   fault_env("pause:6:read:1", ready))
    pid = bed.host_pid("h2", job.ready_pid(ready))
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    ready.unlink()
    end = job.wait()
    line = end.error_line()
    # rank 6 restores what rank 2 on the other host wrote (the rank shift)
    assert re.match(r"mlckpt: error: rank 6 on h2: read 1 did not finish within io.timeout_s=5 .*reading "
                    r".*/ckpt-0001/zero_pp_rank_2_mp_rank_0_model_states.pt \(\+1 more\); aborting the MPI "
                    r"job; removed 32 checkpoint files of this run$", line), line
    assert end.ended - stopped < 5 + 10
    assert end.returncode in {1, 255}, end.out
    no_process_within(job.token)
    nothing_left(bed, work / "ckpt", 2)


def test_ranks_whose_mpi_proxy_died_are_stopped_when_the_job_fails(bed: HostBed, work: Path) -> None:
    """h2's MPI proxy dies while rank 4 is stuck: mpiexec can no longer reach h2's ranks.  Rank 0
    names rank 4 at io.timeout_s and aborts; h2's guardian, told the job failed, stops its ranks."""
    ready = work / "ready"
    job = MultiJob(bed, 2, [f"checkpoint.folder={work / 'ckpt'}", "io.timeout_s=5"], work,
                   fault_env("pause:4:write:1", ready))  # rank 4 stays paused: the ready file stays
    rank4 = bed.host_pid("h2", job.ready_pid(ready))
    proxy = int(Path(f"/proc/{rank4}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert Path(f"/proc/{proxy}/comm").read_text().strip() == "hydra_pmi_proxy"
    os.kill(proxy, signal.SIGKILL)
    end = job.wait()
    assert re.match(r"mlckpt: error: rank 4 on h2: write 1 did not finish within io.timeout_s=5 ",
                    end.error_line()), end.out
    assert end.returncode in {1, 255}, end.out
    assert tagged_pids(job.token)  # h2's ranks outlived mpiexec: nobody could reach them
    no_process_within(job.token)  # ... until their guardian stopped them
    nothing_left(bed, work / "ckpt", 2)


@pytest.mark.parametrize("hosts", [2, 3], ids=["2-hosts", "3-hosts"])
def test_a_host_cut_off_mid_write_ends_everywhere(bed: HostBed, work: Path, hosts: int) -> None:
    """h2's cable is unplugged while its ranks write: rank 0's guardian names h2 after 5 s of
    silence and ends the job; h2's guardian stops its ranks and its MPI proxy on its own (and on
    3 hosts, h3 stays quiet: the hub told it the failure was h2's)."""
    ready = work / "ready"
    job = MultiJob(bed, hosts, [f"checkpoint.folder={work / 'ckpt'}", "io.timeout_s=20"], work,
                   fault_env("pause:4:write:1", ready))
    job.ready_pid(ready)
    bed.cut("h2")
    try:
        cut = time.monotonic()
        ready.unlink()
        end = job.wait()
        line = end.error_line()
        assert line == ("mlckpt: error: lost contact with h2 (ranks 4-7) during write 1 (nothing heard for "
                        "5 s: a network partition, or that host is down); the MPI job was ended; removing "
                        "this run's files"), line
        assert end.ended - cut < 20 + 10  # io.timeout_s plus at most 10 s
        assert end.returncode in {9, 255}, end.out
        no_process_within(job.token)  # h2's too, while it is still cut off
        nothing_left(bed, work / "ckpt", hosts)
    finally:
        bed.heal("h2")


def test_a_nearly_full_node_local_disk_is_refused_before_any_io(bed: HostBed, work: Path) -> None:
    """Node-local checkpoint folders; h2's has 4 MiB free: the free-space gate names h2, exit 2,
    and no host got a file."""
    local = bed.local / f"ckpt-{uuid.uuid4().hex[:8]}"
    filler = bed.local / "filler"
    assert bed.run("h2", "fallocate", "-l", "60M", str(filler)).returncode == 0
    try:
        job = MultiJob(bed, 2, [f"checkpoint.folder={local}", "checkpoint.rank_shift=0"], work)
        end = job.wait()
        assert re.match(r"mlckpt: error: \[DISK-SPACE\] host h2: the checkpoint filesystem needs free space "
                        r"for all checkpoints: expected at least [\d.]+ MiB, got 4.00 MiB free",
                        end.error_line())
        assert end.returncode == 2, end.out
        no_process_within(job.token, 3)
        nothing_left(bed, local, 2, 0)
    finally:
        bed.run("h2", "rm", "-f", str(filler))


def test_disk_full_on_one_host_only(bed: HostBed, work: Path) -> None:
    """Node-local checkpoint folders; h2's fills up between the two writes: its ranks fail with
    ENOSPC, every rank ends, and no host keeps a file of the run."""
    local = bed.local / f"ckpt-{uuid.uuid4().hex[:8]}"
    filler = bed.local / "filler"
    ready = work / "ready"
    try:
        job = MultiJob(bed, 2, [f"checkpoint.folder={local}", "checkpoint.rank_shift=0",
                                "rules_version=1.8"],  # its node-local folders are tmpfs: MEMORY-FOLDER
                       work, fault_env("pause:4:write:2", ready))
        job.ready_pid(ready)
        bed.run("h2", "sh", "-c", f"dd if=/dev/zero of={filler} bs=1M 2>/dev/null; true")
        assert "/ckpt-0001/" in " ".join(run_files(bed, local, 2))  # write 1 is there, on both hosts
        ready.unlink()
        end = job.wait()
        line = end.error_line()
        assert re.match(r"mlckpt: error: rank [4-7] on h2: write 2: .*No space left on device", line), line
        assert end.returncode == 1, end.out
        no_process_within(job.token)
        nothing_left(bed, local, 2)
    finally:
        bed.run("h2", "rm", "-f", str(filler))


def test_rank_0s_host_going_down_ends_every_other_host(tmp_path_factory: pytest.TempPathFactory,
                                                       work: Path) -> None:
    """h1 (rank 0, the hub) loses power mid-write on 3 hosts: h2 and h3 each stop their ranks and
    proxy within 5 s; h2 (the first host after rank 0's) says so, once."""
    own = HostBed(tmp_path_factory.mktemp("bed-off"), 3).up()
    try:
        ready = work / "ready"
        job = MultiJob(own, 3, [f"checkpoint.folder={work / 'ckpt'}", "io.timeout_s=20"], work,
                       fault_env("pause:0:write:1", ready))
        job.ready_pid(ready)
        own.power_off("h1")
        off = time.monotonic()
        end = job.wait()
        line = end.error_line()
        assert line.startswith("mlckpt: error: ranks 4-7 on h2 lost contact with rank 0's host h1 during "
                               "write 1 (nothing heard for 5 s"), line
        assert "stopped ranks 4-7 and their MPI proxy (hydra_pmi_proxy)" in line, line
        assert end.ended - off < 20 + 10
        assert end.returncode != 0
        no_process_within(job.token)
        nothing_left(own, work / "ckpt", 3)
    finally:
        own.down()


@pytest.mark.skipif(not Path(FAKETIME).exists(), reason="needs Debian's libfaketime (package faketime)")
def test_a_host_whose_clock_is_off_is_refused_before_any_io(bed: HostBed, work: Path) -> None:
    """h2's wall clock is 90 s ahead: HOST-CLOCK-OFFSET names it before a byte is written (its
    records would fall outside the run on rank 0's clock), exit 2, nothing left."""
    bed.set_clock("h2", 90)
    try:
        job = MultiJob(bed, 2, [f"checkpoint.folder={work / 'ckpt'}"], work)
        end = job.wait()
        assert re.match(r"mlckpt: error: \[HOST-CLOCK-OFFSET\] host h2: every host's wall clock agrees with "
                        r"rank 0's host's .*: expected within 1 s of rank 0's host, got \+(89|90)\.\d{3} s",
                        end.error_line()), end.out
        assert end.returncode == 2, end.out
        no_process_within(job.token, 3)
        nothing_left(bed, work / "ckpt", 2, 0)
    finally:
        bed.set_clock("h2", 0)


@pytest.mark.parametrize("strategy", ["fanout", "nodecache"])
def test_a_serving_run_on_two_hosts_passes_the_checker(bed: HostBed, work: Path, strategy: str,
                                                       honest_bundles: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """Four replicas of two GPUs on two hosts (rules 1.13): under fan-out the holders of a shard
    are on both hosts and exchange their parts over the simulated network; under the node cache
    each host's first rank fills its own tmpfs.  The signed bundle passes mlckpt-check."""
    from support.forge import read_json, read_records
    from support.runs import printed_bundle
    from support.trees import tree_of

    from checker.tree_check import check_tree
    from mlckpt import bundle

    h = honest_bundles
    overrides = [f"checkpoint.folder={work / 'ckpt'}", f"serving.strategy={strategy}", "serving.tp=2",
                 "serving.loads=2", f"serving.node_tier={bed.local}", f"output.root={work / 'results'}",
                 f"system={h['dir'] / 'laptop-ext4.yaml'}", f"signing.key={h['dir'] / 'keys' / 'org.pem'}"]
    job = MultiJob(bed, 2, overrides, work)
    end = job.wait()
    assert end.returncode == 0 and "verdict open" in end.out, end.out
    b = printed_bundle(end.out)
    recs = read_records(b)
    assert {r["host"] for r in recs} == {"h1", "h2"}
    summary = read_json(b, "summary.json")
    shards = sum(r["bytes"] for r in recs if r["index"] == 0 and r["replica"] == 0)
    assert summary["replicas"] == 4 and summary["num_hosts"] == 2
    assert summary["storage_bytes"] == shards * (1 if strategy == "fanout" else 2)  # once, or once a host
    if strategy == "fanout":  # rank 4 (h2) received the parts ranks 0 and 2 (h1) read
        r4 = next(r for r in recs if r["rank"] == 4 and r["index"] == 0)
        assert r4["received_bytes"] == 3 * r4["storage_bytes"] > 0
    trusted = bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml")
    [got] = check_tree(tree_of(h, tmp_path / "t", b), trusted, jobs=1)["bundles"]
    assert got["verdict"] == "open", got["findings"]
    assert not [f for f in got["findings"] if f["severity"] in ("invalid", "open")
                and f["rule"] != "RUNNER-RELEASED"], got["findings"]
    nothing_left(bed, work / "ckpt", 2, 0)
    assert not any(bed.run(x, "find", str(bed.local), "-type", "f").stdout for x in ("h1", "h2"))
