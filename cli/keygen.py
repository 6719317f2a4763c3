"""`tbon keygen`: write a new CURVE certificate (key pair) to a file.

The work is in `tbon.keys.cert`; this module parses the command line and prints the result. Only
the public key and its fingerprint are printed: the secret key goes to the file and nowhere else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tbon.errors import UsageError

# One line per paragraph: Typer's rich help keeps the line breaks inside a paragraph.
HELP = "\n\n".join(
    [
        "Write a new CURVE certificate (a Curve25519 key pair) to PATH.",
        "The certificate is a TOML file with a metadata table (name, hostname, time, tbon-version)"
        " and a curve table (public-key, secret-key, both Z85-encoded). It holds a secret key, so"
        " it is created with mode 0600 whatever the umask, and written to a temporary file that is"
        " then renamed, so it is never seen half-written. An existing PATH is left alone unless"
        " --force is given.",
        "Brokers bootstrapped by PMI or FLUB make their own key pairs; a certificate file is for"
        " keys that must outlive a broker. On success the public key and its fingerprint are"
        " printed; the secret key never is.",
    ]
)


def register(app: typer.Typer) -> None:
    """Add the `keygen` command to the `tbon` application."""
    app.command(
        "keygen",
        help=HELP,
        short_help="Write a new CURVE certificate (key pair) to a file.",
    )(keygen)


def keygen(
    path: Annotated[
        Path,
        typer.Argument(
            metavar="PATH", help="File to write; its directory must exist.", show_default=False
        ),
    ],
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            metavar="NAME",
            help="Name recorded in the certificate; defaults to this host's name.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", "-f", help="Overwrite PATH if it exists (the old key is lost)."),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print {path, name, public_key, fingerprint} as one JSON object.",
        ),
    ] = False,
) -> None:
    """Write a new certificate to PATH and print its public key and fingerprint."""
    from tbon.keys.cert import fingerprint, new_certificate, write_certificate

    if name is not None and (not name.strip() or not name.isprintable()):
        raise UsageError(f"invalid value for --name: {name!r} (must be printable, not blank)")
    cert = new_certificate(name)
    write_certificate(path, cert, force=force)
    fp = fingerprint(cert.public)
    if as_json:
        record = {
            "path": str(path),
            "name": cert.name,
            "public_key": cert.public,
            "fingerprint": fp,
        }
        typer.echo(json.dumps(record))
    else:
        typer.echo(f"tbon keygen: wrote {path} (public key {cert.public}, fingerprint {fp})")
