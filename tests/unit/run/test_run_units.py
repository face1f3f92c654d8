"""The runner's parts, unit-tested without MPI: the guardian's state and its report line, the op
watch with a fake channel, collective agreement with a fake communicator, the manifest, the gates
and cleanup's ownership."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mlckpt import formats
from mlckpt.errors import IOFailure, UsageError
from mlckpt.plan.config import setup
from mlckpt.rules import Finding
from mlckpt.run.collective import CollectiveFailure, Job, failures_of
from mlckpt.run.console import Console, op_line
from mlckpt.run.guardian.state import GuardianState
from mlckpt.run.phases.gates import (
    Gates,
    blocking_message,
    folder_problem,
    host_specs,
    io_engine_refusal,
    judge,
)
from mlckpt.run.phases.publish import RunId, manifest_of
from mlckpt.run.storage.backends import Files
from mlckpt.run.storage.cleanup import RUN_MARKER, Created, sweep_run
from mlckpt.run.watch import OpWatch

SMALL = [
    "workload=llama3_8b",
    "division=open",
    "scale=0.001",
    "ranks=4",
    "checkpoint.num_writes=2",
    "checkpoint.num_reads=1",
    "io.direct=false",
]


# --------------------------------------------------------------------------------------------
# The guardian: messages in, who died first, the report line


def started_state(tmp_path: Path) -> GuardianState:
    st = GuardianState(hosts={0: "h0"}, leader_pid=100)
    watch = st.handle({"ranks": [[0, 100, "h0", 3], [1, 101, "h0", 3], [2, 102, "h1", 3]], "host": "h0"})
    assert watch == [(1, 101, 3)]  # this host's ranks but rank 0 (the guardian's parent)
    st.handle(
        {
            "run": str(tmp_path / "run"),
            "keep": False,
            "dirs": [],
            "names": [["a.pt", "b.pt"], ["c.pt"], ["d.pt"]],
            "partial": str(tmp_path / ".run.partial"),
        }
    )
    return st


def test_guardian_names_the_first_rank_and_its_file(tmp_path: Path) -> None:
    st = started_state(tmp_path)
    st.handle({"step": "write 2", "ckpt": 2})
    st.how[0] = "killed by signal 9, SIGKILL"
    st.ended([0])
    st.ended([1])  # later deaths do not change who was first
    assert st.first == [0] and st.ckpt == 2
    assert st.what() == (
        f"rank 0 on h0 (pid 100) died during write 2 (killed by signal 9, SIGKILL), "
        f"writing {tmp_path / 'run' / 'ckpt-0002' / 'a.pt'} (+1 more)"
    )


def test_guardian_reads_and_simultaneous_deaths(tmp_path: Path) -> None:
    st = started_state(tmp_path)
    st.handle({"step": "write 1", "ckpt": 1})
    st.handle({"step": "read 1", "ckpt": 1})
    st.ended([1, 0])
    assert st.ckpt == 1 and st.cur == 1
    assert st.what() == (
        f"ranks 0, 1 on h0 died at the same moment during read 1, reading from "
        f"{tmp_path / 'run' / 'ckpt-0001'}"
    )


def test_guardian_ignores_ends_after_the_final_step_and_goodbye(tmp_path: Path) -> None:
    st = started_state(tmp_path)
    st.handle({"step": "cleanup and result", "final": True})
    st.ended([1])
    assert st.first == [] and not st.said_goodbye
    st.handle({"end": "clean"})
    assert st.said_goodbye


def test_guardian_report_sweeps_the_planned_files_only(tmp_path: Path) -> None:
    st = started_state(tmp_path)
    run = tmp_path / "run"
    (run / "ckpt-0001").mkdir(parents=True)
    (run / RUN_MARKER).touch()
    for name in ("a.pt", "c.pt"):
        (run / "ckpt-0001" / name).write_bytes(b"x")
    (run / "ckpt-0001" / "foreign.txt").write_bytes(b"not ours")
    st.handle({"step": "write 1", "ckpt": 1})
    st.ended([2])
    st.hosts[2] = "h1"
    line = st.report()
    assert line.startswith("mlckpt: error: rank 2 on h1 (pid ?) died during write 1, writing ")
    assert "the MPI job was ended; removed 2 checkpoint files of this run; some entries could not" in line
    assert sorted(p.name for p in (run / "ckpt-0001").iterdir()) == ["foreign.txt"]


# --------------------------------------------------------------------------------------------
# The op watch and collective agreement, with fakes


class FakeChannel:
    """Ranks report "done" by appending to ``arrived``; the watch receives them in order."""

    def __init__(self) -> None:
        self.arrived: list[int] = []
        self.received: list[int] = []
        self.lock = threading.Lock()

    def done_from(self) -> int | None:
        with self.lock:
            if not self.arrived:
                return None
            src = self.arrived.pop(0)
            self.received.append(src)
            return src

    def recv_done(self, source: int) -> None:
        with self.lock:
            self.arrived.remove(source)
            self.received.append(source)


def test_op_watch_calls_the_stall_handler_with_the_late_ranks() -> None:
    ch, calls = FakeChannel(), []
    watch = OpWatch(ch, 4, 0.2, lambda late, el: calls.append((late, el)), poll_s=0.005)
    ch.arrived += [1, 3]  # rank 2 never reports; rank 0 has not finished either
    watch.thread.join(2)
    assert len(calls) == 1 and calls[0][0] == [0, 2] and 0.2 <= calls[0][1] < 1.0


def test_op_watch_is_quiet_when_everyone_is_done() -> None:
    ch, calls = FakeChannel(), []
    watch = OpWatch(ch, 3, 0.3, lambda late, el: calls.append(late), poll_s=0.005)
    ch.arrived += [2, 1]
    watch.own_done()
    watch.thread.join(2)
    watch.finish()
    assert calls == [] and sorted(ch.received) == [1, 2]


def test_op_watch_finish_collects_the_late_messages() -> None:
    ch, calls = FakeChannel(), []
    watch = OpWatch(ch, 3, 30.0, lambda late, el: calls.append(late), poll_s=0.005)
    watch.own_done()
    ch.arrived.append(2)
    time.sleep(0.05)
    ch.arrived.append(1)  # arrives as the op is agreed: finish() receives what is still pending
    watch.finish()
    assert calls == [] and sorted(ch.received) == [1, 2] and watch.pending == set()


class FakeComm:
    """One rank's view of an allgather over fixed values of every rank."""

    def __init__(self, rank: int, errors: list[Any], hosts: list[str]) -> None:
        self.rank, self.errors, self.hosts = rank, errors, hosts

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return len(self.hosts)

    def allgather(self, value: Any) -> list[Any]:
        if isinstance(value, str):
            return self.hosts
        out = list(self.errors)
        out[self.rank] = value
        return out


