"""How every Typer command of tbon explains itself and reads its numbers.

`TbonCommand` and `TbonGroup` are the Click classes behind `tbon` and each of its commands (the
app in cli/app.py makes every command with them). They print help in tbon's own layout
(tbon/helptext.py, which `tbon broker --help` uses too) instead of Typer's: paragraphs rewrapped
to the terminal, metavars a person reads (`RANK`, `[COMMAND]...`; a flag has none). They check
every whole number on the command line before Typer hands it to its validation library, so that
a bad one is refused in tbon's words, `invalid --count '0': use a whole number of 1 or more`,
and a usage error found while parsing a command's options names that command.

Two things keep a command quick to start (`tbon status --json` pays for nothing it does not
use). A TbonGroup loads a command's module only when that command is asked for (`LazyCommands`),
while `tbon --help` and completion still list them all. And the values of tbon's plain
parameters (`str`, `bool`, `int`, `list[str]`) are converted here (`PlainValue`) instead of through
Typer's pydantic adapters, whose import alone costs about 100 ms; a value they do not take as
they are (anything but ASCII digits for an `int`) still goes through Typer's own conversion, so
what is accepted and every message are unchanged.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import typer
from typer._click import Command, Context
from typer._click.exceptions import (
    BadParameter,
    MissingParameter,
    NoArgsIsHelpError,
    UsageError,
)
from typer._coercion import RuntimeParam, build_runtime_param
from typer.core import TyperCommand, TyperGroup

from tbon.overlay.parse.numbers import is_decimal

if TYPE_CHECKING:
    from tbon.helptext import HelpPage


class _TbonWords:
    """What commands and the group share: help as tbon lays it out, errors in tbon's words."""

    def get_help(self, ctx: Context) -> str:
        raise NotImplementedError

    def format_help(self, ctx: Context, formatter: Any) -> None:
        formatter.write(self.get_help(ctx) + "\n")

    def get_help_option(self, ctx: Context) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            _convert_plainly(option)
        return option

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc]
        except UsageError as error:
            raise _in_tbon_terms(error, ctx) from None


