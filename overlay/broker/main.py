"""`tbon broker`: parsed here, by hand, so that a broker imports neither typer nor rich, nor
even argparse (which, with the gettext, locale and shutil it loads to parse, costs a broker 1.4 MB
of its 20: issue 14).

Its help is laid out as every other command's (tbon/helptext.py), from the tables below, which
`tbon completion` reads too; its usage errors are worded as theirs.
"""

from __future__ import annotations

import sys

from tbon import exitcodes
from tbon.errors import TbonError, UsageError, debugging

PROG = "tbon broker"

DESCRIPTION = """\
Run one broker of a tbon instance.

Started by a PMI launcher (tbon start, MPICH's mpiexec, srun --mpi=pmi2), it learns its rank and
size from PMI, swaps keys and endpoints with the other brokers and joins the tree; with -c FILE,
it takes its rank from a config file; with -S broker.boot-server=URI, it joins a running instance
by FLUB; started alone, it is rank 0 of a size-1 instance. Rank 0 runs COMMAND, if given, once
every launched broker is online, then shuts the instance down and exits with COMMAND's status.
"""

ARGUMENTS = [("[COMMAND]...", "Initial program for rank 0, run with TBON_URI set.")]

OPTIONS: list[tuple[tuple[str, ...], str, str]] = [  # names, metavar ("" for a flag), help
    (("-S", "--setattr"), "NAME=VALUE", "Set a broker attribute (repeatable); see Attributes."),
    (
        ("-c", "--config-file"),
        "FILE",
        "Bootstrap from the [bootstrap] table of a TOML file (tbon-config(5)).",
    ),
    (("-h", "--help"), "", "Show this message and exit."),
]

ATTRIBUTES = [
    ("size", "Ranks in the instance (default: the PMI size); more than launched: spares."),
    ("tbon.topo", "kary:K or binomial (default kary:32)."),
    ("tbon.fanout", "K: the same as tbon.topo=kary:K."),
    ("tbon.heartbeat", "Heartbeat period on each link (default 10s, or less: tbon-broker(1))."),
    ("tbon.torpid", "Silence that flags a broker torpid (default 30s; 0 disables)."),
    ("tbon.timeout", "Silence that makes a broker lost (default 60s; 0 disables)."),
    (
        "tbon.standbys",
        "K, 0 to 4: ranks that keep a copy of the root's table, ranks 1..K in breadth-first "
        "order, clamped to size-1 (default 0).",
    ),
    (
        "tbon.endpoint",
        "Where a parent listens, tcp://HOST:PORT; %h is this host's address, * a free port "
        "(default tcp://%h:*).",
    ),
    (
        "broker.rundir",
        "Run directory for the local socket; %r is the rank (default: a new 0700 directory).",
    ),
    ("broker.shutdown-timeout", "How long to wait for children at shutdown (default 10s)."),
    (
        "broker.boot-server",
        "Join a running instance by FLUB through this URI, or the first of a comma-separated "
        "list that sees the join through (tried in order).",
    ),
    ("broker.rank", "With broker.boot-server: ask for this rank."),
    ("broker.join-timeout", "How long a FLUB reservation lasts (default 30s; rank 0's counts)."),
    (
        "broker.reattach-timeout",
        "How long a broker that lost its parent seeks a live ancestor before it exits 75 "
        "(default: tbon.timeout).",
    ),
    (
        "broker.client-backlog",
        "Bytes a local client may leave unread before it is dropped (default 64M).",
    ),
    (
        "broker.handshake-timeout",
        "How long a peer on the tree port may take over its CURVE handshake before it is "
        "closed (default 5s).",
    ),
    (
        "broker.client-backlog-total",
        "Bytes all local clients together may leave unread; past it the greediest is dropped "
        "(default: 1.25 times broker.client-backlog, 80M).",
    ),
    ("broker.cert", "Use the key pair of this certificate (tbon keygen), not a new one."),
    ("hostname", "The name this broker reports (default: the host name)."),
    ("log-stderr-level", "debug, info, warning or error (default warning)."),
]

EXIT_STATUS = [
    ("0", "Shut down (or retired)."),
    ("1", "Internal error (a supervisor may restart it)."),
    ("2", "Usage error."),
    ("69", "No rank available."),
    (
        "75",
        "Lost the parent or the instance, or could not reach the boot server (a new "
        "process may rejoin).",
    ),
    ("77", "Refused (do not restart)."),
]


def help_text() -> str:
    from tbon.helptext import HelpPage, Section, render

    options = [
        (", ".join(names) + (f" {metavar}" if metavar else ""), text)
        for names, metavar, text in OPTIONS
    ]
    page = HelpPage(
        f"{PROG} [OPTIONS] [COMMAND]...",
        DESCRIPTION,
        [
            Section("Arguments", ARGUMENTS),
            Section("Options", options),
            Section("Attributes", ATTRIBUTES),
            Section("Exit status", EXIT_STATUS),
        ],
        "See tbon-broker(1).",
    )
    return render(page)


class Args:
    """What `tbon broker` was asked: its -S assignments, -c file and initial program."""

    __slots__ = ("command", "config_file", "help", "setattr")

    def __init__(self) -> None:
        self.setattr: list[str] = []
        self.config_file: str | None = None
        self.help = False
        self.command: list[str] = []


_OPTION_NAMES = {name: names for names, _, _ in OPTIONS for name in names}  # name -> all of them


def _split(word: str) -> tuple[str, str | None]:
    """`--name=VALUE`, `-SVALUE` and `-S=VALUE` carry their value; `--name` and `-S` do not."""
    if word.startswith("--"):
        name, glued, value = word.partition("=")
        return name, value if glued else None
    return word[:2], word[2:].removeprefix("=") or None


def parse_args(argv: list[str]) -> Args:
    """Options first; COMMAND starts at the first word that is not one (its options are its
    own), or after `--`. As argparse did, less its abbreviations of long options."""
    args = Args()
    words = iter(argv)
    for word in words:
        if word == "--" or not word.startswith("-") or word == "-":
            args.command = list(words) if word == "--" else [word, *words]
            break
        name, value = _split(word)
        names = _OPTION_NAMES.get(name, ())
        if "--help" in names and value is None:
            args.help = True
            continue
        if not names or "--help" in names:
            raise UsageError(f"no such option: {word}")
        if value is None:
            value = next(words, None)
            if value is None:
                raise UsageError(f"option '{names[0]}' requires an argument")
        if "--setattr" in names:
            args.setattr.append(value)
        else:
            args.config_file = value
    return args


def main(argv: list[str]) -> int:
    from tbon.overlay.config.attributes import broker_config, parse_assignments
    from tbon.proctitle import name_broker

    try:
        args = parse_args(argv)
    except UsageError as error:
        print(f"{PROG}: {error} (try '{PROG} --help')", file=sys.stderr)
        return error.exit_code
    if args.help:
        sys.stdout.write(help_text())
        return 0
    command = args.command
    try:
        config = broker_config(parse_assignments(args.setattr), args.config_file)
        from tbon.overlay.broker.startup import check_files

        check_files(config)
    except TbonError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return error.exit_code
    from tbon.overlay.broker.broker import run_broker

    name_broker(detail=" ".join(argv))  # `tbon broker rank R/N ...` once bootstrap tells R/N
    try:
        return run_broker(config, command)
    except UsageError as error:  # a config file's host list without this host, say
        print(f"{PROG}: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return exitcodes.INTERNAL
    except Exception as error:  # a broker reports, it does not print tracebacks at users
        if debugging():
            raise
        print(f"{PROG}: internal error: {error!r}", file=sys.stderr)
        return exitcodes.INTERNAL
