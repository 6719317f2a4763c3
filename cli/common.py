"""What several commands share: the URI argument, durations, where progress goes (a line on a
terminal while a command waits: overlay/connectors/patience.py decides when), and the one retry
of a request that a healing tree could not route."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tbon.limits import check_duration
from tbon.overlay.parse.duration import parse_duration

if TYPE_CHECKING:
    from rich.status import Status

    from tbon.overlay.connectors.client import Client
    from tbon.overlay.state.statesview import RankStates

URI_HELP = (
    "The instance to talk to (local://PATH or ssh://..., or a comma-separated list of them, "
    "the first that answers used); default: $TBON_URI."
)


def duration(text: str | None, what: str) -> float | None:
    return None if text is None else check_duration(parse_duration(text, what), what)


def limit(text: str | None, what: str = "--timeout") -> float | None:
    """A --timeout as a limit on waiting: the default answer wait if not given, none if 0."""
    from tbon.overlay.connectors.patience import limit_of

    return limit_of(duration(text, what))


COMMAND = "tbon"
"""`tbon NAME`, as cli/app.py's run names the command that runs: what progress lines start with."""


class TerminalLine:
    """One line on stderr, rewritten in place while a command waits and wiped once it is
    over (or before anything else is written: `clear`)."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, text: str) -> None:
        if text:
            sys.stderr.write(f"\r{COMMAND}: {text}\x1b[K")
            self.shown = True
        elif self.shown:
            sys.stderr.write("\r\x1b[K")
            self.shown = False
        else:
            return
        sys.stderr.flush()

    def clear(self) -> None:
        self("")


HARD_END = 1.0
"""Seconds after a signal's Signalled was raised before the command ends without it: Python
ignores an exception raised in some callbacks (a weakref's, as the import system uses), and
a signal that comes just then would otherwise be lost."""


def end_by_signal(signum: int) -> NoReturn:
    """End the command for signal `signum` (from its handler): Signalled, which cli/app.py
    turns into 128+N once every `finally` has run; and, should Python swallow it, the same end
    HARD_END seconds later, without those (what a command owns in the instance its brokers end
    when its connection closes)."""
    from tbon.errors import Signalled

    def hard(_signum: int, _frame: object) -> None:
        if signum != signal.SIGINT:
            os.write(2, f"{COMMAND}: ended by {signal.Signals(signum).name}\n".encode())
        os._exit(128 + signum)

    signal.signal(signal.SIGALRM, hard)
    signal.setitimer(signal.ITIMER_REAL, HARD_END)
    raise Signalled(signum)


def open_client(uri: str | None) -> Client:
    """A client for `uri` (default: $TBON_URI) that, at a terminal, says whom it waits for."""
    from tbon.overlay.connectors.client import connect

    return connect(uri, TerminalLine() if interactive() else None)


def print_json(value: Any) -> None:
    """One line of JSON on stdout, flushed (as typer.echo wrote it: JSON has no raw escape
    code for it to strip, and this module loads without Typer, for `tbon exec`)."""
    sys.stdout.write(json.dumps(value, indent=None, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def python_module(name: str) -> list[str]:
    """The command that runs tbon's module `name` in this interpreter. `-P` (Python 3.11) keeps
    the working directory off sys.path, where `-m` would put it first: run from a checkout's
    root, the checkout's own tbon/ folder would hide the installed package (issue 22)."""
    return [sys.executable, "-P", "-m", name]


def interactive() -> bool:
    """Progress and colour only for a person at a terminal, never in a pipe or a batch log."""
    return sys.stderr.isatty()


HEAL_WAIT = 10.0
"""Seconds a command that got EHOSTUNREACH waits for the tree to heal, when it has no
--timeout of its own: a fostered subtree is reachable again well within a second."""
HEAL_GRACE = 1.0  # seconds past a heal.wait's own timeout before the client gives up on it

T = TypeVar("T")


def fetch_status(client: Any) -> dict[str, Any]:
    """Rank 0's status object for a command that looks ranks up by number: the entries of the
    ranks something happened to, the untouched spares made up as they are read (heldtable.py),
    read a page at a time (one, unless thousands of ranks are held) whatever the size."""
    return read_held(client)


def read_held(client: Any, timeout: float | None = None) -> dict[str, Any]:
    """Rank 0's held view, its pages asked for one after another until the last
    (status.get with `view` `held` and `start`), as one status object (heldtable.whole)."""
    from tbon.overlay.connectors.client import DEFAULT_TIMEOUT
    from tbon.overlay.state.heldtable import HeldPages

    pages = HeldPages()
    start = 0
    while True:
        page = client.rpc(
            "status.get",
            {"view": "held", "start": start},
            nodeid=0,
            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
        )
        if (status := pages.take(page)) is not None:
            return status
        start = page["next"]


StatesReader = Callable[[dict[str, Any]], "RankStates | None"]
"""Reads an update of a status stream: each rank's state once it is whole, else None."""


def watch_states(
    client: Any, tag: int, early: list[Any] | None = None
) -> tuple[int, StatesReader, RankStates]:
    """Follow each rank's state at rank 0 (the `states` stream `tag`, whose `early` updates
    came already): the first view is the states now (which ranks `tbon exec` or `tbon dmesg`
    reads), and the later ones tell of ranks lost meanwhile. One stream for both, so that rank
    0 builds and sends it once, not also for a status.get. The `states` view is a few bytes at
    any size; a broker of an older tbon, which refuses it (EINVAL), is asked for its `held`
    view (at 1024 ranks, 190 kB of entries, of which only the states are read). Returns the
    stream's tag (the held one's, from an older broker), how to read its updates, and the
    states now."""
    import errno

    from tbon.overlay.connectors.client import DEFAULT_TIMEOUT, RequestError
    from tbon.overlay.state.statesview import RankStates

    early = early if early is not None else []
    read: StatesReader = RankStates
    while True:
        reply = early.pop(0) if early else client.answer(tag, 0, DEFAULT_TIMEOUT)
        if reply.errnum == errno.EINVAL and read is RankStates:
            read = held_reader()
            tag = client.send("status.watch", {"view": "held"}, nodeid=0)
            early = []
            continue
        if reply.errnum:
            raise RequestError(reply.errnum, reply.errstr or os.strerror(reply.errnum))
        if (states := read(reply.payload)) is not None:
            return tag, read, states


def held_reader() -> StatesReader:
    """Reads a `held` view's pages (one but for thousands of ranks held) as each rank's state."""
    from tbon.overlay.state.heldtable import HeldPages
    from tbon.overlay.state.statesview import RankStates

    pages = HeldPages()

    def read(page: dict[str, Any]) -> RankStates | None:
        status = pages.take(page)
        return None if status is None else RankStates.from_status(status)

    return read


def once_healed(
    client: Any,
    attempt: Callable[[], T],
    limit: float | None = None,
    spinner: Status | None = None,
) -> T:
    """`attempt()`, and once more if it failed EHOSTUNREACH: a broker on the way was lost, and
    the ranks below it are reattaching to a live ancestor. Only requests that are safe to repeat
    (status, ping) are retried, and only once, after wait_healed: a second failure is real."""
    import errno

    from tbon.overlay.connectors.client import RequestError

    try:
        return attempt()
    except RequestError as error:
        if error.errnum != errno.EHOSTUNREACH:
            raise
    wait_healed(client, HEAL_WAIT if limit is None else limit, spinner)
    return attempt()


def wait_healed(client: Any, limit: float, spinner: Status | None = None) -> None:
    """Wait at most `limit` seconds until the broker this client talks to is attached to the
    tree again, then until rank 0 sees no rank reattaching (`heal.wait`). Any error ends the
    wait early: ENOSYS from a broker that predates healing, ETIMEDOUT, or a rank 0 that cannot
    be reached; the caller retries either way. A person at a terminal is told why it pauses
    (on the command's own `spinner`, if it shows one)."""
    from tbon.errors import TbonError
    from tbon.overlay.wire.message import ANY_RANK

    note = "waiting for the tree to heal"
    deadline = time.monotonic() + limit
    shown: Any = nullcontext()
    if spinner is not None:
        before = spinner.status
        spinner.update(note)
    elif interactive():
        from rich.console import Console

        shown = Console(stderr=True).status(note)
    try:
        with shown:
            for nodeid in (ANY_RANK, 0):  # the broker we talk to, then rank 0
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                payload = {"timeout": round(left, 3)}
                try:  # the broker answers ETIMEDOUT first; our own limit is a backstop
                    client.rpc("heal.wait", payload, nodeid, timeout=left + HEAL_GRACE, quiet=True)
                except TbonError:
                    return
    finally:
        if spinner is not None:
            spinner.update(before)
