"""Every host's guardian: a helper process that names a rank killed mid-run, notices a host lost
from the job, and cleans up after either.

When a rank dies (SIGKILL, the OOM killer, a crash), mpiexec kills every other rank at once, so no
rank can say what happened nor remove the run's files; when a host drops off the network, its ranks
spin in MPI for ever while mpiexec has long returned.  So each host's first rank (its *leader*, by
the launcher's local rank) forks, before MPI starts, a small process in its own session (mpiexec's
cleanup signals the ranks' process groups, not it).  The leader tells it over a socket pair its
host's ranks' pids and life pipes, this run's planned paths and the step in progress.  Rank 0's
guardian is the *hub*; every other host's guardian connects to it before any I/O with the job's
secret and both ends exchange heartbeats (:mod:`~mlckpt.run.guardian.link`).  Only silence loses a
host: a closed connection means a guardian ended while its host still answers, and a healthy job
is not ended for that.

* A rank of this host dies first: the guardian reports it to the hub, which decides which report
  was first and tells every guardian; the guardian of the host where it happened prints the one
  line (rank, host, op, file), removes this run's files and exits.  Its stdout and stderr are its
  leader's, so mpiexec forwards the line.  On one host the proxy waits for it (MPICH's proxy ends
  once every copy of its ranks' output pipes is closed), so the line comes after the sweep and
  says what was removed; on several hosts mpiexec may tear the proxy down at once, so the line
  goes out first and the account of the sweep follows on its own line.
* A spoke no longer hears the hub (``CONTACT_S``): it kills its host's ranks and their MPI proxy,
  removes what it can reach of this run, says so and exits, so nothing of the run keeps running on
  a cut-off host.  The hub no longer hears a spoke: it ends the job (kills rank 0, so mpiexec ends
  every rank it can reach) and prints a line naming the lost host.
* The hub says the job failed, and this host's ranks are still running ``CONTACT_S`` later (mpiexec
  could not reach them): the spoke stops them and their proxy, quietly (the line was printed).

Only one guardian prints, and the shared checkpoint folder is swept by that one only (the others
sweep what lies on their own host); :class:`~mlckpt.run.guardian.state.GuardianState` holds those
decisions, unit tested without processes; the loop of :mod:`~mlckpt.run.guardian.process` is the
thin part around it.

Modules: ``handle`` (the leader's end: start the guardian, talk to it), ``process`` (the guardian
process), ``state`` (what a guardian knows and decides, pure), ``link`` (the guardians' links
across hosts), ``hosts`` (the runner linking its hosts' guardians before any I/O), ``processes``
(small readings of processes).
"""

from mlckpt.run.guardian.handle import Guardian

__all__ = ["Guardian"]