def test_agreement_raises_the_lowest_failure_everywhere() -> None:
    others = [None, ("IOFailure", "write 1: disk full", 1), None, ("UsageError", "bad", 2)]
    job = Job(FakeComm(0, others, ["a", "a", "b", "b"]), Console())
    with pytest.raises(CollectiveFailure) as info:
        job.agree(None)
    assert str(info.value) == "rank 1 on a: write 1: disk full (and 1 more rank)"
    assert info.value.exit_status == 1


def test_agreement_names_no_rank_for_bad_input() -> None:
    errs = [None, ("ConfigError", "io.threads: must be >= 1", 2)]
    job = Job(FakeComm(0, errs, ["a", "a"]), Console())
    with pytest.raises(CollectiveFailure, match=r"^io.threads: must be >= 1$"):
        job.agree(None)
    job = Job(FakeComm(0, [None, None], ["a", "a"]), Console())
    job.agree(None)  # nobody failed: no exception


def test_step_turns_a_defect_into_an_internal_failure() -> None:
    job = Job(FakeComm(0, [None], ["a"]), Console())
    with pytest.raises(
        CollectiveFailure, match=r"^rank 0 on a: prepare: ZeroDivisionError: division by zero$"
    ):
        with job.step("prepare"):
            _ = 1 / 0
    assert failures_of([None, ("X", "m", 3)], ["a", "b"])[0].host == "b"


