"""`mlckpt run OVERRIDES`: run a workload.

Under mpiexec every rank runs :func:`mlckpt.run.runner.mpi_main`.  Started directly, it validates the
configuration (fail fast, before any process is spawned) and re-launches itself under the
installed MPI's ``mpiexec -n RANKS``.  ``-m`` (Hydra multirun) expands sweeps such as
``ranks=8,16 io.threads=1,4`` and runs each combination as its own launch, one bundle each.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlckpt.errors import UsageError

# The presets of `mlckpt run`: keys set unless the command line sets them.  ``laptop``, the
# default: the llama3_8b layout on its 8 ranks, open division, scaled so one checkpoint is ~1.3 GiB,
# 3 writes and 3 reads (about 10 s on a 2-core VM).  It stays in force whatever else is overridden
# (a checkpoint folder given for a first try must not turn the run into a full-scale closed one);
# ``preset=none`` (or ``division=closed``) runs the workload's own configuration.
PRESETS: dict[str, tuple[str, ...]] = {
    "laptop": ("workload=llama3_8b", "division=open", "scale=0.0125", "checkpoint.num_writes=3",
               "checkpoint.num_reads=3"),
    "none": (),
}
EMBEDDED_DEFAULT = PRESETS["laptop"]

TERMINAL_ENV = "MLCKPT_TERMINAL"  # COLUMNSxLINES of the terminal `mlckpt run` was started in
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run", help="run a checkpoint workload (self-launches under mpiexec)",
        description="Run checkpoint writes and restores with real MPI ranks and real fsync, "
        "verify every page read back, and write a result bundle. With no overrides: the embedded "
        "laptop default (" + " ".join(EMBEDDED_DEFAULT) + ").")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    p.add_argument("-m", "--multirun", action="store_true",
                   help="expand comma-separated sweeps (ranks=8,16 io.threads=1,4): one launch each")
    p.add_argument("--mpiexec", default=None, help="mpiexec to self-launch with (default: the one "
                   "installed next to this Python, else the first on PATH)")
    p.set_defaults(func=handle)


def under_mpi() -> bool:
    return any(v in os.environ for v in _MPI_ENV)


def find_mpiexec(explicit: str | None) -> str:
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise UsageError("no mpiexec found: install the `mpich` wheel (pip install mpich) or an MPI")
    return found


def expand_sweeps(overrides: Sequence[str]) -> list[list[str]]:
    """Hydra's basic-sweeper semantics: the cartesian product of comma-separated values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise UsageError(f"cannot parse override: {str(exc).splitlines()[0]}") from None
    axes = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    return [list(combo) for combo in itertools.product(*axes)]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def with_preset(overrides: Sequence[str]) -> tuple[list[str], str]:
    """The overrides with the preset's keys the command line does not set, and the preset's name
    (``preset=NAME`` given, else none for ``division=closed``, else laptop)."""
    chosen = [o.split("=", 1)[1] for o in overrides if _key(o) == "preset"]
    rest = [o for o in overrides if _key(o) != "preset"]
    if len(chosen) > 1:
        raise UsageError("preset: given more than once")
    closed = any(_key(o) == "division" and o.split("=", 1)[1].strip() == "closed" for o in rest)
    name = chosen[0] if chosen else ("none" if closed else "laptop")
    if name not in PRESETS:
        raise UsageError(f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)}")
    given = {_key(o) for o in rest}
    return [*(o for o in PRESETS[name] if _key(o) not in given), *rest], name


def handle(args: argparse.Namespace) -> int:
    overrides, preset = with_preset(args.overrides)
    if under_mpi():
        if args.multirun:
            raise UsageError("-m/--multirun launches one mpiexec per configuration; "
                             "run it outside mpiexec")
        from mlckpt.run.runner import mpi_main

        return mpi_main(overrides)
    combos = expand_sweeps(overrides) if args.multirun else [overrides]
    if preset != "none":
        added = [o for o in PRESETS[preset] if o in overrides]
        print(f"mlckpt run: preset {preset} in force ({' '.join(added) or 'every key given'}; "
              "preset=none for the workload's own configuration)", flush=True)
    mpiexec = find_mpiexec(args.mpiexec)
    if len(combos) > 1:
        from mlckpt.cli.sweep import run_sweep

        return run_sweep(combos, validate, lambda combo: launch(mpiexec, combo))
    return launch(mpiexec, combos[0])


def validate(overrides: list[str]) -> Any:
    """Everything `mlckpt run` checks before it spawns a rank: the configuration, the system
    description, and the gates every rank applies, on this host.  Returns the Setup."""
    from mlckpt.host.description import load_system_description
    from mlckpt.plan.config import setup
    from mlckpt.run.gates import blocking_message, description_refusal, local_host

    s = setup(overrides)
    if s.config.get("system"):
        load_system_description(s.config["system"], s.rules.version)
    # Every rank will be local: apply the same gates the ranks apply, before spawning any.
    folder = Path(s.config["checkpoint"]["folder"]).absolute()
    fast = s.config["checkpoint"]["tiers"]["fast"]
    results = Path(s.config["output"]["root"]).absolute()
    ctx = s.context((local_host(folder, range(s.plan.ranks), fast, results),), complete=True, measured=True)
    refusal = blocking_message(s.rules.evaluate(ctx, ["config", "host"]).findings, str(s.config["division"]))
    if refusal:
        raise UsageError(refusal)
    missing = description_refusal(s.config)
    if missing is not None:
        raise missing
    return s


def launch(mpiexec: str, overrides: list[str], rank_command: Sequence[str] | None = None) -> int:
    """Validate here (fail fast, nothing spawned), then run ``rank_command`` (default: this
    ``mlckpt run``) on every rank under mpiexec."""
    s = validate(overrides)
    ranks = list(rank_command or (sys.executable, "-m", "mlckpt", "run", "preset=none"))
    cmd = [mpiexec, "-n", str(s.plan.ranks), *ranks, *overrides]
    env = dict(os.environ)
    if sys.stdout.isatty():  # rank 0's output reaches this terminal through mpiexec's pipes
        size = shutil.get_terminal_size()
        env[TERMINAL_ENV] = f"{size.columns}x{size.lines}"
    try:
        return subprocess.run(cmd, check=False, env=env).returncode
    except OSError as exc:
        raise UsageError(f"cannot start {mpiexec}: {exc.strerror}") from None
