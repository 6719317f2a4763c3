"""`tbon attr get NAME` and `tbon attr list`: a running broker's attributes, as `flux getattr`
and `flux lsattr` show a Flux broker's, with where each value came from (overlay/services/attr.py
answers).

The broker asked is the one the URI names (rank 0 for the URI `tbon start` prints), or `-r RANK`
through the tree. A name that is not an attribute is a usage error, found here before anything
is asked; an attribute with no value (`broker.cert` not given) makes `get` exit 1, as `flux
getattr` fails for an attribute that is not set.
"""

from __future__ import annotations

import errno

import typer

from tbon.cli.common import URI_HELP, open_client, print_json
from tbon.errors import RankError, TbonError, UsageError
from tbon.overlay.config.attributes import KNOWN

ACTIONS = ("get", "list")
ARGUMENT_VALUES = (*ACTIONS, *sorted(KNOWN))
"""What `tbon completion` offers for the words: the actions, and every attribute name."""


def register(app: typer.Typer) -> None:
    @app.command("attr")
    def attr(
        words: list[str] = typer.Argument(
            ...,
            metavar="[URI] get NAME | list",
            help=f"{URI_HELP} Then get NAME (print its value) or list (every attribute, its "
            "value and where it came from).",
        ),
        rank: int = typer.Option(
            None,
            "--rank",
            "-r",
            min=0,
            metavar="RANK",
            help="Ask the broker of RANK (default: the broker the URI names).",
        ),
        as_json: bool = typer.Option(
            False, "--json", help="Print JSON: name, value, source (list: every attribute)."
        ),
    ) -> None:
        """Show a running broker's attributes: their values and where each came from.

        Where a value came from: default, -S (the command line), config file (tbon broker -c),
        boot server (a broker that joined by FLUB takes the instance's size, tree and liveness
        settings), bootstrap (the size PMI gave), launcher (the run directory tbon start gives
        each broker); an attribute with no value is unset.

        Exit status: 0; 1 if the attribute asked for is unset, or the broker cannot be asked; 2
        for a usage error, such as a NAME that is not an attribute; 68 if RANK is not in the
        instance or has no broker online.
        """
        from tbon.overlay.connectors.client import RequestError
        from tbon.overlay.connectors.uri import looks_like_uri
        from tbon.overlay.wire.message import ANY_RANK

        uri = words[0] if looks_like_uri(words[0]) else None
        given = words[1:] if uri is not None else words
        if not given:
            raise UsageError("missing action: use get NAME or list")
        action, *rest = given
        if action not in ACTIONS:
            raise UsageError(f"invalid action {action!r}: use get NAME or list")
        if action == "get" and len(rest) != 1:
            raise UsageError("get takes one attribute NAME")
        if action == "list" and rest:
            raise UsageError(f"list takes no NAME: {rest[0]!r}")
        if action == "get" and rest[0] not in KNOWN:
            raise UsageError(f"unknown attribute {rest[0]!r}: 'tbon attr list' lists them")
        nodeid = ANY_RANK if rank is None else rank
        topic, payload = ("attr.list", {}) if action == "list" else ("attr.get", {"name": rest[0]})
        with open_client(uri) as client:
            try:
                answer = client.rpc(topic, payload, nodeid=nodeid)
            except RequestError as error:
                if error.errnum in (errno.ENOENT, errno.EHOSTUNREACH):
                    raise RankError(str(error)) from None  # 68, as every command says it
                raise
        if action == "list":
            if as_json:
                print_json(answer)
                return
            _table(answer["attributes"])
            return
        if as_json:
            print_json(answer)
            return
        if answer["value"] is None:
            raise TbonError(f"{answer['name']} is not set on rank {answer['rank']}")
        typer.echo(answer["value"])


def _table(attributes: list[dict[str, object]]) -> None:
    """NAME  VALUE  SOURCE, aligned; `-` for a value that is unset."""
    rows = [
        (str(a["name"]), "-" if a["value"] is None else str(a["value"]), str(a["source"]))
        for a in attributes
    ]
    name_width = max(len(name) for name, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    for name, value, source in rows:
        typer.echo(f"{name:<{name_width}}  {value:<{value_width}}  {source}".rstrip())
