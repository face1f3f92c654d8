"""Imported first by the command line, before anything loads numpy: one BLAS thread per process,
and a rank that a Ctrl-C ends by the signal.

numpy's OpenBLAS starts one thread per core when it loads, and they spin. On the 16-core device
that cost 2.2 s of CPU for `import numpy` (0.25 s with one thread), and every rank pays it at its
start: 16 ranks burnt 26 s of CPU just starting (benchmarks/README.md, "Ranks on the 16-core
device").  mlckpt does no linear algebra.  A value the user set is kept; the ranks inherit these
through mpiexec.
"""

from __future__ import annotations

import os
import signal
from collections.abc import MutableMapping

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def one_blas_thread(environ: MutableMapping[str, str] = os.environ) -> None:
    for var in BLAS_THREAD_VARS:
        environ.setdefault(var, "1")


# A rank started by a launcher (its variables set) is ended by the terminal's Ctrl-C at once, by the
# signal, even while it is still importing: a KeyboardInterrupt there surfaced as "internal error:
# AttributeError" or "mlckpt: interrupted" from every rank. The launcher says what happened, once;
# each host's guardian removes the run's files (mlckpt/run/runner.py sets the same once MPI runs).
LAUNCHER_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


def rank_ends_by_signal(environ: MutableMapping[str, str] = os.environ) -> bool:
    if any(v in environ for v in LAUNCHER_VARS):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        return True
    return False


one_blas_thread()
rank_ends_by_signal()
