"""mlckpt-check: validates signed result bundles and publishes leaderboard tables.

Imports mlckpt's pure parts (workload, sizing, rules, metrics, schemas) and bundle verification,
never its MPI or I/O engine.
"""

# A submission tree's trust files, at its root: the defaults of --trusted-keys and
# --trusted-witnesses (here, so that the command line names them without loading the checker).
from mlckpt.bundle.tree import TRUSTED_KEYS_FILE  # noqa: F401  (the tree's layout)

TRUSTED_WITNESSES_FILE = "trusted-witnesses.yaml"  # WITNESS-TRUSTED; not checked without it
BUNDLE_BUDGET_S = 60.0  # mlckpt-check --bundle-budget: a 1,024-rank, 20-op bundle checks in about a second
