"""What a user sees from the commands: exit statuses, one-line errors, signals, URIs."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from conftest import DEADLINE, TBON, child_env, process_gone, tbon, wait_for


def one_line_error(result: subprocess.CompletedProcess[str], code: int, pattern: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "pattern"),
    [
        (["status", "--frob"], 2, r"^tbon status: no such option: --frob"),
        (["frob"], 2, r"^tbon: no such command 'frob'"),
        (
            ["status", "local:///nonexistent/socket"],
            1,
            r"^tbon status: cannot connect to local:///nonexistent/socket: no such socket",
        ),
        (["status", "bogus://x"], 2, r"^tbon status: invalid URI 'bogus://x'"),
        (["status"], 2, r"TBON_URI is not set"),
        (["ping", "1"], 2, r"TBON_URI is not set"),
        (["ping", "local:///x", "one"], 2, r"invalid rank 'one'"),
        (["status", "--wait", "bogus", "local:///x"], 2, r"invalid --wait state 'bogus'"),
        (
            ["status", "--timeout", "soon", "--wait", "full", "local:///x"],
            2,
            r"invalid --timeout 'soon'",
        ),
        (["shutdown", "local:///nonexistent/socket"], 1, r"no such socket"),
        (["start", "--test-size=0", "true"], 2, r"--test-size"),
        (
            ["start", "--test-size=2", "-S", "tbon.topo=kary:x", "true"],
            2,
            r"invalid topology 'kary:x'",
        ),
        (["start", "--test-size=2", "-S", "nonsense=1", "true"], 2, r"unknown attribute"),
        (
            ["start", "--test-size=2", "-S", "tbon.heartbeat=fast", "true"],
            2,
            r"invalid tbon.heartbeat 'fast'",
        ),
        (["start", "--test-size=2", "-o", "-v", "true"], 2, r"unsupported broker option '-v'"),
        (["broker", "-S", "nonsense=1"], 2, r"^tbon broker: unknown attribute 'nonsense'"),
        (["broker", "-S", "size"], 2, r"^tbon broker: invalid attribute 'size'"),
        (["broker", "--frob"], 2, r"^tbon broker: no such option: --frob"),
        (["broker", "-S"], 2, r"^tbon broker: option '-S' requires an argument"),
        (["uri", "pid:999999999"], 1, r"pid 999999999: no such process"),
        (["uri", "/nonexistent"], 1, r"no such run directory"),
        (["uri", "--local", "--remote", "local:///x"], 2, r"exclude each other"),
    ],
)
def test_bad_input_gets_a_one_line_error(args: list[str], code: int, pattern: str) -> None:
    one_line_error(tbon(*args), code, pattern)


def test_stale_socket_is_refused_clearly(tmp_path) -> None:
    path = tmp_path / "local"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file remains, nobody listens
    one_line_error(tbon("status", f"local://{path}"), 1, r"connection refused")


def test_start_returns_the_exit_status_of_its_command() -> None:
    assert tbon("start", "--test-size=2", "sh", "-c", "exit 7").returncode == 7
    killed = tbon("start", "--test-size=2", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + signal.SIGTERM
    missing = tbon("start", "--test-size=2", "no-such-command-anywhere")
    assert missing.returncode == 127
    assert "cannot run no-such-command-anywhere" in missing.stderr


def test_sigterm_to_start_ends_the_command_and_returns_its_status() -> None:
    process = subprocess.Popen(
        [TBON, "start", "--test-size=3", "sh", "-c", "echo ready; exec sleep 60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "killed" not in err


def test_shutdown_from_inside_returns_the_commands_status() -> None:
    for size in ("1", "3"):
        # exec: the answer may reach the shell before rank 0 signals it, and a `sleep` forked
        # by then would outlive it, holding the output pipes open.
        result = tbon(
            "start", f"--test-size={size}", "sh", "-c", "tbon shutdown --no-wait && exec sleep 60"
        )
        assert result.returncode == 128 + signal.SIGTERM, result.stderr


def test_command_sees_the_instance_environment() -> None:
    result = tbon("start", "--test-size=2", "sh", "-c", 'echo "$TBON_URI $TBON_RANK $PMI_FD"')
    assert result.returncode == 0, result.stderr
    uri, rank = result.stdout.split()
    assert uri.startswith("local://") and rank == "0"


def test_singleton_broker_runs_its_initial_program() -> None:
    result = tbon("broker", "sh", "-c", "tbon status --summary; exit 3")
    assert result.returncode == 3, result.stderr
    assert re.fullmatch(r"0 \S+: full \(1 ranks: 1 online\)\n", result.stdout)


def test_start_prints_the_uri_and_shuts_down_on_sigterm(instance) -> None:
    inst = instance(4)
    pids = set(inst.broker_pids)
    assert len(pids) == 4
    inst.process.send_signal(signal.SIGTERM)
    assert inst.process.wait(timeout=DEADLINE) == 0
    wait_for(lambda: all(process_gone(pid) for pid in pids), "every broker to exit")
    assert not os.path.exists(inst.uri[len("local://") :])
    assert "exited" not in inst.stderr() and "Traceback" not in inst.stderr()


def test_shutdown_command_stops_the_instance(instance) -> None:
    inst = instance(8, "tbon.fanout=2")
    result = tbon("shutdown", inst.uri)
    assert result.returncode == 0, result.stderr
    assert inst.process.wait(timeout=DEADLINE) == 0
    wait_for(lambda: all(process_gone(pid) for pid in inst.broker_pids), "every broker to exit")
    assert "exited" not in inst.stderr()


def test_killing_tbon_start_leaves_nothing_behind() -> None:
    process = subprocess.Popen(
        [TBON, "start", "--test-size=4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
    try:
        assert process.stdout is not None
        uri = process.stdout.readline().strip()
        status = tbon("status", uri, "--json")
        pids = [int(p) for p in re.findall(r'"pid":(\d+)', status.stdout)]
        assert len(pids) == 4
        process.kill()  # no chance to clean up: the launcher must notice by itself
        process.wait()
        wait_for(lambda: all(process_gone(pid) for pid in pids), "orphaned brokers to exit")
        rundir = os.path.dirname(os.path.dirname(uri[len("local://") :]))
        wait_for(lambda: not os.path.exists(rundir), "the run directory to be removed")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_uri_finds_instances(instance) -> None:
    inst = instance(2)
    rundir = os.path.dirname(inst.uri[len("local://") :])
    assert tbon("uri", rundir).stdout.strip() == inst.uri
    assert tbon("uri", f"pid:{inst.process.pid}").stdout.strip() == inst.uri
    assert tbon("uri", f"pid:{inst.pid(1)}").stdout.strip().endswith("/1/local")
    remote = tbon("uri", "--remote", inst.uri).stdout.strip()
    assert remote == f"ssh://{socket.gethostname()}{inst.uri[len('local://') :]}"
    assert tbon("uri", "--local", remote).stdout.strip() == inst.uri
    inside = tbon("start", "--test-size=1", "tbon", "uri")
    assert inside.returncode == 0 and inside.stdout.startswith("local://")


def test_ping_help_names_uri_then_rank_in_the_order_they_are_typed() -> None:
    shown = tbon("ping", "--help", env=child_env(COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("Usage: tbon ping [OPTIONS] [URI] RANK\n")
    row = shown.stdout.split("\nArguments:\n", 1)[1].splitlines()[0]
    assert row.split()[:2] == ["[URI]", "RANK"], row
    assert row.index("instance") < row.index("rank to ping"), row


def test_help_explains_every_command() -> None:
    for command in ("start", "status", "ping", "uri", "shutdown", "keygen"):
        result = tbon(command, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, command
    broker = tbon("broker", "--help")
    assert broker.returncode == 0 and "Exit status:" in broker.stdout
    top = tbon("--help").stdout
    assert all(name in top for name in ("start", "broker", "status", "ping", "shutdown"))


# --- help, errors, completion, process titles, run directories (issue 13) -------------------


def commands() -> list[str]:
    """Every command `tbon --help` lists, as a user finds them."""
    top = tbon("--help", env=child_env(COLUMNS="200")).stdout
    listed = top.split("\nCommands:\n", 1)[1]
    return [
        line.split()[0] for line in listed.splitlines() if line.startswith("  ") and line[2] != " "
    ]


def hard_breaks(text: str, width: int) -> list[str]:
    """Lines broken where the next word would still have fitted: a break that the source put
    there, not the terminal's width. A continuation line is one indented to the column where
    the text of the line before it starts (0 for a paragraph, the text column for a row).
    Checked at two widths, for every command, this finds breaks written into the source."""
    lines = text.splitlines()
    body = lines[lines.index("") :] if "" in lines else []  # past the usage line
    found = []
    for before, after in itertools.pairwise(body):
        header = before.endswith(":") and before[0] != " "
        if header or not before.strip() or not after.strip():
            continue
        row = re.match(r"^( {2}\S.*?\s{2,})\S", before)
        column = len(row.group(1)) if row else len(before) - len(before.lstrip())
        if len(after) - len(after.lstrip()) != column:
            continue
        word = re.match(r"\[[^\]]*\]|\S+", after.lstrip())  # `[default: 10s]` is one
        if word and len(before) + 1 + len(word.group()) <= width:
            found.append(f"{before!r} / {after!r}")
    return found


UNREADABLE = re.compile(r"<\w+(\[[^\]]*\])?>|\[\[|\]\.\.\.\]|\.\.\.\]\.\.\.")


@pytest.mark.parametrize("width", [80, 120])
def test_every_help_wraps_only_at_the_edge_and_reads(width: int) -> None:
    names = commands()
    assert {"start", "status", "broker", "completion"} <= set(names), names
    env = child_env(COLUMNS=str(width))
    for args in [[], *([name] for name in names)]:
        result = tbon(*args, "--help", env=env)
        assert result.returncode == 0, (args, result.stderr)
        page = result.stdout
        assert page.startswith(f"Usage: {' '.join(['tbon', *args])} "), page
        assert "\nOptions:\n" in page and "-h, --help" in page, args
        assert not UNREADABLE.findall(page), (args, UNREADABLE.findall(page))
        assert max(len(line) for line in page.splitlines()) <= width, args
        assert not hard_breaks(page, width), (args, hard_breaks(page, width))


def test_broker_help_looks_like_the_others_and_loads_no_typer() -> None:
    from tbon.overlay.config.attributes import KNOWN

    env = child_env(COLUMNS="100")
    broker, start = tbon("broker", "--help", env=env), tbon("start", "--help", env=env)
    assert broker.returncode == 0, broker.stderr
    assert broker.stdout.startswith("Usage: tbon broker [OPTIONS] [COMMAND]...\n\n")

    def headers(page: str) -> list[str]:
        return [line for line in page.splitlines() if re.fullmatch(r"[A-Z][a-z ]+:", line)]

    assert headers(broker.stdout)[:2] == headers(start.stdout) == ["Arguments:", "Options:"]
    assert headers(broker.stdout)[2:] == ["Attributes:", "Exit status:"]
    help_row = next(line for line in start.stdout.splitlines() if "-h, --help" in line)
    assert re.search(r"^  -h, --help +Show this message and exit\.$", broker.stdout, re.M)
    assert help_row.split("--help")[1].strip() == "Show this message and exit."
    attributes = broker.stdout.split("\nAttributes:\n")[1].split("\n\n")[0]
    listed = {line.split()[0] for line in attributes.splitlines() if line[2] != " "}
    assert listed == set(KNOWN)
    assert not hard_breaks(broker.stdout, 100)
    code = (
        "import sys; from tbon.cli.main import main; main(['broker', '--help']); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'typer', 'rich', 'click'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.splitlines()[-1] == "[]", loaded.stdout[-200:]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["start", "--test-size=0", "true"], r"^tbon start: invalid --test-size '0': use a whole"),
        (["start", "--test-size=two", "true"], r"^tbon start: invalid --test-size 'two'"),
        (["start", "true"], r"^tbon start: missing option '--test-size'"),
        (["ping", "local:///x", "1", "--count", "0"], r"^tbon ping: invalid --count '0'"),
        (["ping", "local:///x", "1", "-c", "1e3"], r"^tbon ping: invalid --count '1e3'"),
        (["expand", "local:///x", "-n", "0"], r"^tbon expand: invalid --count '0'"),
        (["alloc", "-N", "0", "true"], r"^tbon alloc: invalid --nodes '0'"),
        (["alloc", "-N", "2", "--size", "x"], r"^tbon alloc: invalid --size 'x'"),
        (["status", "--rank", "one", "local:///x"], r"^tbon status: invalid --rank 'one'"),
        (["status", "--rank"], r"^tbon status: option '--rank' requires an argument"),
        (["status", "--json=1"], r"^tbon status: option '--json' does not take a value"),
        (["ping", "-c"], r"^tbon ping: option '-c' requires an argument"),
        (["uri", "a", "b"], r"^tbon uri: unexpected argument: b"),
        (["completion", "tcsh"], r"^tbon completion: invalid shell 'tcsh'"),
    ],
)
def test_errors_name_the_command_in_tbons_own_words(args: list[str], pattern: str) -> None:
    result = tbon(*args)
    one_line_error(result, 2, pattern)
    for foreign in ("Input should", "Invalid value for", "valid integer", "pydantic", "Got "):
        assert foreign not in result.stderr, result.stderr


def test_tbon_alone_prints_the_help_and_no_error() -> None:
    result = tbon()
    assert result.returncode == 2
    assert result.stderr == ""
    assert result.stdout.startswith("Usage: tbon [OPTIONS] COMMAND [ARGS]...")
    assert "\nCommands:\n" in result.stdout


def test_completion_scripts_complete_commands_options_and_attributes(tmp_path) -> None:
    scripts = {}
    for shell in ("bash", "zsh", "fish"):
        result = tbon("completion", shell)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert "tbon" in result.stdout and "status" in result.stdout
        scripts[shell] = tmp_path / f"tbon.{shell}"
        scripts[shell].write_text(result.stdout)
    probe = (
        f"source {scripts['bash']}\n"
        "complete -p tbon >/dev/null || exit 9\n"
        'try() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _tbon; echo "${COMPREPLY[*]}"; }\n'
        "try tbon stat\n"
        "try tbon sta\n"
        "try tbon status --ra\n"
        "try tbon broker -S tbon.to\n"
        "try tbon alloc --launcher s\n"
        "try tbon completion f\n"
        "try tbon status --color ''\n"
        "try tbon status -w u\n"
        "try tbon dmesg --level w\n"
        "try tbon attr g\n"
        "try tbon attr get tbon.to\n"
    )
    bash = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True)
    assert bash.returncode == 0, bash.stderr
    assert bash.stdout.splitlines() == [
        "status",
        "start status",
        "--rank",
        "tbon.topo= tbon.torpid=",
        "ssh srun",
        "fish",
        "auto always never",
        "up",
        "warning",
        "get",
        "tbon.topo tbon.torpid",
    ]
    fish = shutil.which("fish")
    if fish:
        lines = [
            "tbon stat",
            "tbon status --ra",
            "tbon broker -S tbon.to",
            "tbon status --color ",
            "tbon dmesg --level w",
        ]
        code = f"source {scripts['fish']}; " + "; ".join(f"complete -C '{c}'" for c in lines)
        found = subprocess.run([fish, "--no-config", "-c", code], capture_output=True, text=True)
        assert found.returncode == 0, found.stderr
        words = [line.split("\t")[0] for line in found.stdout.splitlines()]
        assert words == [
            "status",
            "--rank",
            "tbon.topo=",
            "tbon.torpid=",
            "always",  # fish sorts what it offers
            "auto",
            "never",
            "warning",
        ], found.stdout
    zsh = shutil.which("zsh")
    if zsh:
        checked = subprocess.run([zsh, "-n", str(scripts["zsh"])], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        # The function's own choices, with zsh's completion builtins standing in.
        stubs = (
            "_describe() { local name=${@[-1]}; local -a items; items=(${(P)name}); "
            "print -r -- ${items%%:*}; }\n"
            "compadd() { while [[ $1 == -* ]]; do [[ $1 == -- ]] && { shift; break; }; "
            "[[ $1 == -S ]] && shift; shift; done; print -r -- $@; }\n"
            "_files() { print files; }\n"
            "compdef() { :; }\n"
            f"source {scripts['zsh']}\n"
            "try() { words=($@); CURRENT=$#; PREFIX=${words[CURRENT]}; _tbon; }\n"
            "try tbon st\n"
            "try tbon status --\n"
            "try tbon broker -S ''\n"
            "try tbon status --color ''\n"
            "try tbon dmesg --level ''\n"
        )
        ran = subprocess.run([zsh, "-f", "-c", stubs], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        out = ran.stdout.splitlines()
        assert "status" in out[0].split() and "start" in out[0].split(), out
        assert "--rank" in out[1].split() and "--watch" in out[1].split(), out
        assert "tbon.topo=" in out[2].split(), out
        assert out[3].split() == ["auto", "always", "never"], out
        assert out[4].split() == ["debug", "info", "warning", "error"], out


def launcher_of(start: subprocess.Popen[str]) -> int:
    """The `python -m tbon.overlay.launch.local` that `tbon start` ran: its only child."""
    found = subprocess.run(
        ["pgrep", "-P", str(start.pid)], capture_output=True, text=True
    ).stdout.split()
    assert len(found) == 1, found
    return int(found[0])


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return file.read().rstrip(b"\0").replace(b"\0", b" ").decode()


def test_every_broker_shows_as_tbon_broker_rank_in_ps(instance) -> None:
    inst = instance(3)
    launcher = launcher_of(inst.process)
    found = subprocess.run(
        ["pgrep", "-P", str(launcher), "-f", "tbon broker"], capture_output=True, text=True
    ).stdout.split()
    assert {int(pid) for pid in found} == inst.broker_pids
    titles = sorted(cmdline(int(pid)) for pid in found)
    assert [re.sub(r"\s+$", "", t) for t in titles] == [f"tbon broker rank {r}/3" for r in range(3)]
    for pid in found:
        with open(f"/proc/{pid}/comm") as comm:
            assert comm.read().strip() == "tbon-broker"
    # One started on its own shows the same, with the arguments it was given.
    alone = tbon("broker", "sh", "-c", 'tr "\\0" " " < /proc/$PPID/cmdline')
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith("tbon broker rank 0/1 sh -c tr"), alone.stdout
    # Under `tbon alloc`, each broker runs below a `tbon relay`, which does not show as one.
    count = (
        'relays=$(pgrep -P $PPID -f "^tbon relay"); echo $relays | wc -w; '
        'for r in $relays; do pgrep -P $r -f "^tbon broker rank [01]/2"; done | wc -l; '
        'pgrep -P $PPID -f "tbon broker" | grep -vx $$ | wc -l'
    )
    alloc = tbon("alloc", "-N", "2", "--launcher", "local", "sh", "-c", count)
    assert alloc.returncode == 0, alloc.stderr
    assert alloc.stdout.split() == ["2", "2", "0"], alloc.stdout


def test_a_killed_joiners_run_directory_goes(instance) -> None:
    inst = instance(2, "size=4")
    rank0_dir = os.path.dirname(inst.uri[len("local://") :])
    joined = tbon("expand", inst.uri, "-n", "2", "--json")
    assert joined.returncode == 0, joined.stderr
    pids = [j["pid"] for j in json.loads(joined.stdout)["joined"]]
    try:
        dirs = [
            os.path.dirname(tbon("uri", f"pid:{pid}").stdout.strip()[len("local://") :])
            for pid in pids
        ]
        assert all(d.startswith(rank0_dir + os.sep) and os.path.isdir(d) for d in dirs), dirs
        os.kill(pids[0], signal.SIGKILL)
        wait_for(lambda: process_gone(pids[0]), "the killed joiner to go")
        assert os.path.isdir(dirs[0])  # nobody could remove it yet
        again = tbon("expand", inst.uri, "--fill", "--json")
        assert again.returncode == 0, again.stderr
        pids += [j["pid"] for j in json.loads(again.stdout)["joined"]]
        assert not os.path.exists(dirs[0]), "the next expand sweeps a dead joiner's directory"
        assert os.path.isdir(dirs[1]), "and leaves a live one's alone"
    finally:
        inst.stop()
        wait_for(lambda: all(process_gone(p) for p in pids), "joined brokers to leave")
        for pid in pids:  # ours, by PID, should any have outlived the instance
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert not os.path.exists(rank0_dir)


@pytest.mark.parametrize("view", ["--summary", "--json"])
def test_status_summary_and_json_on_a_pipe_load_no_rich(instance, view: str) -> None:
    """Issue 26: `--summary` at 262,144 ranks is ~0.2 s in all, Rich ~40 ms of it; on a pipe
    (no colour) the summary line and the JSON are written without it."""
    inst = instance(2)
    code = (
        "import sys, json; from tbon.cli.main import main; code = main(sys.argv[1:]); "
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr); sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "status", inst.uri, view],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    tops = {name.split(".")[0] for name in json.loads(done.stderr.splitlines()[-1])}
    assert "rich" not in tops
    if view == "--summary":
        assert done.stdout == f"0 {socket.gethostname()}: full (2 ranks: 2 online)\n"
    else:
        assert [r["state"] for r in json.loads(done.stdout)["ranks"]] == ["online", "online"]


@pytest.mark.parametrize(
    "args",
    [
        ["status", "local:///nonexistent/socket", "--json"],
        ["exec", "local:///nonexistent/socket", "-r", "0", "true"],
        ["ping", "local:///nonexistent/socket", "1", "--count", "2"],
        ["--help"],
    ],
)
def test_a_command_loads_its_own_module_and_no_pydantic_or_rich(args: list[str]) -> None:
    """What keeps a command quick to start (issue 14): only the invoked command's module is
    imported, and its plain values are converted without Typer's pydantic adapters."""
    code = (
        "import sys, json; from tbon.cli.main import main; main(sys.argv[1:]); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    tops = {name.split(".")[0] for name in loaded}
    assert not tops & {"pydantic", "pydantic_core", "rich"}, sorted(tops)
    from tbon.cli.app import COMMAND_MODULES

    every = {f"tbon.cli.{name}" for name in COMMAND_MODULES}
    commands = loaded & every  # a command's own helpers (exec's failures.py) are not commands
    if args[0] == "--help":  # the group's help lists every command: all are loaded
        assert commands == every, sorted(commands)
    else:
        assert commands == {f"tbon.cli.{args[0]}"}, sorted(commands)


PLAIN_VALUES = [
    ("count", "3"),
    ("count", "+3"),
    ("count", "007"),
    ("count", " 3"),
    ("count", "3 "),
    ("count", "1_000"),
    ("count", "\u0663"),
    ("count", "0"),
    ("count", "-1"),
    ("count", "9" * 30),
    ("count", 4),
    ("count", 2.0),
    ("count", True),
    ("interval", "10ms"),
    ("interval", ""),
    ("interval", b"bytes"),
    ("interval", 5),
    ("words", ("local:///x", "1")),
    ("words", ["a"]),
    ("words", "a"),
    ("words", ()),
    ("as_json", True),
    ("as_json", "yes"),
]


@pytest.mark.parametrize(("name", "value"), PLAIN_VALUES)
def test_plain_conversion_agrees_with_typers_own(name: str, value: object) -> None:
    """tbon's cheap conversion of str, bool, int and list values (cli/commands.py PlainValue)
    gives what Typer's pydantic conversion gives, or the same error."""
    import typer
    from typer._click import Context
    from typer._click.exceptions import BadParameter
    from typer._coercion import build_runtime_param

    from tbon.cli.app import app
    from tbon.cli.commands import PlainValue

    group = typer.main.get_command(app)
    command = group.commands["ping"]  # type: ignore[attr-defined]
    param = next(p for p in command.params if p.name == name)
    assert isinstance(param.get_runtime_param(), PlainValue)
    ctx = Context(command)

    def outcome(runtime: object) -> tuple[str, object]:
        try:
            return "value", runtime._coerce_value(value, param=param, ctx=ctx)  # type: ignore[attr-defined]
        except BadParameter as error:
            return "error", error.format_message()

    ours = outcome(param.get_runtime_param())
    typers = outcome(build_runtime_param(param.type_descriptor))
    assert ours == typers
    assert type(ours[1]) is type(typers[1])