# --------------------------------------------------------------------------------------------
# Gates (pure judging over measured facts) and the manifest


def measured(host: str, **over: Any) -> dict[str, Any]:
    m = {
        "host": host,
        "mem_available_bytes": 64 << 30,
        "disk_free_bytes": 500 << 30,
        "folder_problem": None,
        "direct_ok": None,
        "dontcache_ok": None,
        "facts": {"hostname": host},
        "fast_free_bytes": None,
        "fast_problem": None,
        "fast_fs": None,
        "fast_direct_ok": False,
    }
    m.update(over)
    return m


def test_gates_pass_and_map_hosts() -> None:
    s = setup(SMALL)
    g = judge(s, ["a", "a", "b", "b"], [measured("a"), measured("b")])
    assert [(h.name, h.ranks) for h in g.hosts] == [("a", (0, 1)), ("b", (2, 3))]
    assert g.verdict == "open" and g.shift == 2 and g.leader(2) and not g.leader(3)
    assert g.facts == ({"hostname": "a"}, {"hostname": "b"})


def test_gates_refuse_a_host_without_memory() -> None:
    s = setup(SMALL)
    with pytest.raises(UsageError, match=r"^\[HOST-MEMORY\] host b: "):
        judge(s, ["a", "a", "b", "b"], [measured("a"), measured("b", mem_available_bytes=1 << 20)])


def test_gates_refuse_o_direct_where_the_filesystem_does_not_take_it() -> None:
    s = setup([*SMALL[:-1], "io.direct=true"])
    with pytest.raises(
        UsageError,
        match=r"^\[IO-ENGINE\] host b: the I/O mode must work on the checkpoint "
        r"filesystem of every host: O_DIRECT \(io.direct=true; use io.direct=false on e.g. "
        r"tmpfs\); got refused at ",
    ):
        judge(s, ["a", "b", "b", "b"], [measured("a", direct_ok=True), measured("b", direct_ok=False)])
    assert io_engine_refusal([measured("a", dontcache_ok=False)], "/x").key == "io.dontcache"  # type: ignore[union-attr]


def test_blocking_message_shows_every_blocking_finding() -> None:
    f = [Finding("A", "warning", "w"), Finding("B", "open", "b"), Finding("C", "invalid", "c")]
    assert blocking_message(f, "open") == "[C] c"
    assert blocking_message(f, "closed") == (
        "[B] b (closed division: fix it, or run with division=open)\n  also: [C] c")
    assert blocking_message(f[:1], "closed") is None
    assert [h.name for h in host_specs(["x", "y", "x"], [measured("y"), measured("x")])] == ["x", "y"]


def test_folder_problem(tmp_path: Path) -> None:
    assert folder_problem(tmp_path / "new") is None  # mlckpt creates the last folder itself
    assert "its parent" in str(folder_problem(tmp_path / "new" / "deeper"))  # never the path to it
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "run1").mkdir()
    (tmp_path / "ours" / "run1" / RUN_MARKER).touch()
    assert folder_problem(tmp_path / "ours") is None
    (tmp_path / "ours" / "notes.txt").write_text("x")
    assert (
        folder_problem(tmp_path / "ours")
        == f"{tmp_path / 'ours'} holds files mlckpt did not write (notes.txt)"
    )
    (tmp_path / "file").write_text("x")
    assert folder_problem(tmp_path / "file") == f"{tmp_path / 'file'} is not a directory"


