"""What the tests share, none of it a test: the paths of the repository, the installed commands and
the honest test system (``cli``), the beds that start real things (a Slurm node, a witness, a
browser) and the forger's tools.  Test modules import from here, never from each other; the
equipment the benchmarks use too (an S3 store, simulated hosts, a tenant on the disk, the
structural fuzzer) is the lab's, in benchmarks/lab/."""