class TbonCommand(_TbonWords, TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if _number_kind(param) is not None:
                _check_numbers_of(param)
            _convert_plainly(param)

    def get_help(self, ctx: Context) -> str:
        from tbon.helptext import render  # help only: not paid by a command that runs

        return render(command_page(self, ctx)).rstrip("\n")


class TbonGroup(_TbonWords, TyperGroup):
    command_modules: dict[str, str] = {}
    """Command name -> module whose `register(app)` adds that command, imported on demand."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(self.commands, self.command_modules)
        for param in self.params:
            _convert_plainly(param)

    def get_help(self, ctx: Context) -> str:
        from tbon.helptext import render

        return render(group_page(self, ctx)).rstrip("\n")


class TbonApp(typer.Typer):
    """A Typer app whose commands are all TbonCommands, in a TbonGroup (or `group`, a
    subclass of it that names the modules of its commands)."""

    def __init__(self, *, group: type[TbonGroup] = TbonGroup, **kwargs: Any) -> None:
        super().__init__(cls=group, **kwargs)

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or TbonCommand, **kwargs)


class LazyCommands(MutableMapping[str, Command]):
    """A group's commands, by name: those registered on the app itself, then one per module of
    `modules`, in that order. A module is imported, and its command built by Typer as the app
    would have built it, the first time that command is looked up."""

    def __init__(self, loaded: Mapping[str, Command], modules: dict[str, str]) -> None:
        self._loaded = dict(loaded)
        self._modules = dict(modules)

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded:
            if name not in self._modules:
                raise KeyError(name)
            self._loaded[name] = load_command(self._modules[name])
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        found = name in self._loaded or name in self._modules
        self._loaded.pop(name, None)
        self._modules.pop(name, None)
        if not found:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._loaded
        yield from (name for name in self._modules if name not in self._loaded)

    def __len__(self) -> int:
        return len(self._loaded.keys() | self._modules.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._modules


def load_command(module: str) -> Command:
    """The one command that `module`'s `register(app)` adds, built by Typer."""
    app = TbonApp()
    importlib.import_module(module).register(app)
    (info,) = app.registered_commands
    return typer.main.get_command_from_info(
        info,
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
    )


# --- converting plain values ----------------------------------------------------------------


class PlainValue(RuntimeParam):
    """Typer's conversion of a `str`, `bool`, `int` or `list[...]` of them, for the values it
    leaves as they are: a string for `str`, a bool for `bool`, an int or ASCII digits in range
    for `int`. Any other value goes
    to Typer's own conversion (built, and pydantic imported, only then), so that it is refused or
    converted exactly as before. A plain class, where Typer's are dataclasses: one is built at
    every command's start, and a dataclass costs ~0.5 ms to build."""

    fallback: list[RuntimeParam]
    """Typer's own conversion, once a value needs it."""

    def __init__(self, parameter_info: Any, annotation: Any) -> None:
        super().__init__(parameter_info, annotation)  # RuntimeParam's: a frozen dataclass
        object.__setattr__(self, "fallback", [])  # frozen, as RuntimeParam's own fields are

    def _coerce_value(self, value: Any, param: Any, ctx: Context) -> Any:
        if _is_list(self.annotation):
            leaf = self.annotation.__args__[0]
            items = value if isinstance(value, list | tuple) else [value]
            converted: Any = [self._plain(leaf, item) for item in items]
            refused = _REFUSED in converted
        else:
            converted = self._plain(self.annotation, value)
            refused = converted is _REFUSED
        if not refused:
            return converted
        if not self.fallback:
            self.fallback.append(build_runtime_param(param.type_descriptor))
        return self.fallback[0]._coerce_value(value, param=param, ctx=ctx)

    def _plain(self, leaf: Any, value: Any) -> Any:
        if leaf is str or leaf is bool:
            return value if type(value) is leaf else _REFUSED
        if type(value) is str and _whole(value) and len(value) <= 4000:
            value = int(value)
        if type(value) is not int:
            return _REFUSED
        low, high = self.parameter_info.min, self.parameter_info.max
        if (low is not None and value < low) or (high is not None and value > high):
            return _REFUSED
        return value


_REFUSED = object()


def _whole(text: str) -> bool:
    """ASCII digits after at most one sign: what int() takes as typed, less what it forgives
    (spaces, underscores, other scripts' digits)."""
    return is_decimal(text[1:] if text[:1] in ("+", "-") else text)


def _is_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list and len(annotation.__args__) == 1


def _convert_plainly(param: Any) -> None:
    """Have `param` convert its values with PlainValue if its type is a plain one."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or descriptor.file_annotation is not None:
        return
    info = descriptor.parameter_info
    if info.parser is not None or info.clamp:
        return
    annotation = descriptor.annotation
    leaf = annotation.__args__[0] if _is_list(annotation) else annotation
    if leaf in (str, int, bool):
        param._runtime_param = PlainValue(info, annotation)


# --- help pages -----------------------------------------------------------------------------


def command_page(command: Any, ctx: Context) -> HelpPage:
    from tbon.helptext import HelpPage, Section

    params = command.get_params(ctx)
    shown = [p for p in params if not getattr(p, "hidden", False)]
    arguments = [p for p in shown if p.param_type_name == "argument"]
    options = [p for p in shown if p.param_type_name == "option"]
    usage = [ctx.command_path, *(["[OPTIONS]"] if options else [])]
    usage += [argument_metavar(p) for p in arguments]
    sections = [
        Section("Arguments", [(argument_metavar(p), p.help or "") for p in arguments if p.help]),
        Section("Options", [(option_term(p), option_text(p)) for p in options]),
    ]
    return HelpPage(" ".join(usage), command.help or "", sections, command.epilog or "")


def group_page(group: Any, ctx: Context) -> HelpPage:
    from tbon.helptext import Section, first_paragraph

    page = command_page(group, ctx)
    page.usage = f"{ctx.command_path} [OPTIONS] COMMAND [ARGS]..."
    rows = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is not None and not command.hidden:
            rows.append((name, command.short_help or first_paragraph(command.help or "")))
    page.sections.append(Section("Commands", rows))
    return page


def argument_metavar(param: Any) -> str:
    """`[URI]`, `PATH`, `[COMMAND]...`: the metavar as given (Typer's own adds brackets and
    dots around it a second time), else the name in capitals."""
    if param.metavar:
        return param.metavar
    name = (param.name or "").upper()
    name += "..." if param.nargs == -1 else ""
    return name if param.required else f"[{name}]"


def option_metavar(param: Any) -> str:
    """What follows an option that takes a value: its metavar, else its long name in capitals
    (`--count COUNT`); a flag takes none."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if param.metavar:
        return param.metavar
    longs = [o for o in param.opts if o.startswith("--")]
    return (longs[0] if longs else param.opts[0]).lstrip("-").upper().replace("-", "_")


def option_term(param: Any) -> str:
    """`-r, --rank RANK`: short names first, as Click and most tools list them."""
    names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))
    names += list(param.secondary_opts)
    metavar = option_metavar(param)
    return ", ".join(names) + (f" {metavar}" if metavar else "")


