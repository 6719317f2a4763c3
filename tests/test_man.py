"""Every command has a man page that renders cleanly and documents every option it takes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import typer

from tbon.cli.app import COMMAND_MODULES, app

MAN = Path(__file__).resolve().parent.parent / "man"
PAGES = sorted(MAN.glob("*.[15]"))


def options_of(command: str) -> list[str]:
    click_group = typer.main.get_command(app)
    params = click_group.commands[command].params  # type: ignore[attr-defined]
    shown = [p for p in params if not getattr(p, "hidden", False)]
    return [name for p in shown for name in p.opts if name.startswith("--")]


def test_every_command_has_a_page() -> None:
    names = {page.name for page in PAGES}
    assert "tbon.1" in names
    missing = [c for c in COMMAND_MODULES if f"tbon-{c}.1" not in names]
    assert not missing, f"commands without a man page: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_renders_without_warnings(page: Path) -> None:
    result = subprocess.run(
        ["groff", "-ww", "-man", "-Tutf8", str(page)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    shown = re.sub(".\x08", "", result.stdout)  # grotty's overstruck bold
    assert "NAME" in shown and "SYNOPSIS" in shown


@pytest.mark.parametrize("command", [c for c in COMMAND_MODULES if c != "broker"])
def test_page_documents_every_option(command: str) -> None:
    text = (MAN / f"tbon-{command}.1").read_text().replace("\\-", "-").replace("\\f", "")
    undocumented = [o for o in options_of(command) if o not in text and o != "--help"]
    assert not undocumented, f"tbon-{command}.1 lacks {undocumented}"


def test_broker_page_documents_every_attribute_and_exit_code() -> None:
    from tbon.overlay.config.attributes import KNOWN

    text = (MAN / "tbon-broker.1").read_text().replace("\\-", "-").replace("\\&", "")
    missing = [name for name in sorted(KNOWN) if name not in text]
    assert not missing, f"tbon-broker.1 lacks attributes {missing}"
    for code in ("69", "75", "77"):
        assert code in text


def test_tbon_page_lists_every_command_and_how_to_complete_and_find_pages() -> None:
    text = (MAN / "tbon.1").read_text().replace("\\-", "-")
    commands = text.split(".SH COMMANDS", 1)[1].split(".SH ", 1)[0]
    missing = [c for c in COMMAND_MODULES if f".B tbon {c}\n" not in commands]
    assert not missing, f"tbon.1 lists no {missing}"
    for shell in ("bash", "zsh", "fish"):
        assert f"tbon completion {shell}" in text
    assert "share/man" in text and "pgrep -f" in text
