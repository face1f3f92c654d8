"""mlckpt-check: validates signed result bundles and publishes leaderboard tables.

Imports mlckpt's pure parts (workload, sizing, rules, metrics, schemas) and bundle verification,
never its MPI or I/O engine.
"""

# A submission tree's trust files, at its root: the defaults of --trusted-keys and
# --trusted-witnesses (here, so that the command line names them without loading the checker).
from mlckpt.bundle.tree import TRUSTED_KEYS_FILE  # noqa: F401  (the tree's layout)

TRUSTED_WITNESSES_FILE = "trusted-witnesses.yaml"  # WITNESS-TRUSTED; not checked without it
BUNDLE_BUDGET_S = 60.0  # mlckpt-check --bundle-budget: a 1,024-rank, 20-op bundle checks in about a second
# mlckpt-check --max-records: the records of one bundle the checker holds at once.  It holds every
# record (about 5.6 KiB each, parsed): 163,840 records peaked at 950 MiB here, so 131,072 keep one
# bundle's check under 1 GiB (benchmarks/check_large.py; docs: Hostile and large bundles).
MAX_RECORDS = 131_072
