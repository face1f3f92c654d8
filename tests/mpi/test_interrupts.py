"""Ctrl-C, as a person at a terminal presses it (tmux), and the checkpoint folder's lock: the prompt
returns only after the run's files are gone (bounded), nothing is left in /dev/shm, no empty
results folder, the last line on a line of its own; a second run on a folder in use is refused
before any I/O, naming the run that holds it."""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mlckpt.cli.interrupt import BOUND_S
from mlckpt.errors import UsageError
from mlckpt.run.phases.gates import folder_problem
from mlckpt.run.storage import folderlock
from mlckpt.run.storage.cleanup import remove_shm, shm_mapped_by

BIN = Path(sys.executable).parent
SHM = Path("/dev/shm")
# The laptop preset with a fourth write: long enough to be interrupted at a chosen step.
RUN = ("checkpoint.folder=ck", "output.root=results", "checkpoint.num_writes=4", "checkpoint.num_reads=3")


def files_under(folder: Path) -> list[str]:
    return [os.path.join(b, n) for b, _d, ns in os.walk(folder) for n in ns] if folder.exists() else []


def leaked_segments(since: float) -> list[str]:
    """MPI segments in /dev/shm newer than ``since`` that no process maps (what a killed run leaks)."""
    used = shm_mapped_by([int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()])
    return sorted(str(p) for pattern in ("mpich_shm_*", "vader_segment.*", "sm_segment.*")
                  for p in SHM.glob(pattern)
                  if p.lstat().st_ctime >= since and str(p) not in used)


@contextmanager
def terminal(tmp_path: Path, command: str) -> Iterator[tuple[object, object]]:
    """``command`` in a tmux pane; yields (pane text reader, key sender)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    session, sock = f"mlckpt-int-{os.getpid()}", str(tmp_path / "tmux.sock")
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", session, "-x", "160", "-y", "50",
                    f"{command}; echo EXIT=$?; sleep 120"], check=True, timeout=30)

    def pane() -> str:
        return subprocess.run(["tmux", "-S", sock, "capture-pane", "-p", "-J", "-S", "-200", "-t", session],
                              text=True, capture_output=True, check=False, timeout=30).stdout

    def keys(*k: str) -> None:
        subprocess.run(["tmux", "-S", sock, "send-keys", "-t", session, *k], check=True, timeout=30)

    try:
        yield pane, keys
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], check=False, timeout=30)


def wait_for(what: object, timeout_s: float, every_s: float = 0.05) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s")


def run_command(tmp_path: Path, *extra: str) -> str:
    return (f"cd {tmp_path} && XDG_CONFIG_HOME={tmp_path}/xdg MLCKPT_DEBUG= {BIN / 'mlckpt'} run "
            f"{' '.join((*RUN, *extra))}")


def during_write_2(tmp_path: Path, _pane: object) -> bool:
    return bool(list((tmp_path / "ck").glob("*/ckpt-0002")))


def during_read_1(_tmp_path: Path, pane: object) -> bool:
    return any(re.match(r"\s*read 1\b", ln) for ln in pane().splitlines())  # type: ignore[operator]


@pytest.mark.parametrize(("when", "presses"), [(during_write_2, 1), (during_read_1, 1), (during_write_2, 2)],
                         ids=["write-2", "read-1", "write-2-twice"])
def test_ctrl_c_returns_the_prompt_only_after_the_files_are_gone(tmp_path: Path, when: object,
                                                                   presses: int) -> None:
    since = time.time() - 1
    with terminal(tmp_path, run_command(tmp_path)) as (pane, keys):
        wait_for(lambda: when(tmp_path, pane), 240)  # type: ignore[operator]
        held = folderlock.read_holder(tmp_path / "ck")
        assert held is not None and held.launch  # the run holds its folder, from this launch
        pressed = time.monotonic()
        keys("C-c")
        for _ in range(presses - 1):
            # Again while the cleanup is under way (it takes a few tenths), once this process has
            # taken the first press and said so: two SIGINTs that reach it before Python runs its
            # handler are handled as one (on a busy host, 50 ms apart was not enough).
            wait_for(lambda: "interrupted; ending the ranks" in pane(), 30, every_s=0.02)  # type: ignore[operator]
            keys("C-c")
        back = wait_for(lambda: "EXIT=" in pane(), BOUND_S + 30)  # type: ignore[operator]
        # The moment the prompt is back: nothing of the run is left.
        left = files_under(tmp_path / "ck")
        screen = pane()  # type: ignore[operator]
    assert "EXIT=130" in screen, screen
    assert back - pressed <= BOUND_S + 2, (back - pressed, screen)
    assert left == [], left
    assert not folderlock.lock_path(tmp_path / "ck").exists()
    assert not (tmp_path / "results").exists()  # created by this run, left empty: removed
    assert leaked_segments(since) == []
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    last = lines[lines.index(next(ln for ln in lines if ln.startswith("EXIT="))) - 1]
    assert re.fullmatch(r"mlckpt: interrupted; the run ended and its \d+ files were removed \(\d+\.\d s\)",
                        last), screen
    assert any(ln.startswith("mlckpt: interrupted; ending the ranks and removing the run's") for ln in lines)
    # The guardian's account names the op. It says "interrupted … stopped" when it could read how
    # the first rank ended (killed by SIGINT); a rank already reaped by its MPI proxy before its
    # guardian read it (seen beside a busy tenant) is only known to have died. A second Ctrl-C
    # makes mpiexec force its proxy down, and with it the guardian's line. The last line, this
    # command's own, is the account that always holds (checked above).
    account = re.compile(r"mlckpt: (interrupted: ranks? [\d, ]+ on \S+ .*(was|were) stopped|error: ranks? "
                         r"[\d, ]+ on \S+ .*died) (at the same moment )?during "
                         r"(write 2|prepare checkpoint 2|read 1|evict before restore 1)")
    assert presses > 1 or any(account.match(ln) for ln in lines), screen
    if presses > 1:
        assert any(ln.startswith("mlckpt: still removing the run's files") for ln in lines), screen


CRASH_LIKE = re.compile(r"internal error|Traceback|BAD TERMINATION|Segmentation fault|YOUR APPLICATION "
                        r"TERMINATED|\[mpiexec@|=====")


@pytest.mark.parametrize("after_s", [0.0, 0.5, 1.0, 2.0], ids=["at-once", "0.5s", "1s", "2s"])
def test_ctrl_c_while_the_ranks_start_prints_nothing_that_looks_like_a_crash(tmp_path: Path,
                                                                           after_s: float) -> None:
    """In the first seconds the ranks are still importing: each used to print 'mlckpt: interrupted'
    or an internal error, and MPICH its termination banner."""
    with terminal(tmp_path, run_command(tmp_path)) as (pane, keys):
        wait_for(lambda: "mlckpt run: preset" in pane(), 60)  # type: ignore[operator]
        time.sleep(after_s)
        keys("C-c")
        wait_for(lambda: "EXIT=" in pane(), BOUND_S + 30)  # type: ignore[operator]
        screen = pane()  # type: ignore[operator]
    assert "EXIT=130" in screen, screen
    assert not CRASH_LIKE.search(screen), screen
    said = [ln.removeprefix("^C") for ln in screen.splitlines() if "mlckpt: interrupted" in ln]
    assert 1 <= len(said) <= 3 and len(set(said)) == len(said), screen  # each line once, at most three
    assert not files_under(tmp_path / "ck") and not (tmp_path / "results").exists()


def launchers() -> list[int]:
    """The pids of the `mlckpt run` launchers (the command itself, not its ranks or the shell)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1].endswith(b"/bin/mlckpt") and argv[2] == b"run":
            out.append(int(p.name))
    return out


