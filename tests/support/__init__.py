"""What the tests share, none of it a test: the paths of the repository, the installed commands and
the honest test system (``cli``), and the beds that start real things (a Slurm node, an S3 store, a
witness, fake hosts, a browser, a tenant on the disk), the forger's tools and the structural
fuzzer.  Test modules import from here, never from each other."""
