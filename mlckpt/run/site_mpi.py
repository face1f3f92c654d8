"""The site's MPI: which library mpi4py loads, which launcher starts ranks of that library, and
whether the ranks a launcher announced are the ranks the library sees.

An MPI job needs a launcher and a library of the same MPI: MPICH's Hydra ``mpiexec`` starting
ranks whose mpi4py loads Open MPI gives N singletons, each a world of one, that would write N
independent runs on the same storage.  So ``mlckpt run`` asks mpi4py which library it loads
(without initialising MPI; ``MPI4PY_LIBMPI`` and the ``mpich`` wheel decide, see mpi4py's
documentation), then takes the first launcher of that MPI it finds, or checks the one named with
``--mpiexec``.  Under a launcher, every rank compares the size the launcher announced in its
environment with the world MPI gives it.

The pure parts (what a version text says, what a launcher needs) are apart from the effects (a
launcher's ``--version``, mpi4py's library).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

FLAVOURS = {"mpich": "MPICH", "openmpi": "Open MPI", "intel": "Intel MPI"}

# Launchers to try, in order, for a library of each flavour (names on PATH; `mpiexec` beside the
# Python that runs mlckpt first: the `mpich` wheel's, or a venv's own).
CANDIDATES = {
    "mpich": ("mpiexec.hydra", "mpiexec.mpich", "mpiexec", "mpirun.mpich", "mpirun"),
    "openmpi": ("mpiexec.openmpi", "mpirun.openmpi", "mpiexec", "mpirun"),
    "intel": ("mpiexec.hydra", "mpiexec", "mpirun"),
}

# What a launcher sets in each rank's environment: (size variable, rank variable), most specific
# first.  Slurm's are read only with a PMI (srun --mpi=none starts tasks that are no MPI job).
ANNOUNCED = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), ("PMI_SIZE", "PMI_RANK"))
# Any of these: a launcher gave the process a way to join an MPI job (PMI-1/2, PMIx, Open MPI's).
PMI_PRESENT = ("PMI_FD", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_PORT")


def library_flavour(version: str) -> str | None:
    """The flavour of an MPI library from its ``MPI_Get_library_version`` text (pure)."""
    v = version.lower()
    if "open mpi" in v:
        return "openmpi"
    if "intel(r) mpi" in v or "intel mpi" in v:
        return "intel"
    if "mpich" in v or "mvapich" in v:
        return "mpich"
    return None


def launcher_flavour(version_output: str) -> str | None:
    """The flavour of a launcher from what its ``--version`` printed (pure)."""
    v = version_output.lower()
    if "open mpi" in v or "openrte" in v or "prte" in v:
        return "openmpi"
    if "intel(r) mpi" in v:
        return "intel"
    if "hydra" in v:
        return "mpich"
    return None


def launcher_args(flavour: str | None, root: bool) -> list[str]:
    """What mlckpt's own launch adds for a launcher (pure): Open MPI refuses more ranks than cores
    unless told (the laptop preset runs 8 ranks on any machine), and refuses root unless told."""
    if flavour != "openmpi":
        return []
    return ["--oversubscribe", *(["--allow-run-as-root"] if root else [])]


def first_line(text: str) -> str:
    from mlckpt.strict import printable  # YAML with it: not for `mlckpt --help`

    return str(printable((text.strip().splitlines() or [""])[0])).strip()


def loaded_library() -> str:
    """The first line of the MPI library mpi4py loads, without initialising MPI ('' if none)."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI

        return first_line(MPI.Get_library_version())
    except Exception:  # no MPI library at all: say so where it matters (find_launcher)
        return ""


def launcher_version(path: str) -> str:
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


@dataclass(frozen=True)
class Launcher:
    path: str
    flavour: str | None  # None: not known (an MPI this module does not name)
    library: str  # the library mpi4py loads, its first line


def _candidates(flavour: str | None) -> list[str]:
    beside = Path(sys.executable).parent
    names = CANDIDATES.get(flavour or "", ("mpiexec",))
    paths = [str(beside / n) for n in names if (beside / n).exists()]
    paths += [p for n in names if (p := shutil.which(n)) is not None]
    seen: set[str] = set()
    out = []
    for p in paths:  # /usr/bin/mpiexec is often a link to one of the others
        if os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            out.append(p)
    return out


def find_launcher(explicit: str | None, *, library: str | None = None) -> Launcher:
    """The launcher for the library mpi4py loads: ``explicit`` when it is of that MPI, else the
    first candidate that is.  Raises UsageError with both names when they cannot be matched."""
    from mlckpt.errors import UsageError

    library = loaded_library() if library is None else library
    if not library:
        raise UsageError("no MPI library found: install the `mpich` wheel (pip install 'mlckpt[mpich]') or "
                         "load your site's MPI (e.g. module load openmpi), whose library mpi4py then uses")
    want = library_flavour(library)
    if explicit:
        got = launcher_flavour(launcher_version(explicit))
        if want is not None and got is not None and got != want:
            raise UsageError(
                f"--mpiexec {explicit} is {FLAVOURS[got]}'s launcher but mpi4py loads {library} "
                f"({FLAVOURS[want]}): the ranks would each be a job of one; name {FLAVOURS[want]}'s "
                f"launcher, or set MPI4PY_LIBMPI to the library that launcher belongs to")
        return Launcher(explicit, got, library)
    tried = []
    for path in _candidates(want):
        got = launcher_flavour(launcher_version(path))
        if want is None or got == want:
            return Launcher(path, got, library)
        tried.append(f"{path} ({FLAVOURS.get(got or '', 'unknown')})")
    raise UsageError(
        f"mpi4py loads {library}, but no {FLAVOURS.get(want or '', 'matching')} launcher was found"
        + (f" (tried {', '.join(tried)})" if tried else "")
        + "; name one with --mpiexec PATH, or install the matching MPI")


