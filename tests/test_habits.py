"""Habits a Flux user brings (issue 22): each as a user would try it."""

from __future__ import annotations

from conftest import tbon


def test_relay_help_exits_0_and_says_what_it_is() -> None:
    for flag in ("--help", "-h"):
        result = tbon("relay", flag)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage: tbon relay PATH\n"), result.stdout
        assert "ssh" in result.stdout and result.stderr == ""
    wrong = tbon("relay")
    assert wrong.returncode == 2 and wrong.stdout == ""
