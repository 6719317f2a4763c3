"""Programs a broker runs: rank 0's initial program, and what every program of the instance
gets, `tbon exec` jobs included: its environment, and the lookup of its command.

The initial program is started once every launched rank is online; its exit status is the
instance's, and its exit shuts the instance down.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from tbon.record import Record

if TYPE_CHECKING:
    import subprocess  # imported where a program starts (0.2 MB), not by every broker

log = logging.getLogger("tbon.broker")

PMI_VARIABLES = ("PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_PORT", "PMI_ID")
"""What a PMI launcher gave this broker, and no program of the instance should inherit."""

SHELL = "/bin/sh"
"""What runs an executable text file that has no #! line, as a shell and execvp(3) would."""


def tbon_variables(uri: str, rank: int, size: int | None) -> dict[str, str]:
    """The variables tbon sets for every program it runs: they name this broker, whatever the
    caller's environment said."""
    tbon = {"TBON_URI": uri, "TBON_RANK": str(rank)}
    if size is not None:
        tbon["TBON_SIZE"] = str(size)
    return tbon


def program_environment(
    uri: str, rank: int, size: int | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A program's environment: `base` (the caller's, for a job), else the broker's own, without
    a launcher's PMI variables, and with tbon's variables over whatever it held."""
    env = dict(os.environ if base is None else base)
    for name in PMI_VARIABLES:
        env.pop(name, None)
    env.update(tbon_variables(uri, rank, size))
    return env


class Launch(Record):
    """How to start a command (`argv`), or why it cannot start (`why`, as a shell would say it,
    and the `status` a shell would give: 127 not found, 126 found but not runnable). `path`: the
    file to execute, as found in the job's PATH from its directory, if not argv[0] itself."""

    __slots__ = __match_args__ = ("argv", "why", "status", "path")

    def __init__(self, argv: list[str], why: str = "", status: int = 0, path: str = "") -> None:
        self.argv = argv
        self.why = why
        self.status = status
        self.path = path

    @property
    def executable(self) -> str:
        """What to execute: `path`, else argv[0]."""
        return self.path or self.argv[0]


def launch(argv: list[str], cwd: str | None, env: Mapping[str, str]) -> Launch:
    """Check, before the exec, what the exec would refuse, so that a job that cannot start is
    told in the words of a shell and never in those of the wrapper that execs it (jobs.py's
    orphan guard, whose own failure would name it). The command is looked up in the job's PATH
    (the default path if it has none), relative entries from the job's directory."""
    name = argv[0]
    if cwd is not None and not os.path.isdir(cwd):
        return Launch(argv, f"{cwd}: no such directory", 126)
    if cwd is not None and not os.access(cwd, os.X_OK):
        return Launch(argv, f"{cwd}: Permission denied", 126)
    if os.sep in name:
        exe = name
        if not os.path.exists(os.path.join(cwd or "", exe)):
            return Launch(argv, f"{name}: No such file or directory", 127)
    else:
        found = _search(name, cwd, os.get_exec_path(dict(env)))
        if found is None:
            return Launch(argv, f"{name}: command not found", 127)
        exe = found
    plan = _runnable(argv, exe, cwd)
    if plan.why or plan.argv[0] != name or exe == name:
        return plan
    return Launch(plan.argv, path=exe)  # found in PATH: that file, argv[0] as the user said


def quick_launch(argv: list[str], cwd: str | None, env: Mapping[str, str]) -> Launch | None:
    """How to start `argv` if it looks runnable, found with one access(2) per PATH entry and
    none of launch's checks; None if it is not found so (launch then says why). Every rank of
    `tbon exec -r all` starts a job, so the common case pays only for the lookup: whatever the
    exec then refuses (a directory, a script without #!, a missing interpreter), the caller
    hands to launch, which says it in a shell's words or finds what a shell would run."""
    name = argv[0]
    if os.sep in name:
        return Launch(argv)
    if not name:  # "/usr/bin/" + "" is a directory, and posix_spawn refuses an empty argv[0]
        return None
    path = env.get("PATH")
    here = "" if not cwd else cwd if cwd.endswith("/") else cwd + "/"
    for directory in (os.defpath if path is None else path).split(os.pathsep):
        # os.path.join's result, spelt out: it costs as much as the access(2), per PATH entry
        candidate = (directory or ".") + ("" if directory.endswith("/") else "/") + name
        where = candidate if not here or candidate.startswith("/") else here + candidate
        if os.access(where, os.X_OK):
            return Launch(argv, path=candidate)
    return None


