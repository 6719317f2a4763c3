"""The orphan guard: however a broker ends, SIGKILL included, its `tbon exec` jobs end with it.

Jobs run in sessions of their own (so that a signal reaches a shell's children too), so nothing
of the broker's death reaches them by itself. One thing the kernel does whenever a process dies,
however it dies, is close its files. The guard is a small shell process, started with the
broker's first job and kept, that reads a pipe only the broker writes to: `+ PID` for each job
started, `- PID` for each job about to be reaped. When the pipe ends, the broker is gone: the
guard kills every job still listed (its process group, and the process itself should it have
left that group), then exits.

This takes the place of a wrapper exec'd in front of every job (util-linux `setpriv --pdeathsig
KILL`), which cost each job a second exec: a second run of the dynamic loader, as much CPU as a
short command itself. The guard costs one process per broker that has run a job, and a line of
text per job.

A PID is taken off the list before its job is reaped, while the zombie still holds it, so the
guard never kills a PID the system has given to someone else since. What remains is the moment
between a job's start and its `+` line, as the wrapper had between its start and its prctl(2).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported with the first job (jobs.py), not by every broker
    import subprocess

log = logging.getLogger("tbon.exec")

SCRIPT = r"""
trap '' HUP INT TERM QUIT PIPE USR1 USR2
jobs=' '
while read -r op pid; do
  case $op in
    +) jobs="$jobs$pid " ;;
    -) case $jobs in *" $pid "*) jobs="${jobs%% $pid *} ${jobs#* $pid }" ;; esac ;;
  esac
done
for pid in $jobs; do kill -s KILL -- "-$pid" "$pid" 2>/dev/null; done
"""
"""Shell builtins only: the guard forks nothing while the broker lives. Signals are ignored, so
that only the end of the pipe, the broker's, ends it."""

SHELL = "/bin/sh"
NAME = "tbon-job-guard"  # its $0, which ps shows


class OrphanGuard:
    """The broker's side of the guard: a pipe to it, and the PIDs it was told of (sent again to
    a new guard should it die)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self.pids: set[int] = set()

    def watch(self, pid: int) -> None:
        """A job started: should this broker die, the guard kills it."""
        self.pids.add(pid)
        if not (self._process is not None and self._say(f"+ {pid}\n")):
            self._start()  # the first job, or a guard gone (its pipe said EPIPE)

    def forget(self, pid: int) -> None:
        """A job ended and is about to be reaped: its PID may soon be someone else's."""
        if pid in self.pids:
            self.pids.discard(pid)
            if self._process is not None:
                self._say(f"- {pid}\n")  # a guard gone is not asked after: the next job is

    def close(self) -> None:
        """The broker is ending: the guard kills what is still listed, and is reaped."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        import subprocess

        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2)

    def _start(self) -> None:
        """A guard for every job listed: at the first job, or after one died (killed by hand)."""
        if self._process is not None:
            self._process.poll()  # reaped, if it is a zombie
            log.warning("the orphan guard (pid %d) has gone: starting another", self._process.pid)
        import subprocess

        self._process = subprocess.Popen(
            [SHELL, "-c", SCRIPT, NAME],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C at the broker's terminal is not for it
        )
        pipe = self._process.stdin
        assert pipe is not None
        with contextlib.suppress(OSError):  # a new guard reads at once: this may block
            pipe.write("".join(f"+ {pid}\n" for pid in sorted(self.pids)).encode())
            pipe.flush()
        os.set_blocking(pipe.fileno(), False)

    def _say(self, line: str) -> bool:
        """Tell the guard one line; False if it has died (EPIPE). Never blocks the broker: a
        guard that stopped reading (SIGSTOP) with a full pipe costs the jobs started meanwhile
        their guarantee, and says so."""
        process = self._process
        assert process is not None and process.stdin is not None
        try:
            os.write(process.stdin.fileno(), line.encode())
        except BlockingIOError:
            log.warning("the orphan guard (pid %d) is not reading: %r not told", process.pid, line)
        except OSError:
            return False
        return True
