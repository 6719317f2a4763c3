"""tbon: an elastic, authenticated tree of message brokers.

The code lives in three packages, each a top-level folder of the repository: `tbon.cli` (cli/,
the commands), `tbon.overlay` (overlay/, the broker) and `tbon.keys` (keys/, keys and
certificates). This package holds only what all of them share: the errors a user may see and
the exit codes that report them.
"""
