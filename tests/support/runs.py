"""Runs of the installed ``mlckpt`` as the MPI tests make them (under mpiexec, a private config
home, their processes tagged), and what the tests read back: the bundle a run printed, its files,
its error line, a folder's state before and after."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.cli import cli_env, mlckpt_command

BIN = Path(sys.executable).parent
MLCKPT = BIN / "mlckpt"
MPIEXEC = BIN / "mpiexec"
TIMEOUT_S = 120
COLD_BOUND = 0.01  # rules 1.0 cold_read.max_resident_fraction


@pytest.fixture(scope="module", autouse=True)
def private_config_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs sign their bundle with the user's auto-created key (signing.key=auto, under
    $XDG_CONFIG_HOME/mlckpt): give these runs their own config home, never the real one."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config-home")))
    yield
    mp.undo()


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLCKPT_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALNRANKS"))
           or k == "MLCKPT_RETRY_DISTURBED"}  # the suite's, see conftest
    env.update(extra or {})
    return env


def run_mlckpt(args: list[str], cwd: Path, *, timeout: float = TIMEOUT_S, mpiexec_n: int | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mlckpt ARGS`` in ``cwd`` (under ``mpiexec -n N`` when given).  On timeout the whole
    process group (mpiexec, its proxies and ranks) is killed and the test fails."""
    assert MLCKPT.is_file() and MPIEXEC.is_file(), "mlckpt and the mpich wheel must be installed"
    cmd = [*mlckpt_command(env), *args]
    if mpiexec_n is not None:
        cmd = [str(MPIEXEC), "-n", str(mpiexec_n), *cmd]
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(env), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def assert_ran(proc: subprocess.CompletedProcess[str]) -> None:
    """A run that finished as a result (exit 0), or that a busy disk disturbed on every try and
    said so (exit 6): never invalid, never an error."""
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith(("finding:", "note:", "warning:"))]
    assert proc.returncode in (0, 6), (proc.stderr, found)  # the findings say which rule, and why
    if proc.returncode == 6:
        assert "verdict disturbed" in proc.stdout, proc.stdout[-2000:]


def printed_bundle(out: str | subprocess.CompletedProcess[str]) -> Path:
    """The bundle a run printed last (``bundle: PATH``; a run retried as disturbed prints one per
    try, the last is the result's)."""
    text = out if isinstance(out, str) else out.stdout
    lines = [ln for ln in text.splitlines() if ln.startswith("bundle: ")]
    assert lines, text[-3000:]
    return Path(lines[-1].removeprefix("bundle: ").strip())


def bundle_of(cp: subprocess.CompletedProcess[str]) -> Path:
    """The bundle of a run that succeeded and ended by naming it."""
    assert cp.returncode == 0, f"exit {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    assert cp.stdout.strip().splitlines()[-1].startswith("bundle: "), cp.stdout
    path = printed_bundle(cp)
    assert path.is_dir()
    return path


@dataclass
class Result:
    folder: Path
    run: dict[str, Any]
    summary: dict[str, Any]
    records: list[dict[str, Any]]

    @classmethod
    def load(cls, folder: Path) -> Result:
        assert {"config.yaml", "records.jsonl", "run.json", "run.log", "summary.json",
                "system.json"} <= {p.name for p in folder.iterdir()}
        records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
        return cls(folder, json.loads((folder / "run.json").read_text()),
                   json.loads((folder / "summary.json").read_text()), records)

    def ops(self) -> dict[tuple[str, int], list[dict[str, Any]]]:
        by: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for r in self.records:
            by[(r["op"], r["index"])].append(r)
        return dict(by)


def error_line(cp: subprocess.CompletedProcess[str]) -> str:
    """The error line a refused run prints on stderr (a refusal for several rules lists each
    other one on a line of its own, ``  also: [RULE] …``)."""
    assert "Traceback" not in cp.stderr, cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("mlckpt: error: "), lines[0]
    assert all(ln.startswith("  also: [") for ln in lines[1:]), cp.stderr
    return lines[0]


def assert_same_numbers(mine: Any, theirs: Any, where: str = "summary") -> None:
    """Every field of ``mine`` is in ``theirs`` with an equal value (floats: rel 1e-12)."""
    if isinstance(mine, dict):
        assert isinstance(theirs, dict), where
        for k, v in mine.items():
            assert k in theirs, f"{where}.{k} missing"
            assert_same_numbers(v, theirs[k], f"{where}.{k}")
    elif isinstance(mine, list):
        assert isinstance(theirs, list) and len(mine) == len(theirs), where
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert_same_numbers(a, b, f"{where}[{i}]")
    elif isinstance(mine, bool) or mine is None or isinstance(mine, str):
        assert mine == theirs, f"{where}: {mine!r} != {theirs!r}"
    elif isinstance(mine, (int, float)):
        assert not isinstance(theirs, bool), where
        assert math.isclose(mine, theirs, rel_tol=1e-12, abs_tol=0.0), f"{where}: {mine!r} != {theirs!r}"
    else:
        raise AssertionError(f"{where}: unexpected {type(mine)}")


def snapshot(folder: Path, content_limit: int | None = 1 << 16) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry under ``folder``: (mode, size, mtime_ns, content of files up to
    ``content_limit`` bytes; of every file with None)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        read = p.is_file() and (content_limit is None or st.st_size <= content_limit)
        out[str(p.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                           p.read_bytes() if read else b"")
    return out


def signed_run(h: Mapping[str, Path], cwd: Path, *overrides: str, timeout: float = 400
               ) -> subprocess.CompletedProcess[str]:
    """``mlckpt run OVERRIDES`` in ``cwd``, signed with the honest bundles' organisation key and
    described by their system description (``h``: the ``honest_bundles`` fixture)."""
    env = {**cli_env(), "XDG_CONFIG_HOME": str(h["dir"] / "xdg")}
    return subprocess.run(
        [str(MLCKPT), "run", f"system={h['dir'] / 'laptop-ext4.yaml'}",
         f"signing.key={h['dir'] / 'keys' / 'org.pem'}", *overrides],
        cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, check=False)


def judged_alone(h: Mapping[str, Path], root: Path) -> dict[str, Any]:
    """The checker's report on the one bundle of the tree ``root``."""
    from checker.tree_check import check_tree
    from mlckpt import bundle

    [b] = check_tree(root, bundle.TrustedKeys.load(h["dir"] / "trusted-keys.yaml"), jobs=1)["bundles"]
    return dict(b)


def hard_rules(b: Mapping[str, Any]) -> set[str]:
    """The rules that make a bundle invalid or open, but RUNNER-RELEASED (no tree lists the tests'
    runner as released)."""
    return {f["rule"] for f in b["findings"] if f["severity"] in ("invalid", "open")} - {"RUNNER-RELEASED"}
