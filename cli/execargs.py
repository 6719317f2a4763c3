"""`tbon exec`'s command line, read before Typer is imported (cli/main.py), so that the command most
often run at scale starts in about half the time: Typer and its Click take ~70 ms to import, and
`tbon exec -r all true` waits for its CLI before any rank starts.

Only command lines Typer would take are read here, and read as Typer's Click reads them (options up
to the first word that is not one, `--` ending them, `-lr 3` and `-r3` clusters, `--rank=3`, the
last of a repeated option winning, --env repeatable, the word after an option that takes a value
being its value whatever it is: `--env -*`); anything else (--help, an unknown option, a missing
value or COMMAND, shell completion) returns None and goes through Typer, so that help and every
usage error are Typer's, word for word. The options are cli/exec.py's, which `tbon exec --help`
documents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

VALUED = {
    "--uri": "uri",
    "--rank": "ranks",
    "-r": "ranks",
    "--exclude": "exclude",
    "-x": "exclude",
    "--dir": "directory",
    "-d": "directory",
}
"""Options that take a value, by name: the field of ExecArgs it sets."""
REPEATED = {"--env": "env_rules"}
FLAGS = {
    "--label": "label",
    "--label-io": "label",
    "-l": "label",
    "--noinput": "noinput",
    "-n": "noinput",
    "--json": "as_json",
    "--quiet": "quiet",
    "-q": "quiet",
}


@dataclass
class ExecArgs:
    """What `tbon exec` was asked, with Typer's defaults."""

    words: list[str]
    uri: str | None = None
    ranks: str = "all"
    exclude: str | None = None
    label: bool = False
    directory: str | None = None
    env_rules: list[str] = field(default_factory=list)
    noinput: bool = False
    as_json: bool = False
    quiet: bool = False


def parse(args: list[str]) -> ExecArgs | None:
    """The options and words after `tbon exec`, or None for a line to leave to Typer."""
    if "_TBON_COMPLETE" in os.environ:
        return None  # Click's shell completion
    rest = list(args)
    got: dict[str, object] = {"env_rules": []}
    if rest:
        from tbon.overlay.connectors.uri import looks_like_uri

        if looks_like_uri(rest[0]):  # a leading URI is --uri (cli/app.py's _lift_uri)
            got["uri"] = rest.pop(0)
    while rest:
        arg = rest[0]
        if arg == "--":
            rest.pop(0)
            break
        if not arg.startswith("-") or arg == "-":
            break  # the first word: what follows is COMMAND's
        rest.pop(0)
        if not _option(arg, rest, got):
            return None
    if not rest:
        return None  # no COMMAND: Typer says so
    env_rules = got.pop("env_rules")
    assert isinstance(env_rules, list)
    parsed = ExecArgs(rest, env_rules=env_rules)
    for name, value in got.items():
        setattr(parsed, name, value)
    return parsed


def _option(arg: str, rest: list[str], got: dict[str, object]) -> bool:
    """Take one option (and its value) into `got`; False if Typer must judge it."""
    if arg.startswith("--"):
        name, equals, value = arg.partition("=")
        if name in FLAGS and not equals:
            got[FLAGS[name]] = True
            return True
        if name not in VALUED and name not in REPEATED:
            return False
        if not equals:
            if not rest:
                return False
            value = rest.pop(0)
        return _value(name, value, got)
    for at, letter in enumerate(arg[1:], start=2):  # a cluster: flags, then one valued option
        name = "-" + letter
        if name in FLAGS:
            got[FLAGS[name]] = True
            continue
        if name not in VALUED:
            return False
        if at < len(arg):
            return _value(name, arg[at:], got)
        return bool(rest) and _value(name, rest.pop(0), got)
    return True


def _value(name: str, value: str, got: dict[str, object]) -> bool:
    if name in REPEATED:
        rules = got[REPEATED[name]]
        assert isinstance(rules, list)
        rules.append(value)
    else:
        got[VALUED[name]] = value
    return True