def test_sigterm_ends_the_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """A scheduler's cancel or `kill` reaches only the launcher: it ends the ranks as a Ctrl-C
    would, waits for their files to go, and says the same three lines."""
    with terminal(tmp_path, run_command(tmp_path)) as (pane, _keys):
        wait_for(lambda: during_write_2(tmp_path, pane), 240)
        [launcher] = [p for p in launchers() if Path(f"/proc/{p}/cwd").resolve() == tmp_path.resolve()]
        os.kill(launcher, 15)
        wait_for(lambda: "EXIT=" in pane(), BOUND_S + 30)  # type: ignore[operator]
        screen = pane()  # type: ignore[operator]
    assert "EXIT=130" in screen, screen
    assert not CRASH_LIKE.search(screen), screen
    assert re.search(r"^mlckpt: interrupted; the run ended and its \d+ files were removed", screen,
                     re.M), screen
    assert files_under(tmp_path / "ck") == []


def first_runs_own(folder: Path) -> set[str]:
    """What is in the folder now, less what the first run makes as it goes on (its gates' probe
    files, its checkpoints): the second run, refused before any I/O, makes none of it either."""
    return {p.name for p in folder.iterdir() if not p.name.startswith(".mlckpt-probe-")}


def test_a_second_run_on_a_folder_in_use_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = subprocess.Popen([str(BIN / "mlckpt"), "run", *RUN], cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    try:
        wait_for(lambda: folderlock.read_holder(tmp_path / "ck") is not None, 240)
        holder = folderlock.read_holder(tmp_path / "ck")
        assert holder is not None and holder.host == socket.gethostname()
        runs_before = first_runs_own(tmp_path / "ck")
        second = subprocess.run([str(BIN / "mlckpt"), "run", "checkpoint.folder=ck", "output.root=second"],
                                cwd=tmp_path, text=True, capture_output=True, check=False, timeout=120,
                                env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
        assert second.returncode == 2, second.stderr
        [line] = second.stderr.strip().splitlines()
        assert line.startswith(f"mlckpt: error: checkpoint.folder: {tmp_path / 'ck'} is in use by run "
                               f"{holder.run} (host {holder.host}")
        assert "wait for it to end" in line and ".mlckpt-lock" in line
        # refused before any I/O: no run folder, no results folder of its own
        assert not (tmp_path / "second").exists()
        checkpoints = {f"ckpt-{k:04d}" for k in range(1, 5)}  # the first run's, as it writes on
        assert first_runs_own(tmp_path / "ck") <= runs_before | checkpoints
    finally:
        _out, err = first.communicate(timeout=600)
    assert first.returncode in (0, 6), err
    assert not folderlock.lock_path(tmp_path / "ck").exists()  # released with the run's files


# ---------------------------------------------------------------------------- the lock, alone


def write_lock(folder: Path, **fields: object) -> None:
    doc = {"run": "20261126T000000Z-llama3_8b-8r-0123456789abcdef", "host": socket.gethostname(),
           "pids": [os.getpid()], "started": "2026-11-26T00:00:00+00:00", "launch": ""}
    doc.update(fields)
    folder.mkdir(parents=True, exist_ok=True)
    folderlock.lock_path(folder).write_text(json.dumps(doc))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_live_lock_refuses_with_the_holder_and_the_remedy(tmp_path: Path) -> None:
    write_lock(tmp_path)
    message = folderlock.refusal(tmp_path)
    assert message is not None and f"pids {os.getpid()}" in message and "remove " in message
    with pytest.raises(UsageError, match="is in use by run 20261126T000000Z"):
        folderlock.acquire(tmp_path, "another-run", [os.getpid()], "now")
    assert folderlock.read_holder(tmp_path).run.startswith("20261126T000000Z")  # untouched


def test_another_hosts_lock_is_never_taken_over(tmp_path: Path) -> None:
    write_lock(tmp_path, host="some-other-host", pids=[dead_pid()])
    with pytest.raises(UsageError, match="host some-other-host"):
        folderlock.acquire(tmp_path, "mine", [os.getpid()], "now")


def test_a_stale_lock_of_this_host_is_taken_over_with_a_note(tmp_path: Path) -> None:
    write_lock(tmp_path, pids=[dead_pid(), dead_pid()])
    note = folderlock.acquire(tmp_path, "mine", [os.getpid()], "now")
    assert note.startswith("took over the lock of run 20261126T000000Z") and "none of its processes" in note
    assert folderlock.read_holder(tmp_path).run == "mine"
    assert not folderlock.release(tmp_path, "not-mine") and folderlock.lock_path(tmp_path).exists()
    assert folderlock.release(tmp_path, "mine") and not folderlock.lock_path(tmp_path).exists()


def test_the_same_run_from_another_host_shares_its_lock(tmp_path: Path) -> None:
    write_lock(tmp_path, run="shared-run", host="host-b")
    assert folderlock.acquire(tmp_path, "shared-run", [os.getpid()], "now") == ""


def test_the_lock_is_never_seen_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another host's leader of the same run reads the lock the moment it exists: while its body
    is being written the lock must not be visible yet (an empty lock refused honest multi-host
    runs as 'a lock file mlckpt cannot read')."""
    seen: list[object] = []
    write = os.write

    def watched(fd: int, data: bytes) -> int:
        seen.append(folderlock.read_holder(tmp_path))
        return write(fd, data)

    monkeypatch.setattr(folderlock.os, "write", watched)
    assert folderlock.acquire(tmp_path, "mine", [os.getpid()], "now") == ""
    assert seen == [None]
    assert folderlock.read_holder(tmp_path).run == "mine"
    assert [p.name for p in tmp_path.iterdir()] == [folderlock.LOCK]  # nothing of the taking left
    with pytest.raises(UsageError, match="is in use by run mine"):
        folderlock.acquire(tmp_path, "another-run", [os.getpid()], "now")
    assert [p.name for p in tmp_path.iterdir()] == [folderlock.LOCK]


def test_the_folder_gate_does_not_count_the_lock_as_a_foreign_file(tmp_path: Path) -> None:
    write_lock(tmp_path / "ck")
    (tmp_path / "ck" / f"{folderlock.LOCK}.host-b.4242").write_text("{}")  # being taken, or kill -9
    assert folder_problem(tmp_path / "ck") is None
    (tmp_path / "ck" / "notes.txt").write_text("x")
    assert "holds files mlckpt did not write (notes.txt)" in str(folder_problem(tmp_path / "ck"))


def test_an_unreadable_lock_refuses_saying_so(tmp_path: Path) -> None:
    folderlock.lock_path(tmp_path).write_text("{half")
    message = folderlock.refusal(tmp_path)
    assert message is not None and "a lock file mlckpt cannot read" in message


# ---------------------------------------------------------------------------- /dev/shm


def test_only_the_segments_a_runs_ranks_mapped_are_removed(tmp_path: Path) -> None:
    """What a guardian records of its ranks (their maps, while they live) is all it removes: a
    segment of another process in the same /dev/shm (another container, another pid namespace)
    stays."""
    ours, theirs = tmp_path / "mpich_shm_ours_0", tmp_path / "mpich_shm_theirs_0"
    for p in (ours, theirs):
        p.write_bytes(b"\0" * 4096)
    with open(ours, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
        m[0] = 1
        seen = shm_mapped_by([os.getpid()], tmp_path)  # a tmp folder stands in for /dev/shm
    assert seen == {str(ours)}
    assert remove_shm(seen) == 1 and not ours.exists() and theirs.exists()
    assert remove_shm(seen) == 0  # already gone: nothing to do, no error
