"""`tbon broker`: parsed with argparse, so that a broker never imports typer or rich."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from tbon import exitcodes
from tbon.errors import TbonError, debugging

DESCRIPTION = """\
Run one broker of a tbon instance. Started by a PMI launcher (tbon start, MPICH's mpiexec,
srun --mpi=pmi2), it learns its rank and size from PMI, swaps keys and endpoints with the other
brokers and joins the tree; started alone, it is rank 0 of a size-1 instance. Rank 0 runs
COMMAND, if given, once every launched broker is online, then shuts the instance down and exits
with COMMAND's status.
"""

EPILOG = """\
attributes (-S NAME=VALUE):
  size                 ranks in the instance (default: the PMI size)
  tbon.topo            kary:K | binomial (default kary:32); tbon.fanout=K is kary:K
  tbon.heartbeat       heartbeat period on each link (default 2s)
  tbon.torpid          silence that flags a broker torpid (default 10s; 0 disables)
  tbon.timeout         silence that makes a broker lost (default 60s; 0 disables)
  tbon.endpoint        where a parent listens, tcp://HOST:PORT; %h is this host's
                       address, * a free port (default tcp://%h:*)
  broker.rundir        run directory for the local socket (default: a new 0700 temp dir)
  broker.shutdown-timeout  how long to wait for children at shutdown (default 10s)
  broker.boot-server   join a running instance by FLUB through this URI (local://...)
  broker.rank          with broker.boot-server: ask for this rank
  broker.join-timeout  how long a FLUB reservation lasts (default 30s; rank 0's counts)
  broker.cert          use the key pair of this certificate (tbon keygen), not a new one
  hostname             the name this broker reports (default: the host name)
  log-stderr-level     debug | info | warning | error (default warning)

exit status:
  0 shut down (or retired)   1 internal error   2 usage error   69 no rank available
  75 lost the parent or the instance (restart may rejoin)   77 refused (do not restart)

See tbon-broker(1).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"tbon broker: {message} (try 'tbon broker --help')", file=sys.stderr)
        sys.exit(exitcodes.USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tbon broker",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-S",
        "--setattr",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a broker attribute (repeatable)",
    )
    parser.add_argument(
        "-c",
        "--config-file",
        metavar="FILE",
        help="bootstrap from the [bootstrap] table of a TOML file (tbon-config(5))",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="initial program for rank 0, run with TBON_URI set",
    )
    return parser


def main(argv: list[str]) -> int:
    from tbon.overlay.broker.attributes import broker_config, parse_assignments

    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        config = broker_config(parse_assignments(args.setattr), args.config_file)
    except TbonError as error:
        print(f"tbon broker: {error}", file=sys.stderr)
        return error.exit_code
    from tbon.overlay.broker.broker import run_broker

    try:
        return run_broker(config, command)
    except KeyboardInterrupt:
        return exitcodes.INTERNAL
    except Exception as error:  # a broker reports, it does not print tracebacks at users
        if debugging():
            raise
        print(f"tbon broker: internal error: {error!r}", file=sys.stderr)
        return exitcodes.INTERNAL
