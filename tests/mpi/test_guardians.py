"""The guardians' pure parts on several hosts, without processes: the links' heartbeat clock and
framing, and each guardian's decisions (who failed first, who prints the one line, who sweeps
what).  The processes themselves are exercised on simulated hosts in tests/mpi/test_multihost.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlckpt.run.guardian.link import CONTACT_S, HEARTBEAT_S, MAX_LINE, Contact, encode, lines
from mlckpt.run.guardian.state import GuardianState, ranks_text
from mlckpt.run.storage.cleanup import RUN_MARKER

RANKS = [[r, 100 + r, f"h{r // 4 + 1}", 3] for r in range(12)]  # 3 hosts of 4 ranks


def state(host: str, hub: bool, tmp_path: Path, **info: object) -> GuardianState:
    leader = (int(host[1:]) - 1) * 4
    st_ = GuardianState(hub=hub, leader_pid=100 + leader)
    watch = st_.handle({"ranks": RANKS, "host": host})
    assert [w[0] for w in watch] == [r for r in range(leader, leader + 4) if r != leader]
    names = [[f"r{r}a.pt", f"r{r}b.pt"] for r in range(12)]
    st_.handle({"run": str(tmp_path / "run"), "keep": False, "dirs": [], "names": names,
                "partial": str(tmp_path / ".run.partial"), **info})
    st_.handle({"step": "write 2", "ckpt": 2})
    return st_


# --------------------------------------------------------------------------------------------
# links


def test_contact_heartbeats_and_loss() -> None:
    c = Contact()
    c.add("h2", 100.0)
    assert c.due(100.0) == [] and c.lost(100.0) == []
    assert c.due(100.0 + HEARTBEAT_S) == ["h2"]
    assert c.wait_s(100.0) == pytest.approx(HEARTBEAT_S)
    c.sent["h2"] = 100.0 + HEARTBEAT_S
    assert c.lost(100.0 + CONTACT_S - 0.01) == []
    assert c.lost(100.0 + CONTACT_S) == ["h2"]  # nothing *heard* for CONTACT_S, whatever was sent
    c.drop("h2")
    assert c.lost(1e9) == [] and c.wait_s(0.0) == 3600.0


@given(st.lists(st.dictionaries(st.sampled_from(["hb", "dead", "host", "line"]),
                                st.one_of(st.integers(), st.text(max_size=20)), max_size=4), max_size=6),
       st.integers(min_value=1, max_value=7))
def test_lines_reassemble_messages_cut_anywhere(msgs: list[dict[str, object]], chunk: int) -> None:
    data = b"".join(encode(m) for m in msgs)
    buf, got = bytearray(), []
    for i in range(0, len(data), chunk):
        got.extend(lines(buf, data[i:i + chunk]))
    assert got == msgs and buf == bytearray()


def test_a_line_longer_than_any_message_is_refused() -> None:
    with pytest.raises(ValueError):
        list(lines(bytearray(), b"x" * (MAX_LINE + 1)))


# --------------------------------------------------------------------------------------------
# who failed first, who prints


def test_the_first_report_at_the_hub_wins_and_the_spoke_prints(tmp_path: Path) -> None:
    hub, h2, h3 = (state("h1", True, tmp_path), state("h2", False, tmp_path), state("h3", False, tmp_path))
    assert h2.ended([5])  # rank 5 dies on h2: its guardian reports it
    report = h2.report_msg()
    assert report["host"] == "h2" and report["dead"] == [5]
    assert report["line"].startswith("rank 5 on h2 (pid 105) died during write 2, writing ")
    assert h2.waiting_for_verdict
    assert hub.arbitrate(report)  # the first report: the hub tells every spoke
    assert not hub.arbitrate({"dead": [9], "host": "h3", "line": "rank 9 ..."})  # later: ignored
    h2.verdict(report)
    h3.verdict(report)
    assert h2.confirmed and h2.printer and not h2.waiting_for_verdict
    assert not h3.printer and h3.quiet and not h3.ended([8])  # mpiexec's kills are no news
    hub.ended([0])  # rank 0 killed by mpiexec afterwards
    assert hub.first == [] and not hub.printer


def test_a_death_on_rank_0s_host_first(tmp_path: Path) -> None:
    hub, h2 = state("h1", True, tmp_path), state("h2", False, tmp_path)
    assert hub.ended([2])
    assert hub.printer
    assert not hub.arbitrate({"dead": [5], "host": "h2", "line": "rank 5 ..."})
    h2.ended([5])
    h2.verdict(hub.report_msg())
    assert h2.elsewhere.startswith("rank 2 on h1") and not h2.printer


def test_losing_contact(tmp_path: Path) -> None:
    hub = state("h1", True, tmp_path)
    hub.lost.append("h2")
    assert hub.printer
    assert hub.what() == ("lost contact with h2 (ranks 4-7) during write 2 (nothing heard for 5 s: a network "
                          "partition, or that host is down)")
    assert not hub.ended([0])  # the hub ended rank 0 itself: not a death to report
    # rank 0's host goes down: the first host after it speaks (once), the others stop quietly
    h2, h3 = state("h2", False, tmp_path), state("h3", False, tmp_path)
    for spoke in (h2, h3):
        spoke.lost.append("hub")
    assert h2.deputy and h2.printer and not h3.deputy and not h3.printer
    h2.stopped = "ranks 4-7 and their MPI proxy (hydra_pmi_proxy)"
    assert h2.headline() == (
        "mlckpt: error: ranks 4-7 on h2 lost contact with rank 0's host h1 during write 2 (nothing heard for "
        "5 s: a network partition, or that host is down; every host's guardian stops its own ranks); "
        "stopped ranks 4-7 and their MPI proxy (hydra_pmi_proxy)")


def test_rank_0s_own_end_silences_everyone(tmp_path: Path) -> None:
    h2 = state("h2", False, tmp_path)
    h2.job_end = "reported"  # rank 0 named a stalled rank and aborted the job itself
    assert not h2.ended([4]) and not h2.printer and not h2.waiting_for_verdict


# --------------------------------------------------------------------------------------------
# who sweeps what


def planned(root: Path, names: list[str]) -> None:
    (root / "ckpt-0001").mkdir(parents=True)
    (root / RUN_MARKER).touch()
    for n in names:
        (root / "ckpt-0001" / n).write_bytes(b"x")


def test_only_the_printer_sweeps_a_shared_folder(tmp_path: Path) -> None:
    planned(tmp_path / "run", ["r0a.pt", "r5a.pt"])
    quiet = state("h1", True, tmp_path, shared=True)
    quiet.elsewhere = "rank 5 on h2 ..."
    assert quiet.sweep_parts() == (False, True)  # (a fast tier is node-local unless told otherwise)
    assert quiet.swept() == ""
    assert (tmp_path / "run" / "ckpt-0001" / "r0a.pt").exists()
    assert not (tmp_path / ".run.partial").exists()
    printer = state("h2", False, tmp_path, shared=True)
    printer.ended([5])
    printer.confirmed = True
    assert printer.swept() == "; removed 2 checkpoint files of this run"
    assert not (tmp_path / "run").exists()


def test_a_node_local_folder_is_swept_by_its_own_host(tmp_path: Path) -> None:
    planned(tmp_path / "run", ["r4a.pt", "r4b.pt", "r6a.pt"])
    h2 = state("h2", False, tmp_path, shared=False)
    h2.job_end = "reported"
    assert h2.sweep_parts() == (True, True)
    assert h2.swept() == "; removed 3 checkpoint files of this run"


@pytest.mark.parametrize("ranks,text", [([4], "4"), ([4, 5, 6, 7], "4-7"), ([4, 6], "4, 6"), ([], "")])
def test_ranks_text(ranks: list[int], text: str) -> None:
    assert ranks_text(ranks) == text


# --------------------------------------------------------------------------------------------
# linking before any I/O (the runner's side, with a fake communicator and guardian)


class FakeComm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.sent = [[["h1", 41234]], "secret"]  # what rank 0 broadcasts: the hub's address, the token

    def bcast(self, value: object) -> object:
        sent = self.sent.pop(0)
        return value if self.rank == 0 else sent

    def allgather(self, value: object) -> list[object]:
        return [True] * self.size


class FakeGuardian:
    port = 41234

    def __init__(self, answer: dict[str, object] | None) -> None:
        self.answer, self.asked = answer, []  # type: ignore[var-annotated]

    def addresses(self) -> list[tuple[str, int]]:
        return [("h1", self.port)]

    def ask(self, timeout_s: float, **msg: object) -> dict[str, object] | None:
        self.asked.append(msg)
        return self.answer


def fake_job(rank: int, guardian: FakeGuardian) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(rank=rank, host=f"h{rank // 4 + 1}", comm=FakeComm(rank, 12), guardian=guardian)


def test_rank_0_refuses_a_host_whose_guardian_never_linked() -> None:
    from mlckpt.errors import ConfigError
    from mlckpt.run.phases.guardians import link_guardians

    names = [f"h{r // 4 + 1}" for r in range(12)]
    hub = FakeGuardian({"linked": ["h3"]})
    with pytest.raises(ConfigError) as exc:
        link_guardians(fake_job(0, hub), names)  # type: ignore[arg-type]
    assert [m["expect"] for m in hub.asked] == [["h2", "h3"]]
    assert len(str(hub.asked[0]["token"])) == 32  # a fresh secret from rank 0
    assert str(exc.value) == ("guardians: the guardian of h2 could not reach rank 0's host h1 over TCP "
                              "within 10 s (it listens on port 41234: TCP between the hosts must be open, "
                              "as MPI needs)")
    assert exc.value.exit_status == 2
    link_guardians(fake_job(0, FakeGuardian({"linked": ["h2", "h3"]})), names)  # type: ignore[arg-type]


def test_a_spoke_that_cannot_reach_the_hub_says_why() -> None:
    from mlckpt.errors import ConfigError
    from mlckpt.run.phases.guardians import link_guardians

    names = [f"h{r // 4 + 1}" for r in range(12)]
    spoke = FakeGuardian({"linked": False, "why": "h1:41234: Connection refused"})
    with pytest.raises(ConfigError, match=r"^guardians: h2 cannot reach rank 0's guardian on h1 "
                                          r"\(h1:41234: Connection refused\)$"):
        link_guardians(fake_job(4, spoke), names)  # type: ignore[arg-type]
    assert spoke.asked == [{"hub": [["h1", 41234]], "token": "secret"}]


def test_a_lost_host_is_the_first_failure_for_every_other_spoke(tmp_path: Path) -> None:
    """The hub tells the spokes it lost h2 (and ends the job): h3's ranks, then killed by mpiexec,
    are no news and h3 does not wait for a verdict."""
    hub, h3 = state("h1", True, tmp_path), state("h3", False, tmp_path)
    hub.lost.append("h2")
    h3.verdict({"host": "h2", "line": hub.what()})
    assert h3.elsewhere.startswith("lost contact with h2") and not h3.ended([8])
    assert not h3.waiting_for_verdict and not h3.printer


def test_the_hub_takes_hellos_from_the_jobs_own_hosts_only(tmp_path: Path) -> None:
    hub = state("h1", True, tmp_path)
    assert hub.hello_from({"hello": "h2", "token": "s3cret"}, "s3cret", set()) == "h2"
    assert hub.hello_from({"hello": "h2", "token": "guess"}, "s3cret", set()) is None  # not this job's
    assert hub.hello_from({"hello": "h2"}, "s3cret", set()) is None
    assert hub.hello_from({"hello": "h9", "token": "s3cret"}, "s3cret", set()) is None  # no such host
    assert hub.hello_from({"hello": "h1", "token": "s3cret"}, "s3cret", set()) is None  # the hub's own
    assert hub.hello_from({"hello": "h2", "token": "s3cret"}, "s3cret", {"h2"}) is None  # linked already
    assert hub.hello_from({"hello": "h2", "token": ""}, "", set()) is None  # no secret yet: nobody


@pytest.mark.parametrize("env,local", [
    ({"MPI_LOCALRANKID": "0"}, 0),  # MPICH's hydra
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3),  # Open MPI
    ({"SLURM_LOCALID": "1"}, 1),  # srun
    ({}, None),  # unknown: only rank 0 gets a guardian
])
def test_each_launchers_local_rank(env: dict[str, str], local: int | None,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from mlckpt.run.guardian.processes import local_rank

    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "PMI_LOCAL_RANK",
                "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert local_rank() == local