def test_manifest_is_a_pure_value() -> None:
    s = setup(SMALL)
    g = judge(s, ["a", "a", "a", "a"], [measured("a")])
    m = manifest_of(
        s,
        g,
        RunId(0xABC, "20261124T000000Z-llama3_8b-4r-0000000000000abc"),
        ranks=4,
        overrides=SMALL,
        started="s",
        ended="e",
        description={"system_name": "sut"},
    )
    assert m["run_format"] == formats.RUN.version and m["run_id"] == "0000000000000abc"
    assert m["hosts"] == [{"host": "a", "ranks": [0, 1, 2, 3]}] and m["rank_shift"] == 0
    assert (m["workload"], m["division"], m["scaled"], m["scale"]) == ("llama3_8b", "open", True, 0.001)
    assert m["system_name"] == "sut" and m["pipeline"]["mode"] == "sync" and m["pipeline"]["fast_fs"] == {}
    assert m["verdict"] == "open" and m["findings"] == []


def test_op_line_labels_aggregate_and_slowest_rank() -> None:
    recs = [
        {"t0_ns": 0, "t1_ns": 2_000_000_000, "bytes": 2 << 30, "host": "a"},
        {"t0_ns": 0, "t1_ns": 1_000_000_000, "bytes": 2 << 30, "host": "a"},
    ]
    assert (
        op_line(recs, "write", 1, 3, {})
        == "write 1/3: 4.00 GiB from 2 ranks in 2.00 s = 2.00 GiB/s aggregate (slowest rank 1.00 GiB/s "
        "on its own)"
    )


# --------------------------------------------------------------------------------------------
# Cleanup owns what it created