def announced(env: Mapping[str, str]) -> tuple[str, int, int] | None:
    """``(variable, size, rank)`` a launcher announced to this process, or None (pure).  Under
    srun --mpi=pmix the size is the step's task count (PMIx announces only the rank)."""
    try:
        for size_var, rank_var in ANNOUNCED:
            if size_var in env:
                return size_var, int(env[size_var]), int(env.get(rank_var, "0"))
        if "PMIX_RANK" in env:
            size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else ""
            if size_var:
                return size_var, int(env[size_var]), int(env["PMIX_RANK"])
    except ValueError:
        return None
    return None


def slurm_tasks_without_pmi(env: Mapping[str, str]) -> tuple[int, int] | None:
    """``(tasks, this task)`` of an srun step that started several tasks with no PMI for MPI
    (srun --mpi=none, Slurm's usual default), or None (pure)."""
    # SLURM_STEP_NUM_TASKS: set by srun; a batch script's own step has SLURM_NTASKS (the job's
    # tasks) but runs once, and `mlckpt run` there launches its ranks itself.
    if "SLURM_STEP_NUM_TASKS" not in env or any(v in env for v in PMI_PRESENT):
        return None
    try:
        tasks = int(env["SLURM_STEP_NUM_TASKS"])
        return (tasks, int(env.get("SLURM_PROCID", "0"))) if tasks > 1 else None
    except ValueError:
        return None


def slurm_refusal(tasks: int) -> str:
    return (f"srun started {tasks} tasks with no PMI (--mpi=none, Slurm's default): the MPI library "
            "cannot join them into one job, and each would launch a run of its own. Use srun --mpi=pmi2 "
            "(or --mpi=pmix where the site's MPI supports it), or start one task (srun -n 1, or "
            "`mlckpt run ranks=N` in an sbatch script) and let mlckpt launch its ranks")


def library_abi() -> str | None:
    """``mpich`` or ``openmpi``: the ABI of the library mpi4py's wheel will load, found without
    loading MPI (mpi4py's own resolution; None where mpi4py was built against one library)."""
    try:
        from mpi4py import _mpiabi

        return str(_mpiabi._get_mpiabi()) or None  # type: ignore[attr-defined]  # private: not in its stubs
    except Exception:
        return None


def refuse_slurm_without_pmi(env: Mapping[str, str]) -> None:
    """Under srun with no PMI, or with PMIx for an MPICH library (which joins a Slurm step through
    PMI-2 only, and would abort in MPI_Init): one line from task 0 (the others exit 2 quietly),
    before anything heavy is loaded."""
    from mlckpt.errors import UsageError

    found = slurm_tasks_without_pmi(env)
    if found is not None:
        raise UsageError(slurm_refusal(found[0]) if found[1] == 0 else "", key="srun")
    if "PMIX_RANK" in env and "SLURM_PROCID" in env and "PMI_FD" not in env and library_abi() == "mpich":
        raise UsageError(
            "srun --mpi=pmix started these tasks, but mpi4py loads an MPICH library (the `mpich` wheel's "
            "joins a Slurm step through PMI-2 only): use srun --mpi=pmi2, or install mlckpt without the "
            "mpich extra where the site's MPI speaks PMIx" if speaks(env) else "", key="srun")


# A variable only one MPI's launcher sets, by the ABI of its library: MPICH's Hydra (Intel MPI's
# too), Open MPI's mpirun.
LAUNCHER_MARKS = {"mpich": "HYDI_CONTROL_FD", "openmpi": "OMPI_COMM_WORLD_SIZE"}


def foreign_launcher(env: Mapping[str, str], abi: str | None) -> bool:
    """Whether another MPI's launcher than the library's (``abi``: :func:`library_abi`) started
    several ranks here (pure).  Each would start MPI as a singleton, a world of one, and Open MPI's
    singleton start can itself fail on a loaded host: the ranks are refused before MPI starts."""
    a = announced(env)
    return abi is not None and a is not None and a[1] > 1 and any(
        var in env for flavour, var in LAUNCHER_MARKS.items() if flavour != abi)


def mismatch(env: Mapping[str, str], world: int, library: str) -> str:
    """One line when the launcher announced more ranks than the MPI world holds (pure)."""
    a = announced(env)
    if a is None or a[1] == world:
        return ""
    var, size, _ = a
    return (f"the launcher started {size} ranks ({var}={size}) but the MPI library mpi4py loads "
            f"({library}) sees a world of {world}: the launcher belongs to another MPI. Start the ranks "
            f"with that library's own launcher (or srun --mpi=pmi2/pmix), or run `mlckpt run` without "
            f"a launcher: it picks the matching one")


def speaks(env: Mapping[str, str]) -> bool:
    """Whether this process is the one of its launch that prints a refusal (its announced rank, or
    Slurm task, is 0)."""
    a = announced(env)
    if a is not None:
        return a[2] == 0
    return env.get("SLURM_PROCID", "0") == "0"
