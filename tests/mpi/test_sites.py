"""At an HPC site: what the site's MPI library reports about itself reaches the bundle in a form the
checker accepts, and the runner never publishes a bundle its own checker would refuse for its form.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import paths
from support.runs import printed_bundle

from mlckpt import strict
from mlckpt.errors import ExitStatus
from mlckpt.host.facts import host_facts
from mlckpt.run.phases.publish import self_check

# What Open MPI 4.1.4's MPI_Get_library_version returns (Debian's build): a NUL ends it.
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00"


def test_printable_drops_nul_and_turns_other_control_characters_into_spaces() -> None:
    assert strict.printable(OPEN_MPI) == OPEN_MPI[:-1]
    got = strict.printable({"a\x1b[31m": ["x\ty", 3, None, ("\x7f",)]})
    assert got == {"a [31m": ["x y", 3, None, [" "]]}
    assert strict.printable("/mnt/two  spaces/é") == "/mnt/two  spaces/é"  # nothing else changes


@given(st.text())
def test_every_printable_string_passes_the_checkers_strict_parse(text: str) -> None:
    clean = strict.printable(text)
    try:
        doc = strict.parse_json(json.dumps({"k": clean}).encode("utf-8", "surrogatepass"))
    except strict.ParseError as exc:  # only an unpaired surrogate (not a control character) is left
        assert "surrogate" in str(exc)
    else:
        assert doc == {"k": clean} and not any(ord(c) < 32 or ord(c) == 127 for c in clean)


def test_the_hosts_facts_carry_the_mpi_library_without_its_nul(tmp_path: Path) -> None:
    facts = host_facts(tmp_path, OPEN_MPI)
    assert facts["mpi_library"] == OPEN_MPI[:-1]
    strict.parse_json(json.dumps(facts).encode())  # what the checker reads back


def test_the_runner_refuses_to_publish_a_bundle_its_checker_would_refuse(
    honest_bundles: dict[str, Path], tmp_path: Path
) -> None:
    src = honest_bundles["llama3_8b"]
    rules = json.loads((src / "run.json").read_text())["rules_version"]
    assert self_check(src, rules) == ""
    bad = tmp_path / "b"
    shutil.copytree(src, bad)
    system = json.loads((bad / "system.json").read_text())
    system["hosts"][0]["mpi_library"] = OPEN_MPI  # as the runner stored it before
    (bad / "system.json").write_text(json.dumps(system))
    assert self_check(bad, rules) == "system.json: string holds a NUL character"
    run = json.loads((src / "run.json").read_text())
    run["verdict"] = "splendid"
    (bad / "system.json").write_bytes((src / "system.json").read_bytes())
    (bad / "run.json").write_text(json.dumps(run))
    assert self_check(bad, rules).startswith("run.json: verdict: 'splendid' is not one of")


# --- which MPI: the library mpi4py loads, the launcher that matches it ----------------------------


def test_the_flavour_of_a_library_and_of_a_launcher_from_what_they_print() -> None:
    from mlckpt.run import site_mpi as m

    assert m.library_flavour(OPEN_MPI) == "openmpi"
    assert m.library_flavour("MPICH Version:      5.0.2") == "mpich"
    assert m.library_flavour("Intel(R) MPI Library 2021.10 for Linux* OS") == "intel"
    assert m.library_flavour("Some other MPI 1.0") is None
    assert m.launcher_flavour("mpiexec.openmpi (OpenRTE) 4.1.4\n\nReport bugs to ...") == "openmpi"
    assert m.launcher_flavour("mpirun (Open MPI) 5.0.3") == "openmpi"
    assert m.launcher_flavour("HYDRA build details:\n    Version: 5.0.2") == "mpich"
    assert m.launcher_args("openmpi", root=True) == ["--oversubscribe", "--allow-run-as-root"]
    assert m.launcher_args("openmpi", root=False) == ["--oversubscribe"]
    assert m.launcher_args("mpich", root=True) == []


def test_what_a_launcher_announced_and_whether_the_world_agrees() -> None:
    from mlckpt.run import site_mpi as m

    assert m.announced({"PMI_SIZE": "4", "PMI_RANK": "2"}) == ("PMI_SIZE", 4, 2)
    ompi = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "0"}
    assert m.announced(ompi) == ("OMPI_COMM_WORLD_SIZE", 8, 0)
    # srun --mpi=pmix announces the rank only: the size is the step's task count
    assert m.announced({"PMIX_RANK": "1", "SLURM_STEP_NUM_TASKS": "4"}) == ("SLURM_STEP_NUM_TASKS", 4, 1)
    assert m.announced({"SLURM_PROCID": "0"}) is None
    line = m.mismatch({"PMI_SIZE": "4", "PMI_RANK": "0"}, 1, "Open MPI v4.1.4")
    assert line.startswith("the launcher started 4 ranks (PMI_SIZE=4) but the MPI library mpi4py loads "
                           "(Open MPI v4.1.4) sees a world of 1")
    assert m.mismatch({"PMI_SIZE": "4"}, 4, "x") == "" and m.mismatch({}, 1, "x") == ""
    assert m.speaks({"PMI_RANK": "0", "PMI_SIZE": "4"}) and not m.speaks({"PMI_RANK": "3", "PMI_SIZE": "4"})
    # srun --mpi=none: tasks without any PMI
    none = {"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4"}
    assert m.slurm_tasks_without_pmi(none) == (4, 2)
    assert m.slurm_tasks_without_pmi({**none, "PMI_FD": "11", "PMI_RANK": "2"}) is None  # --mpi=pmi2
    assert m.slurm_tasks_without_pmi({**none, "PMIX_RANK": "2"}) is None  # --mpi=pmix
    assert m.slurm_tasks_without_pmi({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) is None  # srun -n 1
    assert m.slurm_tasks_without_pmi({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None  # an sbatch script
    refusal = m.slurm_refusal(4)
    assert "Use srun --mpi=pmi2" in refusal and refusal.startswith("srun started 4 tasks")


def test_another_mpis_launcher_is_known_before_mpi_starts() -> None:
    from mlckpt.run import site_mpi as m

    hydra = {"PMI_SIZE": "4", "PMI_RANK": "0", "PMI_FD": "7", "HYDI_CONTROL_FD": "9"}
    mpirun = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}
    assert m.foreign_launcher(hydra, "openmpi") and m.foreign_launcher(mpirun, "mpich")
    assert not m.foreign_launcher(hydra, "mpich") and not m.foreign_launcher(mpirun, "openmpi")
    assert not m.foreign_launcher({**hydra, "PMI_SIZE": "1"}, "openmpi")  # one rank: a world of one is right
    assert not m.foreign_launcher(hydra, None)  # a library of its own build: MPI's own world decides
    # srun --mpi=pmi2 sets neither launcher's variable: Open MPI's ranks join the step
    assert not m.foreign_launcher({"PMI_SIZE": "4", "PMI_RANK": "0", "PMI_FD": "7", "SLURM_PROCID": "0"},
                                  "openmpi")


def test_a_launcher_of_another_mpi_is_refused_naming_both(tmp_path: Path) -> None:
    from mlckpt.errors import UsageError
    from mlckpt.run import site_mpi as m

    hydra = tmp_path / "mpiexec"
    hydra.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    hydra.chmod(0o755)
    with pytest.raises(UsageError) as err:
        m.find_launcher(str(hydra), library=OPEN_MPI[:-1])
    assert str(err.value).startswith(f"--mpiexec {hydra} is MPICH's launcher but mpi4py loads Open MPI")
    mpich = "MPICH Version: 5.0.2"
    assert m.find_launcher(str(hydra), library=mpich) == m.Launcher(str(hydra), "mpich", mpich)
    with pytest.raises(UsageError, match="no MPI library found: install the `mpich` wheel"):
        m.find_launcher(None, library="")


# --- real runs: Debian's Open MPI, and a one-node Slurm -------------------------------------------

MLCKPT = Path(sys.executable).parent / "mlckpt"
CHECK = Path(sys.executable).parent / "mlckpt-check"
TINY = ("division=open", "scale=0.0005", "ranks=4", "checkpoint.num_writes=1", "checkpoint.num_reads=1",
        "io.direct=false")
OPEN_MPI_ENV = {"MPI4PY_LIBMPI": "libmpi.so.40"}  # mpi4py's wheel then loads the system's Open MPI


def open_mpi_missing() -> str | None:
    if shutil.which("mpiexec.openmpi") is None:
        return "Debian's Open MPI is not installed (apt-get install openmpi-bin)"
    code = "from mpi4py import _mpiabi; print(_mpiabi._get_mpiabi())"
    probe = subprocess.run([sys.executable, "-c", code], env={**os.environ, **OPEN_MPI_ENV},
                           capture_output=True, text=True, check=False)
    if probe.stdout.strip() != "openmpi":
        return f"mpi4py cannot load Open MPI's libmpi.so.40 here: {probe.stderr.strip()[-200:]}"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.cli import CHECKER_DESCRIPTION, CHECKER_SYSTEM

    from mlckpt import bundle

    d = tmp_path_factory.mktemp("site")
    bundle.generate_key(d / "keys" / "org.pem")
    (d / f"{CHECKER_SYSTEM}.yaml").write_text(CHECKER_DESCRIPTION)
    return {"dir": d}


def run_args(site: dict[str, Path], name: str, *extra: str) -> list[str]:
    from support.cli import CHECKER_SYSTEM

    d = site["dir"]
    given = {e.split("=", 1)[0] for e in extra}  # a key ``extra`` sets replaces TINY's
    return [*(a for a in TINY if a.split("=", 1)[0] not in given), *extra,
            f"system={d / (CHECKER_SYSTEM + '.yaml')}",
            f"signing.key={d / 'keys' / 'org.pem'}", f"output.root={d / 'results' / name}",
            f"checkpoint.folder={d / ('ck-' + name)}"]


def env_of(site: dict[str, Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_", "OMPI_"))}
    env.pop("MLCKPT_DEBUG", None)
    return {**env, "XDG_CONFIG_HOME": str(site["dir"] / "xdg"), **extra}


def checked(site: dict[str, Path], made: Path, tmp_path: Path) -> dict[str, object]:
    """``mlckpt-check`` on a tree holding the one bundle: its report."""
    from support.cli import CHECKER_DESCRIPTION, CHECKER_ORG, CHECKER_SYSTEM

    root = tmp_path / "tree"
    dest = root / "open" / CHECKER_ORG / "results" / CHECKER_SYSTEM / "llama3_8b" / made.name
    shutil.copytree(made, dest)
    (root / "open" / CHECKER_ORG / "systems").mkdir(parents=True)
    (root / "open" / CHECKER_ORG / "systems" / f"{CHECKER_SYSTEM}.yaml").write_text(CHECKER_DESCRIPTION)
    pub = (site["dir"] / "keys" / "org.pem.pub").read_text().strip()
    (root / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {CHECKER_ORG}: ["{pub}"]\n')
    proc = subprocess.run([str(CHECK), str(root), "--json", str(tmp_path / "r.json")], capture_output=True,
                          text=True, timeout=120, check=False)
    report = json.loads((tmp_path / "r.json").read_text())
    # valid; or, a run the busy disk disturbed, disturbed (exit 6): never invalid
    disturbed = (ExitStatus.DISTURBED, True)
    assert (proc.returncode, report["verdict"] == "disturbed") in ((0, False), disturbed), proc.stdout[-3000:]
    assert report["verdict"] != "invalid", proc.stdout[-3000:]
    return report


@pytest.mark.mpi
def test_under_open_mpi_a_run_picks_open_mpis_launcher_and_its_bundle_passes_the_checker(
        site: dict[str, Path], tmp_path: Path) -> None:
    if open_mpi_missing():
        pytest.skip(str(open_mpi_missing()))
    proc = subprocess.run([str(MLCKPT), "run", *run_args(site, "ompi")], env=env_of(site, **OPEN_MPI_ENV),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    made = printed_bundle(proc.stdout)
    system = json.loads((made / "system.json").read_text())
    assert system["hosts"][0]["mpi_library"].startswith("Open MPI v")  # without its NUL
    assert "\x1b[" not in proc.stdout  # Open MPI's per-rank terminal is no user's: plain lines
    report = checked(site, made, tmp_path)
    assert [b["verdict"] for b in report["bundles"]] == ["open"]


@pytest.mark.mpi
def test_another_mpis_launcher_is_refused_in_one_line(site: dict[str, Path]) -> None:
    if open_mpi_missing():
        pytest.skip(str(open_mpi_missing()))
    hydra = Path(sys.executable).parent / "mpiexec"
    if not hydra.exists():
        pytest.skip("no mpich wheel in this environment")
    proc = subprocess.run([str(hydra), "-n", "4", str(MLCKPT), "run", *run_args(site, "mixed")],
                          env=env_of(site, **OPEN_MPI_ENV), capture_output=True, text=True, timeout=300,
                          check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("mlckpt: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("mlckpt: error: the launcher started 4 ranks (PMI_SIZE=4) but the MPI "
                                "library mpi4py loads (Open MPI v")
    assert not (site["dir"] / "ck-mixed").exists()  # refused before any I/O
    explicit = subprocess.run([str(MLCKPT), "run", "--mpiexec", str(hydra), *run_args(site, "mixed")],
                              env=env_of(site, **OPEN_MPI_ENV), capture_output=True, text=True, timeout=120,
                              check=False)
    assert explicit.returncode == 2 and f"--mpiexec {hydra} is MPICH's launcher but mpi4py loads Open MPI" \
        in explicit.stderr


def test_a_checkpoint_being_prepared_is_inside_what_a_guardian_sweeps() -> None:
    from mlckpt.run.guardian.state import GuardianState

    st = GuardianState()
    st.handle({"step": "write 2", "ckpt": 2})
    assert st.ckpt == 2
    st.handle({"step": "prepare checkpoint 3", "made": 3})  # its folders may exist from here
    assert st.ckpt == 3


# --- Slurm: srun with and without a PMI, sbatch, scancel ------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from support import slurmbed

    why = slurmbed.unavailable()
    if why:
        pytest.skip(why)
    bed = slurmbed.start(tmp_path_factory.mktemp("slurm"))
    bed.env["PATH"] = f"{Path(sys.executable).parent}:{bed.env['PATH']}"
    yield bed
    bed.stop()


def srun(slurm: Any, site: dict[str, Path], mpi: str, name: str, *, timeout: float = 300,
         extra: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    """``srun -n 4 mlckpt run``.  Under srun every task is a rank, with no ``mlckpt run`` above them
    to run a disturbed run again (MLCKPT_RETRY_DISTURBED), so this does what a user's job script
    would: a run that ended disturbed (exit 6, another process on the test's busy disk) is run
    again, as often as the suite lets ``mlckpt run`` retry."""
    for _ in range(1 + int(os.environ.get("MLCKPT_RETRY_DISTURBED", "0"))):
        proc = subprocess.run(["srun", "-n", "4", f"--mpi={mpi}", str(MLCKPT), "run",
                               *run_args(site, name, *extra)],
                              env={**env_of(site, **env), "SLURM_CONF": slurm.env["SLURM_CONF"],
                                   "PATH": slurm.env["PATH"]},
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != ExitStatus.DISTURBED:
            break
        assert "verdict disturbed" in proc.stdout, proc.stdout[-3000:]  # said so, with its evidence
    return proc


@pytest.mark.mpi
def test_srun_without_a_pmi_is_refused_at_once_naming_the_flag(slurm: Any, site: dict[str, Path]) -> None:
    t0 = time.monotonic()
    proc = srun(slurm, site, "none", "nopmi")
    took = time.monotonic() - t0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("mlckpt: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert errors[0].startswith("mlckpt: error: srun started 4 tasks with no PMI (--mpi=none, Slurm's "
                                "default)")
    assert "Use srun --mpi=pmi2" in errors[0]
    assert took < 5, f"refused after {took:.1f} s"  # about 0.6 s here, srun's own start included
    assert not (site["dir"] / "ck-nopmi").exists()


@pytest.mark.mpi
def test_srun_with_pmi2_runs_mpich_ranks_whose_bundle_passes_the_checker(
        slurm: Any, site: dict[str, Path], tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "mpiexec").exists():
        pytest.skip("no mpich wheel in this environment")
    proc = srun(slurm, site, "pmi2", "pmi2")
    # valid, or disturbed by the busy disk and said so (never invalid: the checker below)
    assert proc.returncode in (0, ExitStatus.DISTURBED), (proc.stdout + proc.stderr)[-3000:]
    made = printed_bundle(proc.stdout)
    assert json.loads((made / "run.json").read_text())["ranks"] == 4
    assert json.loads((made / "system.json").read_text())["hosts"][0]["mpi_library"].startswith("MPICH")
    checked(site, made, tmp_path)
    refused = srun(slurm, site, "pmix", "mpich-pmix")  # MPICH's PMI-2 only: refused, not aborted
    assert refused.returncode == 2 and "srun --mpi=pmix started these tasks, but mpi4py loads an MPICH" \
        in refused.stderr, refused.stderr[-2000:]


@pytest.mark.mpi
def test_srun_with_pmix_runs_open_mpi_ranks_whose_bundle_passes_the_checker(
        slurm: Any, site: dict[str, Path], tmp_path: Path) -> None:
    if open_mpi_missing():
        pytest.skip(str(open_mpi_missing()))
    proc = srun(slurm, site, "pmix", "pmix", **OPEN_MPI_ENV)
    # valid, or disturbed by the busy disk and said so (never invalid: the checker below)
    assert proc.returncode in (0, ExitStatus.DISTURBED), (proc.stdout + proc.stderr)[-3000:]
    made = printed_bundle(proc.stdout)
    assert json.loads((made / "system.json").read_text())["hosts"][0]["mpi_library"].startswith("Open MPI")
    checked(site, made, tmp_path)


# rules 1.13: replicas loading; 1.14 reads their weights with O_DIRECT (SERVING-DIRECT)
SERVING = ("serving.strategy=fanout", "serving.tp=2", "serving.loads=2", "io.direct=true")


@pytest.mark.mpi
def test_a_serving_run_under_open_mpi_and_under_srun_passes_the_checker(
        slurm: Any, site: dict[str, Path], tmp_path: Path) -> None:
    """Fan-out's in-place all-gather and the sleeping barriers of a serving run, on Debian's Open
    MPI: launched by its own mpiexec, and by srun --mpi=pmix."""
    if open_mpi_missing():
        pytest.skip(str(open_mpi_missing()))
    proc = subprocess.run([str(MLCKPT), "run", *run_args(site, "ompi-serving", *SERVING)],
                          env=env_of(site, **OPEN_MPI_ENV), capture_output=True, text=True, timeout=600,
                          check=False)
    launched = srun(slurm, site, "pmix", "pmix-serving", extra=SERVING, **OPEN_MPI_ENV)
    for i, p in enumerate((proc, launched)):
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
        made = printed_bundle(p.stdout)
        host = json.loads((made / "system.json").read_text())["hosts"][0]
        assert host["mpi_library"].startswith("Open MPI")
        summary = json.loads((made / "summary.json").read_text())
        assert (summary["strategy"], summary["replicas"], summary["num_loads"]) == ("fanout", 2, 2)
        report = checked(site, made, tmp_path / str(i))
        assert [b["verdict"] for b in report["bundles"]] == ["open"]


def readme_batch_script() -> str:
    """The batch script of the docs' page for HPC sites, as a user copies it."""
    page = (paths.REPO / "docs" / "src" / "run" / "hpc.md").read_text()
    block = page.split("```sh\n#!/bin/bash\n", 1)[1].split("```", 1)[0]
    return "#!/bin/bash\n" + block


def sbatch(slurm: Any, site: dict[str, Path], script: str, name: str) -> tuple[str, Path]:
    d = site["dir"] / name
    d.mkdir()
    (d / "job.sh").write_text(script)
    proc = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=d, env=slurm.env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0], d


