"""`mlckpt run`'s command line through Hydra's own machinery.

Hydra's parser reads the flags Hydra users expect (``--cfg job|hydra|all``, ``--resolve``,
``--info``, ``--help``, ``--hydra-help``, ``-cd``, ``-cn``, ``-m``) and ``hydra.main`` runs them:
showing a configuration, or running the job function once (a run) or once per combination under
Hydra's basic sweeper and launcher (``-m``).  What mlckpt adds is the policy on ``hydra.*``
overrides: each is honoured (the output folders) or refused with one line, never ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from mlckpt.command_line import override_key
from mlckpt.errors import UsageError
from mlckpt.plan import aliases
from mlckpt.resources import workloads_dir

if TYPE_CHECKING:  # the configuration (Hydra, the rules) loads only when a command composes
    from mlckpt.plan.config import ConfigSource

# hydra.* keys mlckpt honours, and what they become.  Everything else under hydra is refused:
# Hydra's logging, working-directory and callback settings would change nothing mlckpt measures
# or records, and other sweepers or launchers would either generate combinations mlckpt cannot
# validate before the first launch or run two measurements at once on the same storage.
RESULTS_FOLDER = {"hydra.run.dir": False, "hydra.sweep.dir": True}  # key → valid under -m
PASSED_TO_HYDRA = ("hydra.sweep.subdir",)
HONOURED = (*RESULTS_FOLDER, *PASSED_TO_HYDRA)


def parser() -> argparse.ArgumentParser:
    from hydra._internal.utils import get_args_parser

    p = get_args_parser()
    p.prog = "mlckpt run"

    def error(message: str) -> NoReturn:  # one line, exit 2, like every mlckpt usage error
        raise UsageError(f"{message}{flag_hint(message)} (mlckpt run --help)")

    p.error = error  # type: ignore[method-assign]
    return p


def flag_hint(message: str) -> str:
    """``--workload`` given as a flag: mlckpt's settings are ``key=value`` overrides (pure)."""
    flags = [w for w in message.removeprefix("unrecognized arguments:").split() if w.startswith("--")]
    if not message.startswith("unrecognized arguments:") or not flags:
        return ""
    key = flags[0].lstrip("-").split("=", 1)[0].replace("-", "_")
    return f"; settings are key=value overrides: did you mean {key}=…?"


def parse(argv: Sequence[str]) -> argparse.Namespace:
    args = parser().parse_intermixed_args(list(argv))  # `-m` may come after overrides
    if args.config_path is not None:
        raise UsageError("--config-path: give your own config folder with --config-dir DIR instead "
                         "(the ranks compose from the same folders)", key="--config-path")
    if args.experimental_rerun is not None:
        raise UsageError("--experimental-rerun: not supported; a bundle's run.json records its "
                         "overrides", key="--experimental-rerun")
    return args


def source(args: argparse.Namespace) -> ConfigSource:
    from mlckpt.plan.config import ConfigSource

    return ConfigSource(args.config_dir, args.config_name or "config")


def aliased(overrides: Sequence[str]) -> list[str]:
    """The overrides under mlckpt's names; a note on stderr for each mlpstorage or DLIO name."""
    out, notes = aliases.canonical(overrides)
    for note in notes:
        print(f"mlckpt: note: {note}", file=sys.stderr, flush=True)
    return out


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """Hydra's -cd/-cn for the commands that compose without running (plan, size, config)."""
    parser.add_argument("--config-dir", "-cd", default=None, metavar="DIR",
                   help="your own config folder (e.g. DIR/workload/NAME.yaml) beside mlckpt's")
    parser.add_argument("--config-name", "-cn", default=None, metavar="NAME",
                   help="primary config name (default: config)")


def shows_only(args: argparse.Namespace) -> bool:
    """The flags that print something and run nothing."""
    return bool(args.help or args.hydra_help or args.cfg or args.info is not None
                or args.shell_completion)


