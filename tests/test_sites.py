"""At an HPC site: what the site's MPI library reports about itself reaches the bundle in a form the
checker accepts, and the runner never publishes a bundle its own checker would refuse for its form.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlckpt import strict
from mlckpt.host.facts import host_facts
from mlckpt.run.publish import self_check

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
    refusal = m.slurm_refusal(4)
    assert "Use srun --mpi=pmi2" in refusal and refusal.startswith("srun started 4 tasks")


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
