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


def test_without_a_floor_a_child_closes_them_one_by_one() -> None:
    with SocketPmiServer(SIZE) as server:
        codes = _exit_codes(_fork_ranks(server))
    assert codes == dict.fromkeys(range(SIZE), 0)


def test_no_floor_when_the_descriptor_limit_leaves_no_room() -> None:
    assert _fd_floor(10**9) is None
