"""`mlckpt describe-system [FOLDER] [--out FILE]`: draft a system description from what this host
measures, for the vendor to complete (the file `mlckpt run system=FILE` takes)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mlckpt.errors import ExitStatus, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("describe-system", help="draft a system description from this host's facts",
                       description="Write a system description (YAML) filled with what this host "
                       "measures for the checkpoint FOLDER's filesystem, marked COMPLETE where only "
                       "the vendor knows; `mlckpt run system=FILE` takes it once completed.")
    p.add_argument("folder", nargs="?", default=".", type=Path, help="the checkpoint folder (default: .)")
    p.add_argument("--out", type=Path, default=None, help="write here (refuses to overwrite); default stdout")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from mlckpt import strict
    from mlckpt.host.description import draft_description
    from mlckpt.host.facts import existing_ancestor, host_facts
    from mlckpt.rules.engine import DEFAULT_RULES_VERSION
    from mlckpt.schemas import first_error

    facts = host_facts(args.folder)
    st = os.statvfs(existing_ancestor(args.folder))
    try:
        product = Path("/sys/class/dmi/id/product_name").read_text().strip() or None
    except OSError:
        product = None
    text = draft_description(facts, st.f_blocks * st.f_frsize, product)
    problem = first_error(strict.loads_yaml(text), "system-description", DEFAULT_RULES_VERSION)
    if problem:  # a defect of the draft, never of the input
        raise AssertionError(f"the draft does not match its schema: {problem}")
    if args.out is None:
        print(text, end="")
        return ExitStatus.OK
    try:
        with open(args.out, "x") as fh:
            fh.write(text)
    except FileExistsError:
        raise UsageError(f"--out {args.out}: exists; not overwritten") from None
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
    # system= alone means the workload's own (closed-size) configuration: the laptop preset is the
    # run that fits any host, the plan the way to see what a closed run needs first.
    print(f"wrote {args.out}: replace the values marked COMPLETE (a run refuses them until then), then\n"
          f"  mlckpt run preset=laptop system={args.out} checkpoint.folder=FOLDER   # small, your storage\n"
          f"  mlckpt plan division=closed system={args.out} hosts=N accelerator=NAME   # a closed run")
    return ExitStatus.OK
