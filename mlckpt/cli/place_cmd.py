"""`mlckpt place BUNDLE... ROOT`: put bundles where a submission tree wants it, so that
`mlckpt-check ROOT` judges it: its system description beside it (from the bundle's own copy),
its trusted key where the tree has none, and the next command.

The bundle is verified first (signature and digests) and copied, never moved; nothing in the tree
is overwritten: a different system description or a bundle already there is refused.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlckpt.bundle.tree import NAME, TRUSTED_KEYS_FILE, org_name, result_place, system_file
from mlckpt.errors import BundleIntegrityError, ExitStatus, IntegrityError, UsageError

if TYPE_CHECKING:  # the bundle's and the rules' libraries load when a bundle is placed, not for --help
    from mlckpt.bundle.models import VerifiedBundle


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "place", help="put bundles into a submission tree for mlckpt-check",
        description="Verify each BUNDLE and copy it into the submission tree ROOT at "
        "{closed,open}/ORG/results/SYSTEM/WORKLOAD/RUN-ID, with its system description under "
        "ORG/systems/ and, where ROOT has no trusted-keys.yaml, one that trusts the bundle's key.")
    p.add_argument("paths", type=Path, nargs="+", metavar="BUNDLE... ROOT")
    p.add_argument("--org", default=None, help="the organisation's folder (default: from the system "
                   "description's submitter, e.g. 'Example Org' -> example-org)")
    p.add_argument("--pack", action="store_true", help="place it as RUN-ID.tar.gz (mlckpt pack)")
    p.set_defaults(func=cmd_place)


def cmd_place(args: argparse.Namespace) -> int:
    from mlckpt import bundle
    if len(args.paths) < 2:
        raise UsageError("mlckpt place: give one or more bundles, then the submission tree ROOT")
    *sources, root = args.paths
    planned = [_plan(source, root, args.org, args.pack) for source in sources]  # all, before any copy
    places = [p.place for p in planned]
    if len(set(places)) < len(places):
        raise UsageError("mlckpt place: two of the bundles are one run (the same place in the tree)")
    for p in planned:
        _system_file(p.system, p.description, write=True)
        p.place.parent.mkdir(parents=True, exist_ok=True)
        if args.pack:
            bundle.pack(p.source, p.place)
        else:
            shutil.copytree(p.source, p.place, symlinks=True)
        print(f"placed: {p.place}")
        print(f"system: {p.system}")
        _trust(root, p.org, p.verified)
    print(f"next: mlckpt-check {root}")
    return ExitStatus.OK


@dataclass(frozen=True)
class Planned:
    """Where one verified bundle goes, and what goes beside it."""

    source: Path
    verified: VerifiedBundle
    org: str
    description: dict[str, object]
    place: Path
    system: Path


def _plan(source: Path, root: Path, org_given: str | None, pack: bool) -> Planned:
    """Everything that can refuse a bundle, before anything is written."""
    from mlckpt import bundle
    from mlckpt.rules import placeholders
    if not (source / bundle.SIGNATURE_FILE).is_file():
        raise UsageError(f"{source}: not a bundle folder (it holds no {bundle.SIGNATURE_FILE})")
    try:
        verified = bundle.verify_bundle(source)
    except BundleIntegrityError as err:
        raise IntegrityError(err.summary) from None
    run = _document(source, "run.json", verified)
    description = (_document(source, "system.json", verified) or {}).get("description")
    if not isinstance(description, dict):
        raise UsageError(f"{source}: the run had no system description (system=FILE), and a submission "
                         "tree needs one: `mlckpt describe-system` drafts it; run again with system=FILE",
                         key="system")
    left = placeholders(description)
    if left:
        raise UsageError(f"{source}: its system description still holds {len(left)} COMPLETE: "
                         f"placeholder(s), first {left[0][0]}; complete them and run again", key="system")
    org = org_given or org_name(str(description.get("submitter", "")))
    if not NAME.fullmatch(org):
        raise UsageError(f"--org: {org!r} is no folder name (letters, digits, '.', '_', '+', '-')",
                         key="--org")
    place = root / result_place(run["division"], org, description["system_name"], run["workload"],
                                run.get("name") or run["run_id"], pack)
    if place.exists():
        raise UsageError(f"{place}: already in the tree; remove it first to place this bundle again")
    system = root / system_file(run["division"], org, description["system_name"])
    _system_file(system, description, write=False)
    return Planned(source, verified, org, description, place, system)


def _document(folder: Path, name: str, verified: Any) -> Any:
    from mlckpt import bundle

    return bundle.parse_document(name, bundle.read_document(folder, name, verified))


def _system_file(path: Path, description: dict[str, object], write: bool) -> None:
    """The tree's copy of the description: written where absent; where present it must be the
    same description (the checker requires the bundle's embedded copy and the tree's equal)."""
    import yaml

    if path.exists():
        if yaml.safe_load(path.read_text()) != description:
            raise UsageError(f"{path}: differs from the system description the bundle embeds (the "
                             "checker requires them equal); name the system differently or place it "
                             "in another tree", key="system")
        return
    if not write:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# The system description the run embedded (mlckpt place).\n"
                    + yaml.safe_dump(description, sort_keys=False))


def _trust(root: Path, org: str, verified: VerifiedBundle) -> None:
    """A tree without trusted keys gets one trusting the bundle's key for ``org`` (a committee
    uses its own); a tree with one is never edited: the entry it lacks is printed."""
    from mlckpt import bundle

    path = root / TRUSTED_KEYS_FILE
    entry = f'  {org}: ["{verified.public_key}"]'
    if not path.exists():
        path.write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n{entry}\n')
        print(f"trusted keys: {path} (new: it trusts the key that signed this bundle for {org}; a "
              "committee checks with its own)")
        return
    trusted = bundle.TrustedKeys.load(path)
    if trusted.org_for(verified.keyid) != org:
        print(f"trusted keys: {path} does not trust this bundle's key for {org}; add under "
              f"organizations:\n{entry}")