def _runnable(argv: list[str], exe: str, cwd: str | None) -> Launch:
    """launch's checks of the file `exe` that argv[0] names, once found."""
    name = argv[0]
    path = os.path.join(cwd or "", exe)  # exe is as the job sees it, from its directory
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return Launch(argv, f"{name}: Permission denied", 126)
    if _binfmt_misc():
        return Launch(argv)  # the kernel may run formats of its own: let it judge
    head = _head(path)
    if head is None:
        return Launch(argv)  # executable but unreadable: only a binary runs so; exec judges
    if head.startswith(b"#!"):
        return _script(argv, exe, head, cwd)
    binary = f"{name}: cannot execute binary file: Exec format error"
    if head.startswith(b"\x7fELF"):
        return Launch(argv, binary, 126) if _foreign(head) else Launch(argv)
    if b"\0" in head.split(b"\n", 1)[0]:
        return Launch(argv, binary, 126)  # as bash tells a binary from a script
    return Launch([SHELL, exe, *argv[1:]])  # a script without #!: what sh and execvp(3) do


def _search(name: str, cwd: str | None, path: list[str]) -> str | None:
    """The first executable file `name` in `path`, as execvp(3) finds it (an empty or relative
    entry is relative to the job's directory)."""
    for directory in path:
        candidate = os.path.join(directory or ".", name)
        where = os.path.join(cwd or "", candidate)
        if os.path.isfile(where) and os.access(where, os.X_OK):
            return candidate
    return None


def _script(argv: list[str], exe: str, head: bytes, cwd: str | None) -> Launch:
    """A #! script: its interpreter must be there and runnable, as the kernel will require."""
    words = head[2:].split(b"\n", 1)[0].split()
    if not words:
        return Launch([SHELL, exe, *argv[1:]])  # "#!" alone: exec refuses it, execvp runs sh
    interpreter = os.fsdecode(words[0])
    where = os.path.join(cwd or "", interpreter)
    said = f"{argv[0]}: {interpreter}: bad interpreter"
    if not os.path.exists(where):
        return Launch(argv, f"{said}: No such file or directory", 127)
    if not os.path.isfile(where) or not os.access(where, os.X_OK):
        return Launch(argv, f"{said}: Permission denied", 126)
    return Launch(argv)


def _head(path: str) -> bytes | None:
    """The first bytes of a file, as much as the kernel reads to decide how to run it."""
    try:
        with open(path, "rb") as file:
            return file.read(256)
    except OSError:
        return None


ELF_COMPAT = {(2, 62): {(1, 3)}, (2, 183): {(1, 40)}}
"""Binaries another machine type than this broker's that the kernel usually runs too: i386 on
x86-64, 32-bit ARM on AArch64, as (ELF class, e_machine)."""


def _foreign(head: bytes) -> bool:
    """An ELF file for another machine (or not ELF at all past its magic), which exec would refuse
    with ENOEXEC: execvp(3) would then hand it to sh, which prints garbage."""
    ours = _host_elf()
    if ours is None:
        return False
    if len(head) < 20:
        return True
    theirs = (head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big"))
    return head[5] != ours[2] or (theirs != ours[:2] and theirs not in ELF_COMPAT.get(ours[:2], ()))


@functools.cache
def _host_elf() -> tuple[int, int, int] | None:
    """This broker's own (ELF class, e_machine, byte order): the machine its jobs run on."""
    head = _head("/proc/self/exe")
    if head is None or not head.startswith(b"\x7fELF") or len(head) < 20:
        return None
    order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
    return head[4], int.from_bytes(head[18:20], order), head[5]


@functools.cache
def _binfmt_misc() -> bool:
    """Whether the kernel has binfmt_misc handlers (qemu, Java, Wine...): then any file may run."""
    try:
        return bool(set(os.listdir("/proc/sys/fs/binfmt_misc")) - {"register", "status"})
    except OSError:
        return False


class InitialProgram:
    def __init__(self, command: list[str], uri: str, rank: int, size: int | None = None) -> None:
        self.command = command
        self.uri = uri
        self.rank = rank
        self.size = size  # TBON_SIZE
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pending(self) -> bool:
        """There is a program, and it has not been started yet."""
        return bool(self.command) and self.process is None

    def start(self) -> int | None:
        """Start it; None, or the exit status that says it could not start (127, 126)."""
        import shlex
        import subprocess

        log.info("instance up: running %s", shlex.join(self.command))
        try:
            self.process = subprocess.Popen(
                self.command, env=program_environment(self.uri, self.rank, self.size)
            )
        except OSError as error:
            log.error("cannot run %s: %s", self.command[0], error.strerror)
            return 127 if isinstance(error, FileNotFoundError) else 126
        return None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_status(self) -> int | None:
        """Its exit status as a shell reports it (128+N for signal N), once it has ended."""
        if self.process is None or self.process.poll() is None:
            return None
        code = self.process.returncode
        return 128 - code if code < 0 else code

    def terminate(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.terminate()

    def kill(self) -> None:
        if self.running():
            assert self.process is not None
            log.warning("shutdown: killing the initial program (pid %d)", self.process.pid)
            self.process.kill()
            self.process.wait()

    def wait(self, timeout: float) -> None:
        """At the very end: give it `timeout` to finish, then kill it."""
        if not self.running():
            return
        assert self.process is not None
        import subprocess

        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
