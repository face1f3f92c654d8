"""The submission tree's layout, in one place: the checker walks it (checker/tree.py) and
`mlckpt place` builds it (mlckpt/cli/place_cmd.py).

    ROOT/
      trusted-keys.yaml
      {closed,open}/<org>/systems/<system>.yaml
      {closed,open}/<org>/results/<system>/<workload>/<run-id>/        a bundle folder
      {closed,open}/<org>/results/<system>/<workload>/<run-id>.tar.gz  or a packed bundle
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

DIVISIONS = ("closed", "open")
ARCHIVE_SUFFIX = ".tar.gz"
SYSTEM_SUFFIX = ".yaml"
TRUSTED_KEYS_FILE = "trusted-keys.yaml"
# Names of orgs, systems, workloads and run ids: portable, printable, no leading dot.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def system_file(division: str, org: str, system: str) -> PurePosixPath:
    return PurePosixPath(division, org, "systems", system + SYSTEM_SUFFIX)


def result_place(division: str, org: str, system: str, workload: str, run_id: str,
                 packed: bool = False) -> PurePosixPath:
    return PurePosixPath(division, org, "results", system, workload,
                         run_id + (ARCHIVE_SUFFIX if packed else ""))


def org_name(submitter: str) -> str:
    """An organisation's folder name from its display name: ``Example Org`` -> ``example-org``."""
    return re.sub(r"[^a-z0-9._+]+", "-", submitter.lower()).strip("-._+")
