"""The runner: the only package that imports mpi4py.

``runner`` holds the phase sequence, on every rank; the rooms around it:

- ``phases/``: configure → gates → calibrate → writes → reads → outcome → publish (and stalls);
- ``storage/``: the run's folders and their lock, the object store, cleanup;
- ``guardian/``: every host's guardian process, which names a killed rank, notices a lost host
  and sweeps the run's files after either;
- ``features/``: GPU-resident state, a witnessed run, split invocations;
- ``collective`` (agreement, the op watch, the timed op), ``console`` (what rank 0 shows),
  ``faults`` (the seam where tests change the world) and ``site_mpi`` (the site's MPI library
  and launcher; importable without MPI, the command line asks it before launching).
"""