def option_text(param: Any) -> str:
    text = (param.help or "").strip()
    extra = []
    default = param.default
    shown = getattr(param, "show_default", True)
    if (
        shown is not False
        and not getattr(param, "is_flag", False)
        and default not in (None, "", [], ())
        and not callable(default)
    ):
        from tbon.helptext import KEEP

        extra.append(f"default:{KEEP}{default}")
    if param.required:
        extra.append("required")
    if extra:
        text = f"{text} [{'; '.join(extra)}]" if text else f"[{'; '.join(extra)}]"
    return text


# --- numbers in tbon's words ----------------------------------------------------------------


def _number_kind(param: Any) -> type | None:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None:
        return None
    annotation = descriptor.annotation
    inner = getattr(annotation, "__args__", None)
    if inner and getattr(annotation, "__origin__", None) in (list, tuple):
        annotation = inner[0]
    return annotation if annotation in (int, float) else None


def _check_numbers_of(param: Any) -> None:
    """Have `param` check what was typed before Typer converts it."""
    convert = param.process_value

    def process_value(ctx: Context, value: Any) -> Any:
        for text in value if isinstance(value, list | tuple) else [value]:
            if isinstance(text, str):
                check_number(param, text, ctx)
        return convert(ctx, value)

    param.process_value = process_value


def _describe_range(whole: bool, low: float | None, high: float | None) -> str:
    what = "a whole number" if whole else "a number"
    if low is not None and high is not None:
        return f"{what} from {low} to {high}"
    if low is not None:
        return f"{what} of {low} or more"
    if high is not None:
        return f"{what} of {high} or less"
    return what


def check_number(param: Any, text: str, ctx: Context | None) -> None:
    """A UsageError in tbon's words unless `text` is a number `param` takes."""
    whole = _number_kind(param) is int
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    value: float | None = None
    stripped = text.strip()
    if whole and _whole(stripped):
        huge = -1e30 if stripped.startswith("-") else 1e30  # int() refuses 4300 digits
        value = int(stripped) if len(stripped) <= 24 else huge
    elif not whole:
        try:
            value = float(stripped)
        except ValueError:
            value = None
        if value is not None and value != value:  # NaN
            value = None
    in_range = value is not None and (low is None or value >= low)
    in_range = in_range and (high is None or value <= high)
    if not in_range:
        shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"
        raise UsageError(
            f"invalid {param_name(param)} {shown!r}: use {_describe_range(whole, low, high)}",
            ctx=ctx,
        )


def param_name(param: Any) -> str:
    """How an error names a parameter: its long option, or its metavar."""
    if param.param_type_name == "argument":
        return argument_metavar(param)
    longs = [o for o in param.opts if o.startswith("--")]
    return longs[0] if longs else param.opts[0]


# --- usage errors ---------------------------------------------------------------------------


def _in_tbon_terms(error: UsageError, ctx: Context) -> UsageError:
    """The same error, naming this command, and said without Click's or pydantic's words."""
    if isinstance(error, NoArgsIsHelpError):
        return error
    if isinstance(error, MissingParameter) and error.param is not None:
        kind = error.param.param_type_name
        message = f"missing {kind} '{param_name(error.param)}'"
    elif isinstance(error, BadParameter) and error.param is not None:
        # Numbers are checked before this could happen; anything else Typer refuses.
        detail = error.message.rstrip(".")
        message = f"invalid {param_name(error.param)}: {detail[:1].lower()}{detail[1:]}"
    else:
        message = error.format_message()
        extra = re.fullmatch(r"Got unexpected extra argument\(s\) \((.*)\)", message)
        if extra:
            message = f"unexpected argument: {extra.group(1)}"
    replaced = UsageError(message, ctx=error.ctx or ctx)
    replaced.exit_code = error.exit_code
    return replaced
