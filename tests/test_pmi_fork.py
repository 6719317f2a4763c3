"""A broker forked by the local launcher closes every PMI server end it inherited, in one call.

`SocketPmiServer(fd_floor=F)` keeps its server ends at descriptors ≥ F, so that a child made by a
bare fork closes them all with `close_in_child` (close_range), whatever the size, rather than one
close per rank. Each test forks at most SIZE children and reaps each by PID.
"""

from __future__ import annotations

import os

from tbon.overlay.launch.local import _fd_floor
from tbon.overlay.launch.pmi_sockets import SocketPmiServer

SIZE = 4  # children forked per test


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _fork_ranks(server: SocketPmiServer) -> dict[int, int]:
    """Fork one child per rank as the launcher does; each exits 0 only if, after close_in_child,
    its own client end is open and no server end (its own or an earlier rank's) is."""
    pids = {}
    for rank in range(server.size):
        client = server.make_pair(rank)
        server_fds = [sock.fileno() for sock in server.fileobjs()]
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            code = 1
            try:
                server.close_in_child(keep=client.fileno())
                ok = _is_open(client.fileno()) and not any(map(_is_open, server_fds))
                code = 0 if ok else 3
            finally:
                os._exit(code)
        client.close()
        pids[rank] = pid
    return pids


def _exit_codes(pids: dict[int, int]) -> dict[int, int]:
    return {rank: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for rank, pid in pids.items()}


def test_server_ends_sit_above_the_floor_and_a_child_closes_them_all() -> None:
    floor = _fd_floor(SIZE)
    assert floor is not None
    with SocketPmiServer(SIZE, fd_floor=floor) as server:
        codes = _exit_codes(_fork_ranks(server))
        assert all(sock.fileno() >= floor for sock in server.fileobjs())
        # The launcher's own ends are untouched by what the children closed.
        assert all(_is_open(sock.fileno()) for sock in server.fileobjs())
    assert codes == dict.fromkeys(range(SIZE), 0)


def test_every_pair_made_before_the_first_fork_and_each_child_keeps_only_its_own() -> None:
    """The launcher makes every connection before it forks (its loop between forks then writes
    almost nothing): each child closes the server ends and every other rank's client end, so a
    child's exit is seen as EOF on its own server end, whoever else still runs."""
    floor = _fd_floor(SIZE)
    assert floor is not None
    with SocketPmiServer(SIZE, fd_floor=floor) as server:
        assert server.floored
        clients = [server.make_pair(rank) for rank in range(SIZE)]
        assert all(sock.fileno() >= floor for sock in clients)
        inherited = [sock.fileno() for sock in server.fileobjs() + clients]
        done_r, done_w = os.pipe()  # the children wait on it, so that all run at once
        pids = {}
        for rank in range(SIZE):
            pid = os.fork()
            if pid == 0:  # child: never return into pytest
                code = 1
                try:
                    mine = clients[rank].fileno()
                    server.close_in_child(keep=mine)
                    others = [fd for fd in inherited if fd != mine]
                    code = 0 if _is_open(mine) and not any(map(_is_open, others)) else 3
                    if rank > 0:
                        os.read(done_r, 1)  # rank 0 exits first; the others hold on
                finally:
                    os._exit(code)
            pids[rank] = pid
        for client in clients:
            client.close()
        first = {0: os.waitstatus_to_exitcode(os.waitpid(pids.pop(0), 0)[1])}
        try:
            # Rank 0 has gone while the others live: its server end reads EOF.
            ends = server.fileobjs()
            ends[0].setblocking(True)
            ends[0].settimeout(30)
            assert ends[0].recv(1) == b""
        finally:
            os.write(done_w, b"x" * SIZE)
            codes = first | _exit_codes(pids)
            os.close(done_r)
            os.close(done_w)
    assert codes == dict.fromkeys(range(SIZE), 0)


def test_without_a_floor_a_child_closes_them_one_by_one() -> None:
    with SocketPmiServer(SIZE) as server:
        codes = _exit_codes(_fork_ranks(server))
    assert codes == dict.fromkeys(range(SIZE), 0)


def test_no_floor_when_the_descriptor_limit_leaves_no_room() -> None:
    assert _fd_floor(10**9) is None