def wait_for(path: Path, text: str, timeout: float = 300) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    seen = path.read_text()[-2000:] if path.exists() else ""
    raise TimeoutError(f"no {text!r} in {path} after {timeout} s: {seen}")


@pytest.mark.mpi
def test_the_docs_batch_script_runs_and_its_bundle_passes_the_checker(
        slurm: Any, site: dict[str, Path], tmp_path: Path) -> None:
    from support.cli import CHECKER_SYSTEM

    script = readme_batch_script()
    assert "#SBATCH --ntasks=8" in script and "mlckpt run ranks=8 " in script
    d = site["dir"]
    script = script.replace("checkpoint.folder=$HOME/ckpt-test", f"checkpoint.folder={d / 'ck-sbatch'}")
    script = script.replace("system=system.yaml", f"system={d / (CHECKER_SYSTEM + '.yaml')}")
    script = script.rstrip("\n") + (" division=open scale=0.0005 checkpoint.num_writes=1 "
                                    f"checkpoint.num_reads=1 signing.key={d / 'keys' / 'org.pem'} "
                                    f"output.root={d / 'results-sbatch'}\n")
    job, folder = sbatch(slurm, site, script, "sbatch")
    slurm.wait_idle(timeout=600)
    out = (folder / f"mlckpt-{job}.out").read_text()
    assert "\x1b[" not in out and re.search(r"^\d\d:\d\d:\d\d   write 1$", out, re.M), out[-3000:]
    made = printed_bundle(out.replace("bundle: ", "\nbundle: "))
    assert json.loads((made / "run.json").read_text())["ranks"] == 8
    checked(site, made, tmp_path)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize(("during", "how"), [("write 2", ()), ("read 1", ("--signal=USR1", "--full"))])
