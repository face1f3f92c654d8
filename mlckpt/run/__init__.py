"""The runner: the only package that imports mpi4py.

``runner`` holds the phase sequence; ``configure`` (the first phase), ``gates`` (importable
without MPI), ``collective`` (agreement, the op watch, timed ops), ``writes``, ``reads``,
``guardian``, ``cleanup``, ``publish``, ``console`` and ``faults`` (the test seam) hold the parts.
"""
