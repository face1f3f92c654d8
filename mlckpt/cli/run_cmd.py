"""`mlckpt run OVERRIDES`: run a workload.

Under mpiexec every rank runs :func:`mlckpt.run.runner.mpi_main`.  Started directly, it validates the
configuration (fail fast, before any process is spawned) and re-launches itself under the
installed MPI's ``mpiexec -n RANKS``.  ``-m`` (Hydra multirun) expands sweeps such as
``ranks=8,16 io.threads=1,4`` and runs each combination as its own launch, one bundle each.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import secrets
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from mlckpt.cli import hydra_app
from mlckpt.command_line import override_key
from mlckpt.errors import ExitStatus, MlckptError, UsageError
from mlckpt.run.site_mpi import Launcher, launcher_args

if TYPE_CHECKING:  # Hydra and the rules load when a run is composed, not for `mlckpt --help`
    from mlckpt.plan.config import ConfigSource, Setup

# The presets of `mlckpt run`: keys set unless the command line sets them.  ``laptop``, the
# default: the llama3_8b layout on its 8 ranks, open division, scaled so one checkpoint is ~1.3 GiB,
# 3 writes and 3 reads (about 10 s on a 2-core VM).  It stays in force whatever else is overridden
# (a checkpoint folder given for a first try must not turn the run into a full-scale closed one),
# but only for a bare `mlckpt run`: under an external launcher, or with a key that says the run is
# meant as a result (INTENT_KEYS, division=closed, one invocation of a split result), the workload's own
# configuration runs (with_preset); ``preset=laptop`` asks for it anyway.
PRESETS: dict[str, tuple[str, ...]] = {
    "laptop": ("workload=llama3_8b", "division=open", "scale=0.0125", "checkpoint.num_writes=3",
               "checkpoint.num_reads=3"),
    "none": (),
}
EMBEDDED_DEFAULT = PRESETS["laptop"]

TERMINAL_ENV = "MLCKPT_TERMINAL"  # COLUMNSxLINES of the terminal `mlckpt run` was started in
RETRY_ENV = "MLCKPT_RETRY_DISTURBED"  # run a disturbed run again, up to this many times
RETRY_PAUSE_S = 4.0  # ... after this pause (a tenant's burst may pass), said before and after
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def register(sub: argparse._SubParsersAction) -> None:
    # Listed in `mlckpt --help`; the command line itself goes to Hydra's parser (see handle_argv).
    sub.add_parser(
        "run", help="run a checkpoint workload (self-launches under mpiexec; Hydra flags: "
        "--cfg job, --info, -cd DIR, -cn NAME, -m)", add_help=False)


def under_mpi() -> bool:
    return any(v in os.environ for v in _MPI_ENV)


def find_mpiexec(explicit: str | None) -> Launcher:
    """The launcher of the MPI library mpi4py loads (mlckpt.run.site_mpi), or ``explicit`` when it
    is of the same MPI."""
    from mlckpt.run.site_mpi import find_launcher

    return find_launcher(explicit)


def expand_sweeps(overrides: Sequence[str]) -> list[list[str]]:
    """Hydra's basic-sweeper semantics and spelling: the cartesian product of comma-separated
    values, each written ``key=value`` as the sweeper hands them to a job."""
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
            if key == "output.root":
                raise UsageError("output.root: cannot be swept (each combination gets its own "
                                 "sub-folder of it)", key="output.root")
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([f"{key}={o.get_value_element_as_str()}"])
    return [list(combo) for combo in itertools.product(*axes)]


# Keys that say the run is meant as a result (a rule set, the closed division, an accelerator, a
# system description, one invocation of a split result): the laptop preset never fills in around them.
INTENT_KEYS = ("rules", "rules_version", "accelerator", "system", "checkpoint.restore_from")


def intent(overrides: Sequence[str]) -> str:
    """The first override that says the run is meant as a result, or '' (pure)."""
    for o in overrides:
        key, _, value = o.partition("=")
        key = override_key(o)
        if key in INTENT_KEYS or (key == "division" and value.strip() == "closed"):
            return o.lstrip("+~")
        if key in ("checkpoint.num_writes", "checkpoint.num_reads") and value.strip() == "0":
            return o.lstrip("+~")  # one invocation of a split (MLPerf-style) result
    return ""


def with_preset(overrides: Sequence[str], external: bool = False) -> tuple[list[str], str, str]:
    """The overrides with the preset's keys the command line does not set, the preset's name and
    why: ``preset=NAME`` given; else none under an external launcher (mpiexec, srun: a site's run)
    or with a key that says the run is meant as a result (:func:`intent`); else laptop, the bare
    quick start's."""
    chosen = [o.split("=", 1)[1] for o in overrides if override_key(o) == "preset"]
    rest = [o for o in overrides if override_key(o) != "preset"]
    if len(chosen) > 1:
        raise UsageError("preset: given more than once")
    meant = intent(rest)
    if chosen:
        name, why = chosen[0], "preset= given"
    elif external:
        name, why = "none", "under a launcher"
    elif meant:
        name, why = "none", f"{meant} given"
    else:
        name, why = "laptop", "a bare run"
    if name not in PRESETS:
        raise UsageError(f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)}")
    given = {override_key(o) for o in rest}
    return [*(o for o in PRESETS[name] if override_key(o) not in given), *rest], name, why


