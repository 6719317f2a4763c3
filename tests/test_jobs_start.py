"""How the job runner starts a command (overlay/broker/jobs.py): found by the quick lookup and
spawned at once, and, when the exec refuses what the lookup found, run or refused as a shell
would (program.py's launch), with real processes."""

from __future__ import annotations

from pathlib import Path

from test_jobs_resend import Loop, exited

from tbon.overlay.wire.message import Kind, Message


def start(argv: list[str], cwd: str, path: str) -> Message:
    payload = {"id": "j", "argv": argv, "cwd": cwd, "env": {"PATH": path}, "eof": True}
    return Message(Kind.REQUEST, "exec.start", payload, tag=5, route=["l01"])


def outcome(argv: list[str], cwd: Path, path: str) -> tuple[int, bytes, str]:
    """The job's exit status, its stdout and its note."""
    loop = Loop()
    try:
        assert loop.runner.start(start(argv, str(cwd), path)) is None
        loop.run_until(lambda: exited(loop))
    finally:
        loop.close()
    out = b"".join(bytes(m.data) for m in loop.sent if m.payload.get("stream") == "stdout")
    last = loop.sent[-1].payload
    return last["exit"], out, last.get("note", "")


def test_a_directory_found_first_in_path_gives_way_to_the_next_match(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "tool").mkdir(parents=True)
    second.mkdir()
    (second / "tool").write_bytes(b"#!/bin/sh\necho found\n")
    (second / "tool").chmod(0o755)
    assert outcome(["tool"], tmp_path, f"{first}:{second}") == (0, b"found\n", "")
    assert outcome(["tool"], tmp_path, str(first)) == (127, b"", "tool: command not found")


def test_what_the_exec_refuses_is_run_or_told_as_a_shell_would(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"echo plain $0\n")
    (tmp_path / "bad").write_bytes(b"#!/no/such/interpreter\necho hi\n")
    for name in ("plain", "bad"):
        (tmp_path / name).chmod(0o755)
    assert outcome(["plain"], tmp_path, ".") == (0, b"plain ./plain\n", "")
    said = "bad: /no/such/interpreter: bad interpreter: No such file or directory"
    assert outcome(["bad"], tmp_path, ".") == (127, b"", said)
    assert outcome(["./gone"], tmp_path, ".") == (127, b"", "./gone: No such file or directory")
    assert outcome(["x"], tmp_path / "nodir", ".")[2] == f"{tmp_path}/nodir: no such directory"


def test_an_empty_command_name_is_not_found(tmp_path: Path) -> None:
    """"" joined to a PATH entry names that directory, which access(2) calls executable: the
    quick lookup must not hand it to posix_spawn, which refuses an empty argv[0] with a
    ValueError that no exec refusal is (it ended the broker)."""
    assert outcome([""], tmp_path, "/usr/bin:/bin") == (127, b"", ": command not found")
