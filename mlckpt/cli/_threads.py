"""Imported first by the command line, before anything loads numpy: one BLAS thread per process.

numpy's OpenBLAS starts one thread per core when it loads, and they spin. On the 16-core device
that cost 2.2 s of CPU for `import numpy` (0.25 s with one thread), and every rank pays it at its
start: 16 ranks burnt 26 s of CPU just starting (benchmarks/README.md, "Ranks on the 16-core
device").  mlckpt does no linear algebra.  A value the user set is kept; the ranks inherit these
through mpiexec.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def one_blas_thread(environ: MutableMapping[str, str] = os.environ) -> None:
    for var in BLAS_THREAD_VARS:
        environ.setdefault(var, "1")


one_blas_thread()