def test_created_removes_its_own_files_and_folders_only(tmp_path: Path) -> None:
    outer = tmp_path / "made" / "run"
    order: list[str] = []
    with Created(keep=False, between=lambda: order.append("barrier")) as c:
        missing = c.missing_above(outer)
        outer.mkdir(parents=True)
        (outer / RUN_MARKER).touch()
        c.add_dir(outer, root=True)
        (outer / "ckpt-0001").mkdir()
        c.add_dir(outer / "ckpt-0001")
        (outer / "ckpt-0001" / "x.pt").write_bytes(b"1")
        c.add_files([str(outer / "ckpt-0001" / "x.pt")])
        (tmp_path / "theirs.txt").write_text("keep me")
    assert missing == [tmp_path / "made"] and order == ["barrier"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.txt"]


def test_created_keeps_everything_with_keep_and_cleans_on_failure(tmp_path: Path) -> None:
    with Created(keep=True) as c:
        (tmp_path / "f").write_bytes(b"1")
        c.add_files([str(tmp_path / "f")])
    assert (tmp_path / "f").exists()
    with pytest.raises(IOFailure):
        with Created(keep=False) as c:
            c.add_files([str(tmp_path / "f")])
            raise IOFailure("write 1: disk full", op="write", path=str(tmp_path / "f"))
    assert not (tmp_path / "f").exists()


def test_sweep_run_removes_only_planned_regular_files(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "ckpt-0001").mkdir(parents=True)
    (root / RUN_MARKER).touch()
    (root / "ckpt-0001" / "a.pt").write_bytes(b"1")
    (root / "ckpt-0001" / "b.pt").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("not ours")
    note = sweep_run(root, ["a.pt", "b.pt"], 2, keep=False)
    assert note.startswith("removed 1 checkpoint file of this run")
    assert (tmp_path / "elsewhere").read_text() == "not ours"
    assert sweep_run(root, ["a.pt"], 1, keep=True) == f"checkpoint.keep=true: checkpoint files kept in {root}"


def test_gates_value_is_frozen() -> None:
    s = setup(SMALL)
    g: Gates = judge(s, ["a"] * 4, [measured("a")])
    with pytest.raises(AttributeError):
        g.verdict = "closed"  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# The write and read phases on one rank, without MPI: real files, real fsync, every page verified


class OneRank:
    """A communicator of one rank: every collective returns this rank's own value."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def allgather(self, value: Any) -> list[Any]:
        return [value]

    def gather(self, value: Any, root: int = 0) -> list[Any]:
        return [value]

    def bcast(self, value: Any, root: int = 0) -> Any:
        return value

    def Barrier(self) -> None:
        pass

    def Ibarrier(self) -> Any:
        return _Done()


class _Done:
    """A completed nonblocking request."""

    def Test(self) -> bool:
        return True


@pytest.mark.parametrize("mode", ["sync", "async", "sync+tiers", "async+tiers"])
def test_write_and_read_phases_on_one_rank(tmp_path: Path, mode: str) -> None:
    from mlckpt import engine
    from mlckpt.run.collective import OpTimer
    from mlckpt.run.phases.reads import ReadPhase
    from mlckpt.run.phases.writes import WritePhase, WriteState
    from mlckpt.run.runner import offsets
    from mlckpt.workload.pipeline import DURABLE, FAST, Pipeline

    ovs = [
        "workload=llama3_8b",
        "division=open",
        "scale=0.0002",
        "ranks=1",
        "checkpoint.num_writes=2",
        "checkpoint.num_reads=2",
        "io.direct=false",
        "io.threads=2",
        f"checkpoint.mode={mode.split('+')[0]}",
    ]
    if mode.endswith("tiers"):
        ovs.append(f"checkpoint.tiers.fast={tmp_path / 'fast'}")
    s = setup(ovs)
    pipe = Pipeline.of(s.config)
    job = Job(OneRank(), Console())
    key, run_id = bytes(range(16)), 0x1234
    root, fast = tmp_path / "durable" / "run", (tmp_path / "fast" / "run" if pipe.tiered else None)
    created = Created(keep=True)
    for base in (root, fast):
        if base is not None:
            base.mkdir(parents=True)
            created.add_dir(base, root=True)
    mine = s.plan.rank_plans[0].files
    own = offsets([f.bytes for f in mine])
    arena = engine.alloc(own[-1])
    opts = engine.IOOptions(direct=False, threads=2, block_size=1 << 20)
    timer = OpTimer(job, 60.0, None, lambda *a: pytest.fail("no op may stall"))
    durable, fast_tier = Files(root), (Files(fast) if fast is not None else None)
    w = WriteState(durable, fast_tier, mine, own, arena, key, opts, False, True)
    writes = WritePhase(job, pipe, w, run_id, timer, created, False).run(2)
    assert [(r["op"], r["index"], r["mode"]) for r in writes] == [
        ("write", 1, pipe.mode),
        ("write", 2, pipe.mode),
    ]
    for r in writes:  # the durable stage ends each checkpoint; every stage took time
        assert r["stages"][-1]["tier"] == DURABLE and r["t1_ns"] == r["stages"][-1]["t1_ns"]
        assert all(st["t1_ns"] > st["t0_ns"] for st in r["stages"]) and r["fsync"]
    on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.pt"))
    assert on_disk == sorted(f"ckpt-000{k}/{f.name}" for k in (1, 2) for f in mine)
    reads = s.plan.restore_reads(0, "own", 0)
    rd = offsets([r.file.bytes for r in reads])
    records = ReadPhase(
        job,
        pipe,
        run_id,
        key,
        durable,
        fast_tier,
        reads,
        rd,
        arena,
        opts,
        False,
        timer,
        False,
        {},
        frozenset({job.host}),
        {},
    ).run(2, 2)
    assert [(r["index"], r["checkpoint"], r["mismatches"]) for r in records] == [(1, 1, 0), (2, 2, 0)]
    assert all(r["verified_bytes"] == r["bytes"] == sum(x.file.bytes for x in reads) for r in records)
    # the newest checkpoint is restored from the fast tier when one keeps it (fast_keep=1)
    assert [r["tier"] for r in records] == ([DURABLE, FAST] if pipe.tiered else [DURABLE, DURABLE])
    lines = job.console.log_lines
    assert any("write 1/2: " in ln or "checkpoint 1/2: training stalled" in ln for ln in lines)
    assert any("read 2/2: " in ln and "verified" in ln for ln in lines)


def test_console_lines() -> None:
    from mlckpt.run.console import durable_line, headline, stall_line

    recs = [
        {
            "t0_ns": 0,
            "staged_ns": 250_000_000,
            "t1_ns": 2_000_000_000,
            "backpressure_ns": 50_000_000,
            "bytes": 1 << 30,
            "stages": [{"tier": "durable", "t0_ns": 500_000_000, "t1_ns": 1_500_000_000}],
        }
    ]
    assert stall_line(recs, 2, 3, "memory") == (
        "checkpoint 2/3: training stalled 0.250 s (memory; 0.050 s of it waiting for checkpoint 1)"
    )
    assert durable_line(recs, 2, 3) == (
        "checkpoint 2/3: durable 2.00 s after it was taken; durable-tier "
        "write 1.00 GiB in 1.00 s = 1.00 GiB/s"
    )
    s = {
        "write_bandwidth_mean_gib_s": 2.0,
        "write_duration_mean_s": 0.5,
        "write_overlap_efficiency": None,
        "read_bandwidth_mean_gib_s": 3.0,
        "read_duration_mean_s": 0.25,
        "read_valid": False,
    }
    assert headline(s) == (
        "result: write 2.00 GiB/s mean (0.50 s per checkpoint); read 3.00 GiB/s mean (0.25 s) INVALID"
    )


def test_one_blas_thread_per_process_unless_the_user_says_otherwise() -> None:
    """numpy's OpenBLAS would start (and spin) a thread per core in every rank; the command line
    asks for one before numpy loads, keeps what the user set, and mpiexec's children inherit it."""
    import subprocess
    import sys

    from mlckpt.cli._threads import one_blas_thread

    env = {"OMP_NUM_THREADS": "8"}
    one_blas_thread(env)
    assert env == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "1"}
    clean = {k: v for k, v in __import__("os").environ.items()
             if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    grandchild = "import os; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])"
    child = subprocess.run(
        [sys.executable, "-c", "import mlckpt.cli, subprocess, sys; "
         f"print(subprocess.run([sys.executable, '-c', {grandchild!r}], capture_output=True, "
         "text=True).stdout.strip())"],
        env={**clean, "MKL_NUM_THREADS": "4"}, capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "1 4"  # set for the ranks; the user's own value kept


def test_op_timer_keeps_the_garbage_collector_out_of_the_timed_region() -> None:
    """A full collection stops every thread of a rank (~70 ms with a run's objects, which put one
    inside most ranks' first object restore).  The timer freezes the set-up's objects once,
    collects before each op (before a witness hears it start, so a witnessed interval does not
    carry it), keeps automatic collection off inside the op, then gives it back; the caller's own
    setting survives."""
    import gc
    import weakref

    from mlckpt import engine
    from mlckpt.run.collective import OpTimer

    class Cycle:
        me: Any = None

    job = Job(OneRank(), Console())
    timer = OpTimer(job, 60.0, None, lambda *a: pytest.fail("no op may stall"))
    opts = engine.IOOptions(direct=False, threads=1, block_size=1 << 20)
    seen: list[tuple[bool, bool | None]] = []
    made: list[weakref.ref[Cycle]] = []

    def action() -> None:
        seen.append((gc.isenabled(), made[-1]() is None if made else None))
        c = Cycle()
        c.me = c  # garbage that only a collection frees
        made.append(weakref.ref(c))

    def broken() -> None:
        seen.append((gc.isenabled(), None))
        raise OSError(5, "Input/output error")

    told: list[tuple[bool, bool]] = []

    class Witness:  # the first collection comes before the witness hears the op start
        def start(self, op: str, index: int) -> None:
            told.append((timer.frozen, gc.isenabled()))

        def end(self, op: str, index: int) -> None:
            pass

        def host_ns(self, t0_ns: int, t1_ns: int) -> list[int] | None:
            return None

    timer.witness = Witness()
    assert gc.isenabled()
    try:
        timer("write", 1, 1, action, 0, 0, opts)
        assert gc.isenabled() and gc.get_freeze_count() > 0 and timer.frozen
        assert told == [(True, True)]  # frozen already; collection off only from the barrier
        timer.witness = None
        timer("write", 2, 2, action, 0, 0, opts)
        # Inside op 1 collection was off; op 2 began after a collection that freed op 1's cycle.
        assert seen == [(False, None), (False, True)]
        with pytest.raises(CollectiveFailure):
            timer("read", 1, 1, broken, 0, 0, opts)
        assert seen[-1] == (False, None) and gc.isenabled()  # given back after a failed op too
        gc.disable()  # a caller that runs without the collector keeps it off
        timer("read", 2, 1, action, 0, 0, opts)
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_second_gpu_probe_keeps_the_higher_rate_of_each_direction() -> None:
    """A host busy during the first probe must not make later honest copies look impossible."""
    from types import SimpleNamespace

    from mlckpt.run.phases.gpustate import probed_again

    class Dev:
        def probe(self, arena: object) -> dict[str, float]:
            return {"d2h_gib_s": 3.8, "h2d_gib_s": 0.9}

    barriers: list[int] = []
    job = SimpleNamespace(rank=1, idle_barrier=lambda: barriers.append(1))
    gates = SimpleNamespace(hosts=[SimpleNamespace(ranks=(0, 1)), SimpleNamespace(ranks=(2, 3, 4))])
    entry = {"rank": 1, "device": "cuda:1", "d2h_gib_s": 1.19, "h2d_gib_s": 1.5}
    assert probed_again(job, gates, Dev(), None, entry) == {"rank": 1, "device": "cuda:1", "d2h_gib_s": 3.8,
                                                            "h2d_gib_s": 1.5}
    assert len(barriers) == 3  # one turn per local rank of the largest host, for every rank


def test_a_resume_stall_names_the_rank_s_own_old_files_worked_out_when_named() -> None:
    """A resume run's stall line names the stalled rank's old files (the engine's and DCP's), worked
    out for that rank alone when the line is written, never every rank's plan at start-up."""
    from mlckpt import engine
    from mlckpt.plan.config import compose
    from mlckpt.run.phases import resumes
    from mlckpt.run.phases.resuming import _OldFiles
    from mlckpt.workload.resume_run import ResumeRun

    run = ResumeRun.of(compose(["ranks=4", "resume.from_ranks=8", "scale=0.01", "division=open",
                                "framework.writer=torch_dcp"]))
    assert run is not None
    setup = resumes.ResumeSetup(run.written, run.workload, run.ranks, run.tp, run.pp, Files(Path("/x/ck")),
                                b"k" * 16, 1, engine.IOOptions(direct=True, threads=1, block_size=1 << 20,
                                                               fsync=True))
    files = _OldFiles(run, setup)
    assert "plan" not in vars(run)  # nothing worked out yet
    assert len(files) == 4 and files[1] == [
        "/x/ck/__2_0.distcp", "/x/ck/__3_0.distcp",
        "/x/ck/zero_pp_rank_2_mp_rank_0_model_states.pt", "/x/ck/zero_pp_rank_2_mp_rank_0_optim_states.pt",
        "/x/ck/zero_pp_rank_3_mp_rank_0_model_states.pt", "/x/ck/zero_pp_rank_3_mp_rank_0_optim_states.pt"]
    assert "plan" not in vars(run)  # one rank's, not the run's
    assert [len(f) for f in files[2:]] == [6, 6]
