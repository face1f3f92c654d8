"""The guardian process itself: its loop around :class:`~mlckpt.run.guardian.state.GuardianState`
(the decisions, pure), watching its host's ranks' life pipes, its control socket to the leader and
its links to the other hosts' guardians (see the package docstring for what it does when a rank
or a host dies)."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from typing import Any

from mlckpt.run.guardian import link as guardlink
from mlckpt.run.guardian.link import CONNECT_S, CONTACT_S, Contact, Link
from mlckpt.run.guardian.processes import comm_of, exit_how, realtime
from mlckpt.run.guardian.state import GuardianState, ranks_phrase

SETTLE_S = 5.0  # how long a guardian lets this host's other ranks end before it sweeps
PROXY_GRACE_S = 2.0  # how long a cut-off spoke lets its MPI proxy forward its line and end by itself
PROXIES = ("hydra_pmi_proxy", "orted", "prted")  # MPI launchers' per-host daemons a spoke may stop
STOPPING = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)  # scancel, a time limit, Slurm's --signal


class Watcher:
    """The guardian's file descriptors in one poller: the control socket, this host's ranks'
    pidfds and life pipes, the hub's listening socket and the links.  Who died first is told by
    the *life pipes*: each rank holds the write end of a pipe whose read end the guardian opens
    through /proc; it reports end of file the moment the rank's files are closed as it dies,
    before mpiexec can even notice and kill the others (pidfds only fire once a process is
    completely gone, which for a rank with a large address space can come after mpiexec has killed
    the rest).  The control socket is the leader's life pipe."""

    def __init__(self, ctl: socket.socket, parent: int, listener: socket.socket | None) -> None:
        self.ctl, self.listener = ctl, listener
        self.state = GuardianState(hub=listener is not None, leader_pid=parent)
        if listener is not None:
            self.state.pids[0] = parent
        self.bye: set[str] = set()  # peers that said goodbye before closing
        self.token = ""  # the job's secret: a hello without it is not one of this job's guardians
        self.early: list[tuple[Link, dict[str, object]]] = []
        self.orphan_at = 0.0  # when this host's ranks, still running after the job failed, are stopped
        self.poller = select.poll()
        self.poller.register(ctl.fileno(), select.POLLIN)
        if listener is not None:
            listener.setblocking(False)
            self.poller.register(listener.fileno(), select.POLLIN)
        self.life: dict[int, int] = {}  # life-pipe fd -> rank
        self.pidfds: dict[int, tuple[int, int]] = {}  # pidfd -> (rank, pid)
        self.links: dict[int, Link] = {}  # socket fd -> link (peer "" until its hello)
        self.contact = Contact()
        self.buf = bytearray()
        self.expect: tuple[set[str], float] | None = None
        self.leader_gone = False
        try:
            pfd = os.pidfd_open(parent)
            self.pidfds[pfd] = (-1, parent)  # the leader's rank is known once its notes arrive
            self.poller.register(pfd, select.POLLIN)
        except OSError:
            pass

    # -- this host's ranks

    def watch(self, rank: int, pid: int, life_fd: int | None) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            self.died([rank])
            return
        except OSError:  # no pidfds here (old kernel): the life pipe alone will do
            pass
        else:
            self.pidfds[fd] = (rank, pid)
            self.poller.register(fd, select.POLLIN)
        if life_fd is not None:
            try:
                lfd = os.open(f"/proc/{pid}/fd/{life_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return  # the pidfd alone will do (if there is one)
            self.life[lfd] = rank
            self.poller.register(lfd, select.POLLIN)

    def gone(self, fd: int) -> int | None:
        """A pidfd fired: that process is completely gone.  Returns its rank if it has no life pipe."""
        rank, pid = self.pidfds.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        if rank < 0:  # the leader
            rank = self.state.leader
            self.leader_gone = True
        self.state.how[rank] = exit_how(pid)
        return rank if rank not in self.life.values() else None

    def drop_life(self, fd: int) -> int:
        rank = self.life.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        return rank

    def died(self, ranks: list[int]) -> None:
        if not self.state.ended(sorted(set(ranks))):
            return
        report = self.state.report_msg()
        if self.state.hub:
            self.broadcast({"first": report})
        else:
            self.broadcast(report)

    def kill(self, leader_only: bool = False) -> None:
        """SIGKILL this host's ranks still alive (or only the leader), through their pidfds: a pid
        that ended and was reused by another process is never signalled."""
        for fd, (rank, _pid) in list(self.pidfds.items()):
            if rank < 0 or not leader_only:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass

    def stop_host(self, proxy: int) -> None:
        """A spoke cut off from the job: say so (if it is the one to), then stop this host's ranks
        and their MPI proxy (only a known launcher daemon, never anything else)."""
        st, ranks = self.state, sorted(r for r in self.state.pids if r >= 0)
        try:
            pfd: int | None = os.pidfd_open(proxy)  # held: the name checked is the process signalled
        except OSError:
            pfd = None
        comm = comm_of(proxy) if pfd is not None else ""
        st.stopped = ranks_phrase(ranks) + (f" and their MPI proxy ({comm})" if comm in PROXIES else "")
        self.kill()
        if st.printer:  # while the proxy is there to forward it
            self.say(st.headline() + "; removing this run's files")
        # It may still reach mpiexec and end by itself; if not, it goes.
        if pfd is not None and comm in PROXIES and not select.select([pfd], [], [], PROXY_GRACE_S)[0]:
            try:
                signal.pidfd_send_signal(pfd, signal.SIGKILL)
            except OSError:
                pass
        if pfd is not None:
            os.close(pfd)

    # -- the leader's notes

    def read_control(self) -> None:
        try:
            data = self.ctl.recv(1 << 16)
        except OSError:
            data = b""
        if not data:  # the leader is gone (or said goodbye and closed)
            self.poller.unregister(self.ctl.fileno())
            self.leader_gone = True
            return
        for msg in guardlink.lines(self.buf, data):
            for rank, pid, life_fd in self.state.handle(msg):
                self.watch(rank, pid, life_fd)
            if "hub" in msg:
                self.link_to_hub(msg["hub"], str(msg.get("token", "")))
            if "expect" in msg:
                self.token = str(msg.get("token", ""))
                early, self.early = self.early, []
                for link, hello in early:  # hellos that arrived before rank 0 told the secret
                    if link.fileno() in self.links:
                        self.on_message(link, hello)
                self.expect = ({str(h) for h in msg["expect"]}, time.monotonic() + CONNECT_S + 2)
                self.check_expect()

    def answer(self, **msg: object) -> None:
        try:
            self.ctl.sendall(guardlink.encode(msg))
        except OSError:
            pass

    # -- links

    def link_to_hub(self, addresses: list[list[Any]], token: str) -> None:
        got = guardlink.connect([(str(a), int(p)) for a, p in addresses])
        if isinstance(got, str):
            self.answer(linked=False, why=got)
            return
        got.send({"hello": self.state.host, "token": token})
        self.add_link(got, "hub")
        self.answer(linked=True)

    def add_link(self, link: Link, peer: str) -> None:
        link.peer = peer
        self.links[link.fileno()] = link
        self.poller.register(link.fileno(), select.POLLIN)
        if peer:
            self.contact.add(peer, time.monotonic())

    def drop_link(self, link: Link) -> None:
        self.links.pop(link.fileno(), None)
        self.poller.unregister(link.fileno())
        self.contact.drop(link.peer)
        link.close()

    def accept(self) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        self.add_link(Link(sock), "")

    def peers(self) -> list[Link]:
        return [link for link in self.links.values() if link.peer]

    def broadcast(self, msg: dict[str, object]) -> None:
        for link in self.peers():
            link.send(msg)

    def on_link(self, link: Link) -> None:
        msgs = link.receive()
        if msgs is None:
            # Closed: a host that goes down closes nothing (silence loses it); a close means only
            # its guardian ended, no reason to end a job that may be healthy.  Watch on without it.
            self.drop_link(link)
            return
        if link.peer:
            self.contact.heard[link.peer] = time.monotonic()
        for msg in msgs:
            if link.fileno() not in self.links:  # dropped by an earlier message of this batch
                break
            self.on_message(link, msg)

    def on_message(self, link: Link, msg: dict[str, Any]) -> None:
        st = self.state
        if "hello" in msg and not link.peer and not self.token:
            self.early.append((link, msg))
        elif "hello" in msg and not link.peer:
            host = st.hello_from(msg, self.token, {p.peer for p in self.peers()})
            if host is None:
                self.drop_link(link)  # a stranger on the port (or a second hello): never a peer
                return
            link.peer = host
            self.contact.add(host, time.monotonic())
            self.check_expect()
        elif "bye" in msg:
            self.bye.add(link.peer)
        elif "dead" in msg and st.hub and st.arbitrate(msg):
            self.broadcast({"first": msg})
        elif "first" in msg and not st.hub:
            st.verdict(msg["first"])
        elif "end" in msg and not st.hub:
            st.job_end = str(msg["end"])
            if st.job_end != "clean":  # the job failed: this host's ranks have CONTACT_S to end
                self.orphan_at = time.monotonic() + CONTACT_S

    def check_expect(self) -> None:
        if self.expect is None:
            return
        hosts, until = self.expect
        have = {link.peer for link in self.peers()}
        if hosts <= have or time.monotonic() >= until:
            self.answer(linked=sorted(have & hosts))
            self.expect = None

    def lose(self, peers: list[str]) -> None:
        st = self.state
        if st.quiet or st.said_goodbye or not peers:
            return
        new = [p for p in peers if p not in st.lost]
        if not new:
            return
        st.lost.extend(new)
        if st.hub:  # end the job: mpiexec ends every rank it can reach once rank 0 is gone
            self.broadcast({"first": {"host": ",".join(new), "line": st.what()}})  # (no news, then)
            self.kill(leader_only=True)

    def tick(self) -> None:
        now = time.monotonic()
        due = set(self.contact.due(now))
        for link in self.peers():
            if link.peer in due:
                link.send({"hb": 1})
                self.contact.sent[link.peer] = now
        self.lose(self.contact.lost(now))
        self.check_expect()

    # -- the loop

    def poll_once(self, timeout_s: float) -> None:
        batch: list[int] = []
        for fd, _ev in self.poller.poll(max(1, int(timeout_s * 1000))):
            if fd == self.ctl.fileno():
                self.read_control()
                if self.leader_gone:
                    batch.append(self.state.leader)
            elif self.listener is not None and fd == self.listener.fileno():
                self.accept()
            elif fd in self.links:
                self.on_link(self.links[fd])
            elif fd in self.life:
                batch.append(self.drop_life(fd))
            elif fd in self.pidfds:
                rank = self.gone(fd)
                if rank is not None:
                    batch.append(rank)
        self.died(batch)
        self.tick()

    @property
    def orphaned(self) -> bool:
        """The hub said the job failed, and this host's ranks are still running CONTACT_S later
        (mpiexec could not reach them: their proxy died, say)."""
        return bool(self.orphan_at) and time.monotonic() >= self.orphan_at

    def run_until_leader_gone(self) -> None:
        while not (self.leader_gone or self.orphaned or (self.state.lost and not self.state.hub)):
            self.poll_once(min(self.contact.wait_s(time.monotonic()), 1.0))

    def await_verdict(self) -> None:
        """A spoke whose rank died first waits for the hub's word (at most until the hub is lost)."""
        while self.state.waiting_for_verdict:
            if not self.peers():  # no hub to ask (never linked, or gone): this host's line it is
                self.state.confirmed = True
                break
            self.poll_once(min(self.contact.wait_s(time.monotonic()), 0.2))

    def settle(self, seconds: float) -> None:
        """Let this host's other ranks end (mpiexec kills them): nothing writes during the sweep."""
        until = time.monotonic() + seconds
        while self.pidfds and time.monotonic() < until:
            for fd, _ev in self.poller.poll(100):
                if fd in self.pidfds:
                    self.gone(fd)
                elif fd in self.life:
                    self.drop_life(fd)

    def say(self, line: str) -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError:
            pass

    def finish(self) -> None:
        """The end without the leader's goodbye: the line if it is ours, and the sweep.  On several
        hosts the line goes out at once: MPICH's mpiexec may tear down this host's proxy (which
        forwards it) as soon as another host reports its side of the failure; the account of the
        cleanup follows on a line of its own.  On one host the proxy waits for it: one line."""
        st = self.state
        early = st.printer and (not st.hub or bool(self.peers() or st.lost or self.bye))  # several hosts
        if early and not st.stopped:  # (a spoke that stopped its host said it already)
            self.say(st.headline() + "; removing this run's files")
        realtime(False)  # cleanup is ordinary work
        self.settle(SETTLE_S)
        if st.printer:
            self.say(f"mlckpt: cleanup: {st.swept().removeprefix('; ')}" if early
                     else st.report())
        else:
            st.swept()
        for link in self.peers():
            link.send({"end": "failed"} if st.hub else {"bye": 1})


def guardian_main(ctl: socket.socket, parent: int, proxy: int, listener: socket.socket | None) -> None:
    """The guardian process (see the module docstring)."""
    os.setsid()
    # It outlives the ranks to clean up: Ctrl-C, a hang-up, a cancelled step's signals are theirs.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, *STOPPING):
        signal.signal(sig, signal.SIG_IGN)
    # Who died first is known only if it wakes the moment a life pipe closes, before the proxy kills
    # the rest: a real-time priority (where allowed) preempts them; it only sleeps in poll.
    realtime(True)
    low = 3
    for fd in sorted({ctl.fileno(), *([listener.fileno()] if listener is not None else [])}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)
    w = Watcher(ctl, parent, listener)
    for sig in STOPPING:  # still not fatal: noted, for the line
        signal.signal(sig, lambda n, _: setattr(w.state, "cancelled", signal.Signals(n).name))
    w.run_until_leader_gone()
    if w.state.said_goodbye:  # the leader finished (or rank 0 reported a failure itself)
        how = str(w.state.info.get("end"))
        w.broadcast({"end": how} if w.state.hub else {"bye": 1})
        return
    if (w.state.lost and not w.state.hub) or w.orphaned:
        w.stop_host(proxy)
    w.await_verdict()
    w.finish()