def split(overrides: Sequence[str], multirun: bool) -> tuple[list[str], list[str]]:
    """The job's own overrides (a results folder given as ``hydra.run.dir``/``hydra.sweep.dir``
    becomes ``output.root``) and the hydra.* overrides handed to Hydra."""
    task: list[str] = []
    passed: list[str] = []
    folders: list[str] = []
    for o in overrides:
        key = override_key(o)
        if not (key == "hydra" or key.startswith(("hydra.", "hydra/"))):
            task.append(o)
        elif key in RESULTS_FOLDER:
            if RESULTS_FOLDER[key] != multirun:
                other = next(k for k, m in RESULTS_FOLDER.items() if m == multirun)
                raise UsageError(f"{key}: applies {'under -m' if RESULTS_FOLDER[key] else 'without -m'}; "
                                 f"give {other}=DIR (or output.root=DIR)", key=key)
            folders.append(o.split("=", 1)[1])
        elif key in PASSED_TO_HYDRA:
            if not multirun:
                raise UsageError(f"{key}: applies under -m only", key=key)
            passed.append(o)
        else:
            raise UsageError(f"{key}: not honoured by mlckpt run (it keeps its own run.log and "
                             f"records its configuration in the bundle); honoured: {', '.join(HONOURED)}",
                             key=key)
    given = [o.split("=", 1)[1] for o in task if override_key(o) == "output.root"]
    if folders:
        if len(set(folders + given)) > 1:
            raise UsageError(f"output.root: given twice with different folders "
                             f"({', '.join(sorted(set(folders + given)))})", key="output.root")
        task = [o for o in task if override_key(o) != "output.root"] + [f"output.root={folders[-1]}"]
    return task, passed


def call(argv: Sequence[str], job: Callable[[object], int], *, info: bool = False) -> None:
    """Run Hydra's own main on ``argv`` (flags and overrides) with ``job`` as its task function.
    Hydra parses ``sys.argv``; it is restored afterwards.  ``info``: Hydra's --info report (written
    through its logger) is shown; otherwise only its warnings are."""
    import logging

    import hydra

    # --info: Hydra sets up its own stdout logging for the report; inherit it.
    logging.getLogger("hydra").setLevel(logging.NOTSET if info else logging.WARNING)
    from omegaconf import OmegaConf

    # workloads/config.yaml names each sweep folder through this: a value's '/' would nest it.
    OmegaConf.register_new_resolver("mlckpt_folder_name", folder_name, replace=True)
    main = hydra.main(config_path=str(workloads_dir()), config_name="config", version_base="1.3")(job)
    saved = sys.argv
    sys.argv = ["mlckpt run", *argv]
    try:
        main()
    finally:
        sys.argv = saved


def job_context() -> tuple[list[str], str]:
    """Inside a Hydra job: its overrides (under -m, its combination) and its output folder."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    return list(hc.overrides.task), str(hc.runtime.output_dir)


def sweep_naming(swept: Sequence[str], all_keys: Sequence[str]) -> list[str]:
    """Hydra's per-combination folder names (``hydra.job.override_dirname``) list only the swept
    keys: every other key is excluded."""
    fixed = [k for k in dict.fromkeys(all_keys) if k not in swept]
    return [f"hydra.job.config.override_dirname.exclude_keys=[{','.join(fixed)}]"] if fixed else []


def folder_name(swept: str) -> str:
    """A combination's folder name from Hydra's ``key=value,key=value`` (one path component)."""
    name = swept.replace("/", "_").lstrip(".")
    return name or "combination"


def quoted(value: str) -> str:
    """``value`` as one quoted Hydra override value (a sweep folder's name holds ``=`` and ``,``)."""
    for q in ("'", '"'):
        if q not in value:
            return q + value.replace("\\", "\\\\") + q
    raise UsageError(f"{value}: a folder name with both kinds of quote cannot be passed to Hydra")


def help_cache_path(inputs: Sequence[Path]) -> Path:
    """Where the plain ``mlckpt run --help`` is kept: named by a digest of everything it is made
    from (mlckpt's and Hydra's versions, the shipped configuration, the code that picks the
    preset), so that any change makes a new one."""
    from importlib import metadata

    from mlckpt import __version__

    h = hashlib.sha256(f"{__version__}\0{metadata.version('hydra-core')}\0".encode())
    for path in inputs:
        h.update(str(path.relative_to(path.parents[1])).encode() + b"\0" + path.read_bytes() + b"\0")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "mlckpt" / f"run-help-{h.hexdigest()[:20]}.txt"


def cached_help(render: Callable[[], None], inputs: Sequence[Path]) -> None:
    """Print the help ``render`` prints (Hydra composing the configuration: half a second of
    start-up), from the cache when it holds this configuration's; a cache that cannot be written
    only costs the next --help its speed."""
    path = help_cache_path(inputs)
    try:
        sys.stdout.write(path.read_text(encoding="utf-8"))
        return
    except (OSError, UnicodeDecodeError):
        pass
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            render()
        except SystemExit as exc:  # Hydra ends its --help with sys.exit(0)
            if exc.code not in (0, None):
                sys.stdout.write(buf.getvalue())
                raise
    text = buf.getvalue()
    sys.stdout.write(text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