def preset_line(preset: str, overrides: Sequence[str]) -> str:
    added = [o for o in PRESETS[preset] if o in overrides]
    return (f"mlckpt run: preset {preset} in force ({' '.join(added) or 'every key given'}; "
            "preset=none for the workload's own configuration)")


def handle_argv(argv: Sequence[str]) -> int:
    """`mlckpt run ARGS`: ``--mpiexec PATH`` and ``--json`` are mlckpt's own; everything else is
    Hydra's. With ``--json`` stdout carries only the outcome lines (mlckpt/cli/run_outcome.py)."""
    from mlckpt.cli import run_outcome

    as_json, argv = run_outcome.wanted(argv)
    if as_json and under_mpi():  # every rank's stdout is the launcher's: no line of its own for scripts
        raise UsageError("--json: for `mlckpt run` started on its own (it launches its ranks); under "
                         "mpiexec or srun, read the bundle from the 'bundle: PATH' line", key="--json")
    if not as_json:
        return _handle(argv, None)
    stdout, outcomes = sys.stdout, Outcomes(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _handle(argv, outcomes)
    except MlckptError as err:
        if not outcomes.printed:  # refused before any launch
            print(run_outcome.line(run_outcome.refused(err.exit_status, str(err).splitlines()[0])),
                  file=stdout, flush=True)
        raise


class Outcomes:
    """Where `--json` prints each launch's outcome line (the real stdout)."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.printed = out, 0

    def add(self, doc: Mapping[str, object]) -> None:
        from mlckpt.cli import run_outcome

        print(run_outcome.line(doc), file=self.out, flush=True)
        self.printed += 1


def _handle(argv: Sequence[str], outcomes: Outcomes | None) -> int:
    mpiexec, rest = None, list(argv)
    for i, a in enumerate(rest):
        if a == "--mpiexec" and i + 1 < len(rest):
            mpiexec, rest = rest[i + 1], rest[:i] + rest[i + 2:]
            break
        if a.startswith("--mpiexec="):
            mpiexec, rest = a.split("=", 1)[1], rest[:i] + rest[i + 1:]
            break
    if rest in (["--help"], ["-h"]):  # the plain help: fast after its first time
        return _plain_help(rest)
    args = hydra_app.parse(rest)
    src = hydra_app.source(args)
    flags = [a for a in rest if a not in args.overrides]  # Hydra's own flags, in order
    external = under_mpi()
    overrides, preset, why = with_preset(args.overrides if external else hydra_app.aliased(args.overrides),
                                         external=external)
    if external:
        if args.multirun or hydra_app.shows_only(args):
            raise UsageError("-m and the showing flags start no ranks; run them outside mpiexec")
        from mlckpt.run.runner import mpi_main
        from mlckpt.run.site_mpi import speaks

        if preset != "none" and speaks(os.environ):  # mlckpt's own launch passes preset=none
            print(preset_line(preset, overrides), flush=True)
        return mpi_main(overrides, source=src)
    task, passed = hydra_app.split(overrides, bool(args.multirun))
    if hydra_app.shows_only(args):
        if args.cfg or args.info is not None:
            from mlckpt.plan.config import compose

            compose(task, src)  # a bad override is one line and exit 2, as for a run
        hydra_app.call([*task, *passed, *flags], lambda cfg: 0, info=args.info is not None)
        return ExitStatus.OK
    if preset != "none":
        print(preset_line(preset, overrides), flush=True)
    elif why != "preset= given":
        print(f"mlckpt run: no preset ({why}): the workload's own configuration with the keys given",
              flush=True)
    exe = find_mpiexec(mpiexec)
    if not args.multirun:
        s = validate(task, src)  # before Hydra creates the results folder
        existed = s.settings.results.exists()  # an interrupt removes it if not
        outcome: list[int] = []

        def one(cfg: object) -> int:
            combo, out = hydra_app.job_context()
            outcome.append(launch(exe, _in_folder(combo, out, s), src, s, results_existed=existed,
                                  outcomes=outcomes))
            return outcome[-1]

        hydra_app.call([*task, *flags], one)
        return outcome[0]
    return _multirun(exe, flags, task, passed, src, outcomes)


def _plain_help(flag: list[str]) -> int:
    from mlckpt.resources import workloads_dir

    shipped = sorted(workloads_dir().rglob("*.yaml"))
    code = [Path(__file__).resolve(), Path(hydra_app.__file__).resolve()]
    overrides, _, _ = with_preset([])
    hydra_app.cached_help(lambda: hydra_app.call([*overrides, *flag], lambda cfg: 0), [*shipped, *code])
    return ExitStatus.OK


def _in_folder(combo: list[str], out: str, setup: Setup) -> list[str]:
    """The job's overrides, with Hydra's output folder as its results folder."""
    if Path(out).absolute() == setup.settings.results:
        return combo
    return [o for o in combo if override_key(o) != "output.root"] + [f"output.root={hydra_app.quoted(out)}"]


def _multirun(exe: Launcher, flags: list[str], task: list[str], passed: list[str], src: ConfigSource | None,
              outcomes: Outcomes | None) -> int:
    from mlckpt.cli import sweep

    combos = expand_sweeps(task)
    setups = sweep.validate_all(combos, lambda combo: validate(combo, src))
    keys = sweep.swept_keys(combos)
    naming = hydra_app.sweep_naming(keys, [override_key(o) for o in combos[0]])
    done: list[sweep.Done] = []

    def one(cfg: object) -> int:
        if done and done[-1].status == ExitStatus.INTERRUPTED:  # Ctrl-C stops the sweep, not one combination
            return ExitStatus.INTERRUPTED
        combo, out = hydra_app.job_context()
        s = setups[frozenset(combo)]
        print(f"--- multirun {len(done) + 1}/{len(combos)}: {' '.join(combo)}", flush=True)
        done.append(sweep.launched(combo, Path(out), lambda: launch(exe, _in_folder(combo, out, s), src, s,
                                                                      outcomes=outcomes)))
        return done[-1].status

    hydra_app.call([*task, *naming, *passed, *flags], one)
    if done and done[-1].status == ExitStatus.INTERRUPTED and len(done) < len(combos):
        print(f"--- sweep interrupted after {len(done)} of {len(combos)} combinations; the rest were not "
              "run", flush=True)
    root = next(iter(setups.values())).settings.results
    return sweep.finish(done, root)


def validate(overrides: list[str], source: ConfigSource | None = None) -> Setup:
    """Everything `mlckpt run` checks before it spawns a rank: the configuration, the system
    description, and the gates every rank applies, on this host.  Returns the Setup."""
    from mlckpt.host.description import load_system_description
    from mlckpt.plan.config import SHIPPED, setup
    from mlckpt.run.phases.gates import blocking_message, description_refusal, local_host, output_problem
    from mlckpt.run.storage.folderlock import refusal
    from mlckpt.run.storage.kinds import local_folder

    s = setup(overrides, source or SHIPPED)
    run = s.settings
    if run.system:
        load_system_description(run.system, s.rules.version)
    # Every rank will be local: apply the same gates the ranks apply, before spawning any.
    folder = Path(run.checkpoint.folder).absolute()
    problem = output_problem(run.results)  # before Hydra creates the results folder
    if problem:
        raise UsageError(f"output.root: {problem}", key="output.root")
    held = None if local_folder(run.checkpoint.folder) is None else refusal(folder)
    if held:  # another run measures the folder, or still removes its files
        raise UsageError(held, key="checkpoint.folder")
    if run.signing_key not in ("auto", "none"):  # an unusable key file
        from mlckpt.run.phases.configure import resolve_signing_key

        resolve_signing_key(run.signing_key, print)
    here = local_host(folder, range(s.plan.ranks), run.checkpoint.fast_tier, run.results, s.config)
    ctx = s.context((here,), complete=True, measured=True)
    blocked = blocking_message(s.rules.evaluate(ctx, ["config", "host"]).findings, run.division)
    if blocked:
        raise UsageError(blocked)
    missing = description_refusal(s.settings)
    if missing is not None:
        raise missing
    return s


def launch(mpiexec: Launcher, overrides: list[str], source: ConfigSource | None = None,
           setup: Setup | None = None, rank_command: Sequence[str] | None = None, *,
           results_existed: bool = True, outcomes: Outcomes | None = None) -> int:
    """Validate here (fail fast, nothing spawned) unless ``setup`` is the validated one, then run
    ``rank_command`` (default: this ``mlckpt run``) on every rank under mpiexec; with ``outcomes``
    (``--json``) the ranks' output goes to stderr and the launch's outcome line to ``outcomes``."""
    from mlckpt.plan.config import SHIPPED

    source = source or SHIPPED
    setup = setup or validate(overrides, source)
    ranks = list(rank_command or (sys.executable, "-m", "mlckpt", "run", *source.args(), "preset=none"))
    extra = launcher_args(mpiexec.flavour, os.geteuid() == 0)
    cmd = [mpiexec.path, *extra, "-n", str(setup.plan.ranks), *ranks, *overrides]
    env = dict(os.environ)
    if sys.stdout.isatty():  # rank 0's output reaches this terminal through mpiexec's pipes
        size = shutil.get_terminal_size()
        env[TERMINAL_ENV] = f"{size.columns}x{size.lines}"
    if outcomes is None:
        return _tries(mpiexec, cmd, env, setup, results_existed, None)
    from mlckpt.cli import run_outcome

    with run_outcome.noted() as (note_env, note):
        status = _tries(mpiexec, cmd, env | note_env, setup, results_existed, sys.stderr)
        outcomes.add(run_outcome.outcome(status, overrides, run_outcome.last_note(note)))
    return status


def _tries(mpiexec: Launcher, cmd: list[str], env: dict[str, str], setup: Setup, results_existed: bool,
           out: TextIO | None) -> int:
    """The launch, and again after a pause while it is disturbed and MLCKPT_RETRY_DISTURBED allows."""
    retries = disturbed_retries(os.environ)
    for attempt in range(retries + 1):
        status = _launch_once(mpiexec, cmd, env, setup, results_existed, out)
        if status != ExitStatus.DISTURBED or attempt == retries:
            return status
        print(f"mlckpt run: the run was disturbed (its bundle is kept); running it again in "
              f"{RETRY_PAUSE_S:g} s ({RETRY_ENV}: retry {attempt + 1} of {retries})", flush=True)
        time.sleep(RETRY_PAUSE_S)
        # a piped run says something at least every 5 s (docs: your first run), this wait included
        print(f"mlckpt run: running it again ({RETRY_ENV}: retry {attempt + 1} of {retries})", flush=True)
    return status


def _launch_once(mpiexec: Launcher, cmd: list[str], env: dict[str, str], setup: Setup,
                 results_existed: bool, out: TextIO | None = None) -> int:
    """One launch; a Ctrl-C waits for the run's cleanup (mlckpt.cli.interrupt), never kills it."""
    from mlckpt.cli import interrupt
    from mlckpt.run.storage.folderlock import LAUNCH_ENV
    from mlckpt.run.storage.kinds import local_folder

    run = setup.settings
    launch = interrupt.Launch(local_folder(run.checkpoint.folder), secrets.token_hex(8), run.results,
                              results_existed, run.checkpoint.kept)
    with interrupt.Presses() as presses:
        try:
            proc, relays = interrupt.relayed(cmd, {**env, LAUNCH_ENV: launch.token}, out, presses)
        except OSError as exc:
            raise UsageError(f"cannot start {mpiexec.path}: {exc.strerror}") from None
        return interrupt.wait(proc, launch, presses, relays)


def disturbed_retries(env: Mapping[str, str]) -> int:
    """How many times a disturbed run is run again (``MLCKPT_RETRY_DISTURBED``, default 0): for
    unattended campaigns on shared machines, where another tenant comes and goes."""
    raw = env.get(RETRY_ENV, "0").strip() or "0"
    if not raw.isdigit() or int(raw) > 10:
        raise UsageError(f"{RETRY_ENV}={raw!r}: expected a whole number of retries from 0 to 10",
                         key=RETRY_ENV)
    return int(raw)
