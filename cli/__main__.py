from tbon.cli.main import _entry

_entry()
