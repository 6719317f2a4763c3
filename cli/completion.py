"""`tbon completion bash|zsh|fish`: print a shell completion script for tbon.

The script is written out whole from the commands as this tbon has them (their names, options and
descriptions; the broker's from overlay/broker/main.py), so pressing Tab runs no Python: it is
instant, and `tbon` itself never checks for a completion request at start-up. It completes
command names, each command's options, broker attribute names after `-S`, the words an option
or argument lists as its metavar (`--launcher ssh|mpiexec|srun|local`) or its command's module
in OPTION_VALUES (`--color` auto, always, never), and files elsewhere.
Regenerate it after an upgrade that adds commands or options.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

import typer

from tbon.errors import UsageError
from tbon.helptext import first_paragraph

SHELLS = ("bash", "zsh", "fish")
WHERE = {
    "bash": "~/.local/share/bash-completion/completions/tbon",
    "zsh": "a directory of $fpath, as _tbon",
    "fish": "~/.config/fish/completions/tbon.fish",
}


@dataclass
class Option:
    names: list[str]
    help: str
    takes_value: bool
    choices: list[str] = field(default_factory=list)


@dataclass
class Command:
    name: str
    help: str
    options: list[Option]
    arguments: list[str] = field(default_factory=list)  # words a positional argument may be


def register(app: typer.Typer) -> None:
    @app.command("completion")
    def completion(
        ctx: typer.Context,
        shell: str = typer.Argument(
            ...,
            metavar="bash|zsh|fish",
            help="The shell to write the script for.",
            show_default=False,
        ),
    ) -> None:
        """Print a shell completion script for tbon.

        Load it in the running shell with `source <(tbon completion bash)` (zsh: the same, once
        compinit has run; fish: `tbon completion fish | source`), or save it where the shell
        looks for completions: for bash ~/.local/share/bash-completion/completions/tbon, for zsh
        a file named _tbon in a directory of $fpath, for fish ~/.config/fish/completions/tbon.fish.
        """
        if shell not in SHELLS:
            raise UsageError(f"invalid shell {shell!r}: use one of {', '.join(SHELLS)}")
        commands = describe(ctx.find_root().command, ctx.find_root())
        typer.echo(SCRIPTS[shell](commands), nl=False)


# --- what there is to complete --------------------------------------------------------------


def _choices(metavar: str | None) -> list[str]:
    """`ssh|mpiexec|srun|local` lists the words it takes; `STATE` or `FILE` does not."""
    if metavar and re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)+", metavar):
        return metavar.split("|")
    return []


def option_values(group: Any, name: str) -> dict[str, tuple[str, ...]]:
    """The words each option of command `name` takes, as its module lists them in
    OPTION_VALUES (long option name -> words), for options whose metavar names no words
    (`--color WHEN`); ARGUMENT_VALUES lists words its positional arguments take."""
    module = getattr(group, "command_modules", {}).get(name)
    return getattr(importlib.import_module(module), "OPTION_VALUES", {}) if module else {}


def argument_values(group: Any, name: str) -> list[str]:
    module = getattr(group, "command_modules", {}).get(name)
    return list(getattr(importlib.import_module(module), "ARGUMENT_VALUES", ())) if module else []


def describe(group: Any, ctx: Any) -> list[Command]:
    """Every visible command of `group`, with its options, in the order `tbon --help` lists."""
    from tbon.overlay.broker import main as broker

    commands = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        about = command.short_help or first_paragraph(command.help or "")
        if name == "broker":  # parsed outside Typer: its options are in its own table
            options = [Option(list(n), h, bool(m)) for n, m, h in broker.OPTIONS]
            commands.append(Command(name, about, options))
            continue
        options = [Option(["-h", "--help"], "Show this message and exit.", False)]
        arguments: list[str] = argument_values(group, name)
        values = option_values(group, name)
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            if param.param_type_name == "argument":
                arguments += _choices(param.metavar)
                continue
            flag = bool(getattr(param, "is_flag", False) or getattr(param, "count", False))
            names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))
            help_ = first_paragraph(param.help or "")
            words = _choices(param.metavar)
            for long_name in param.opts:
                words = words or list(values.get(long_name, ()))
            options.append(Option(names, help_, not flag, words))
        commands.append(Command(name, about, options[1:] + options[:1], arguments))
    return commands


def attribute_names() -> list[str]:
    from tbon.overlay.config.attributes import KNOWN

    return sorted(f"{name}=" for name in KNOWN)


ROOT_OPTIONS = [
    Option(["--version"], "Print the version.", False),
    Option(["-h", "--help"], "Show this message and exit.", False),
]
SETATTR = ("-S", "--setattr")


# --- bash -----------------------------------------------------------------------------------


def bash(commands: list[Command]) -> str:
    cases = []
    for command in commands:
        names = " ".join(n for o in command.options for n in o.names)
        valued = " ".join(n for o in command.options if o.takes_value for n in o.names)
        cases.append(
            f'        {command.name}) options="{names}" valued="{valued}"'
            f' arguments="{" ".join(command.arguments)}" ;;'
        )
    choices = []
    for command in commands:
        for option in command.options:
            if option.choices:
                pattern = "|".join(f"{command.name}:{n}" for n in option.names)
                choices.append(f'        {pattern}) words="{" ".join(option.choices)}" ;;')
    return BASH.format(
        commands=" ".join(c.name for c in commands),
        roots=" ".join(n for o in ROOT_OPTIONS for n in o.names),
        cases="\n".join(cases),
        choices="\n".join(choices) or "        -) ;;",
        attributes=" ".join(attribute_names()),
        setattr="|".join(SETATTR),
        where=WHERE["bash"],
    )


BASH = """\
# bash completion for tbon: `source <(tbon completion bash)`, or save it as
# {where}
_tbon() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local command="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        if [[ ${{COMP_WORDS[i]}} != -* ]]; then
            command=${{COMP_WORDS[i]}}
            break
        fi
    done
    COMPREPLY=()
    if [[ -z $command ]]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "{roots}" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "{commands}" -- "$cur"))
        fi
        return 0
    fi
    local options="" valued="" arguments="" words=""
    case $command in
{cases}
        *) return 0 ;;
    esac
    if [[ $prev == -* && " $valued " == *" $prev "* ]]; then
        case $command:$prev in
{choices}
        esac
        case $prev in
            {setattr}) words="{attributes}"; compopt -o nospace 2>/dev/null ;;
        esac
        # Nothing listed: -o default offers files.
        [[ -n $words ]] && COMPREPLY=($(compgen -W "$words" -- "$cur"))
        return 0
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
    elif [[ -n $arguments ]]; then
        COMPREPLY=($(compgen -W "$arguments" -- "$cur"))
    fi
    return 0
}}
complete -o default -F _tbon tbon
"""


# --- zsh ------------------------------------------------------------------------------------


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh_item(name: str, text: str) -> str:
    return _zsh_quote(name.replace(":", "\\:") + ":" + text)


def zsh(commands: list[Command]) -> str:
    listed = "\n".join(f"    {_zsh_item(c.name, c.help)}" for c in commands)
    roots = " ".join(_zsh_item(n, o.help) for o in ROOT_OPTIONS for n in o.names)
    cases = []
    for command in commands:
        items = " ".join(_zsh_item(n, o.help) for o in command.options for n in o.names)
        valued = " ".join(n for o in command.options if o.takes_value for n in o.names)
        choices = " ".join(
            _zsh_quote(f"{n}={' '.join(o.choices)}")
            for o in command.options
            if o.choices
            for n in o.names
        )
        arguments = " ".join(command.arguments)
        cases.append(
            f"        {command.name})\n"
            f"            options=({items})\n"
            f"            valued=({valued})\n"
            f"            choices=({choices})\n"
            f"            arguments=({arguments}) ;;"
        )
    return ZSH.format(
        commands=listed,
        roots=roots,
        cases="\n".join(cases),
        attributes=" ".join(attribute_names()),
        setattr="|".join(SETATTR),
        where=WHERE["zsh"],
    )


ZSH = """\
#compdef tbon
# zsh completion for tbon: `source <(tbon completion zsh)` once compinit has run, or save it in
# {where}
_tbon() {{
    local -a commands roots options valued choices arguments
    commands=(
{commands}
    )
    roots=({roots})
    local command="" i
    for ((i = 2; i < CURRENT; i++)); do
        if [[ $words[i] != -* ]]; then
            command=$words[i]
            break
        fi
    done
    if [[ -z $command ]]; then
        if [[ $PREFIX == -* ]]; then
            _describe -t options option roots
        else
            _describe -t commands command commands
        fi
        return
    fi
    case $command in
{cases}
        *) return 1 ;;
    esac
    local prev=$words[CURRENT-1] choice
    if [[ $prev == -* && ${{valued[(Ie)$prev]}} -gt 0 ]]; then
        case $prev in
            {setattr}) compadd -S '' -- {attributes}; return ;;
        esac
        for choice in $choices; do
            if [[ ${{choice%%=*}} == $prev ]]; then
                compadd -- ${{=choice#*=}}
                return
            fi
        done
        _files
        return
    fi
    if [[ $PREFIX == -* ]]; then
        _describe -t options option options
    elif (( $#arguments )); then
        compadd -- $arguments
    else
        _files
    fi
}}
if [[ $funcstack[1] == _tbon ]]; then
    _tbon "$@"
else
    compdef _tbon tbon
fi
"""


# --- fish -----------------------------------------------------------------------------------


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(commands: list[Command]) -> str:
    lines = [
        "# fish completion for tbon: `tbon completion fish | source`, or save it as",
        f"# {WHERE['fish']}",
        "complete -c tbon -e",
        "complete -c tbon -n __fish_use_subcommand -f",
    ]
    for option in ROOT_OPTIONS:
        lines.append(
            f"complete -c tbon -n __fish_use_subcommand {_fish_names(option)}"
            f" -d {_fish_quote(option.help)}"
        )
    for command in commands:
        lines.append(
            f"complete -c tbon -n __fish_use_subcommand -a {command.name}"
            f" -d {_fish_quote(command.help)}"
        )
    attributes = " ".join(attribute_names())
    for command in commands:
        when = f"-n {_fish_quote('__fish_seen_subcommand_from ' + command.name)}"
        for option in command.options:
            line = f"complete -c tbon {when} {_fish_names(option)}"
            if set(option.names) & set(SETATTR):
                line += f" -x -a {_fish_quote(attributes)}"
            elif option.choices:
                line += f" -x -a {_fish_quote(' '.join(option.choices))}"
            elif option.takes_value:
                line += " -r"
            lines.append(f"{line} -d {_fish_quote(option.help)}")
        if command.arguments:
            lines.append(
                f"complete -c tbon {when} -f -a {_fish_quote(' '.join(command.arguments))}"
            )
    return "\n".join(lines) + "\n"


def _fish_names(option: Option) -> str:
    parts = []
    for name in option.names:
        if name.startswith("--"):
            parts.append(f"-l {name[2:]}")
        else:
            parts.append(f"-s {name[1:]}")
    return " ".join(parts)


SCRIPTS = {"bash": bash, "zsh": zsh, "fish": fish}