def test_scancel_ends_the_run_with_one_line_and_nothing_left(slurm: Any, site: dict[str, Path],
                                                             during: str, how: tuple[str, ...]) -> None:
    """scancel (SIGTERM to every process of the job), or the signal `--signal=USR1@T` sends before a
    time limit (scancel --signal=USR1 here): one line, every checkpoint file and folder removed."""
    d = site["dir"]
    ck = d / f"ck-cancel-{during[0]}"
    script = ("#!/bin/bash\n#SBATCH --ntasks=4\n#SBATCH --output=out-%j.txt\n"
              f"{MLCKPT} run division=open scale=0.01 ranks=4 checkpoint.num_writes=3 checkpoint.num_reads=2 "
              f"signing.key=none checkpoint.folder={ck} output.root={d / 'results-cancel'}\n")
    job, folder = sbatch(slurm, site, script, f"cancel-{during[0]}")
    out = folder / f"out-{job}.txt"
    wait_for(out, f"   {during}\n")
    t0 = time.monotonic()
    assert slurm.run("scancel", *how, job).returncode == 0
    slurm.wait_idle(timeout=60)
    took = time.monotonic() - t0
    text = out.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("mlckpt: error:")]
    assert len(lines) == 1, text[-3000:]
    # the rank's own end (killed by signal 15, SIGTERM), or the signal the guardian itself received
    assert f"was stopped during {during} (" in lines[0], lines[0]
    assert re.search(r"SIG(TERM|USR1)", lines[0]), lines[0]
    assert "the job was cancelled)" in lines[0], lines[0]
    assert re.search(r"removed \d+ checkpoint files of this run", lines[0]), lines[0]
    left = [p for p in ck.rglob("*")] if ck.exists() else []
    assert left == [], left
    assert took < 30, f"the step ended {took:.1f} s after scancel"  # before Slurm's SIGKILL
