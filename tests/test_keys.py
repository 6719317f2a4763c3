"""Tests of `tbon.keys.cert` and of `tbon keygen`, the latter through the real console script."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from datetime import datetime
from importlib.metadata import version
from pathlib import Path

import nacl.public
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner
from zmq.utils import z85

from tbon.errors import TbonError
from tbon.keys.cert import (
    MAX_CERTIFICATE_BYTES,
    Certificate,
    decode_key,
    fingerprint,
    generate_keypair,
    load_certificate,
    new_certificate,
    public_from_secret,
    write_certificate,
)

TBON = Path(sys.executable).parent / "tbon"
Z85_CHARS = z85.Z85CHARS.decode("ascii")
FINGERPRINT = re.compile(r"SHA256:[0-9a-f]{16}")
# The function-scoped tmp_path is shared by a test's examples on purpose: each example rewrites it.
FILE_EXAMPLES = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def replace(cert: Certificate, **changes: str | None) -> Certificate:
    """`cert` with some fields changed (a Record has no dataclasses.replace)."""
    fields = {name: getattr(cert, name) for name in Certificate.__slots__}
    return Certificate(**{**fields, **changes})  # type: ignore[arg-type]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load_error(path: Path) -> str:
    """The message of the TbonError that loading ``path`` raises, checked to be one line."""
    with pytest.raises(TbonError) as caught:
        load_certificate(path)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"{path}: ")
    assert caught.value.exit_code == 1
    return message


# --- keys -------------------------------------------------------------------------------------


def test_generate_keypair_gives_a_matching_z85_pair() -> None:
    public, secret = generate_keypair()
    assert len(public) == len(secret) == 40
    assert set(public + secret) <= set(Z85_CHARS)
    assert public_from_secret(secret) == public
    assert len(decode_key(public)) == len(decode_key(secret)) == 32


def test_generate_keypair_is_fresh_each_time() -> None:
    pairs = {generate_keypair() for _ in range(20)}
    assert len(pairs) == 20


@given(st.binary(min_size=32, max_size=32))
def test_public_from_secret_agrees_with_nacl(raw: bytes) -> None:
    secret = z85.encode(raw).decode("ascii")
    expected = z85.encode(bytes(nacl.public.PrivateKey(raw).public_key)).decode("ascii")
    assert public_from_secret(secret) == expected
    assert decode_key(secret) == raw


@given(st.binary(min_size=32, max_size=32))
def test_fingerprint_is_sha256_of_the_raw_key(raw: bytes) -> None:
    public = z85.encode(raw).decode("ascii")
    assert fingerprint(public) == "SHA256:" + hashlib.sha256(raw).hexdigest()[:16]
    assert FINGERPRINT.fullmatch(fingerprint(public))


def test_fingerprint_is_stable() -> None:
    public = z85.encode(bytes(range(32))).decode("ascii")
    assert fingerprint(public) == "SHA256:630dcd2966c43366"
    assert fingerprint(public) == fingerprint(public)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "0" * 39,
        "0" * 41,
        "0" * 39 + '"',
        "0" * 39 + "\\",
        "0" * 39 + "é",
        "%nSc1" + "0" * 35,  # the first group overflows 32 bits
        "#" * 40,
    ],
)
def test_decode_key_rejects_malformed_keys(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        decode_key(text)
    if text:
        assert text not in str(caught.value)  # a key may be a secret: never quote it


def test_decode_key_rejects_non_strings() -> None:
    with pytest.raises(ValueError):
        decode_key(b"0" * 40)  # type: ignore[arg-type]


@given(st.text(alphabet=Z85_CHARS, min_size=40, max_size=40))
def test_decode_key_accepts_exactly_the_canonical_keys(text: str) -> None:
    try:
        raw = decode_key(text)
    except ValueError:
        return
    assert z85.encode(raw).decode("ascii") == text


# --- certificates -----------------------------------------------------------------------------


def test_new_certificate_defaults() -> None:
    import socket

    cert = new_certificate()
    assert cert.name == cert.hostname == socket.gethostname()
    assert cert.version == version("tbon")
    assert public_from_secret(cert.secret or "") == cert.public
    created = datetime.fromisoformat(cert.created.replace("Z", "+00:00"))
    assert created.utcoffset() is not None and created.utcoffset().total_seconds() == 0
    assert new_certificate("login1").name == "login1"


def test_certificate_repr_hides_the_secret() -> None:
    cert = new_certificate()
    assert cert.secret is not None
    assert cert.secret not in repr(cert) and cert.secret not in str(cert)
    assert cert.public in repr(cert)


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    cert = new_certificate("node17")
    write_certificate(path, cert)
    assert load_certificate(path) == cert
    assert load_certificate(str(path)) == cert
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.toml"]  # no temporary left


def test_file_layout(tmp_path: Path) -> None:
    import tomllib

    path = tmp_path / "node.toml"
    cert = new_certificate("node17")
    write_certificate(path, cert)
    document = tomllib.loads(path.read_text())
    assert document == {
        "metadata": {
            "name": "node17",
            "hostname": cert.hostname,
            "time": cert.created,
            "tbon-version": cert.version,
        },
        "curve": {"public-key": cert.public, "secret-key": cert.secret},
    }


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_written_mode_is_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "node.toml"
    old = os.umask(umask)
    try:
        write_certificate(path, new_certificate())
        assert mode_of(path) == 0o600
        write_certificate(path, new_certificate(), force=True)
        assert mode_of(path) == 0o600
    finally:
        os.umask(old)


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    first = new_certificate()
    write_certificate(path, first)
    with pytest.raises(TbonError) as caught:
        write_certificate(path, new_certificate())
    assert str(caught.value) == f"{path} already exists: use --force to overwrite it"
    assert caught.value.exit_code == 1
    assert load_certificate(path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.toml"]


def test_refuses_to_overwrite_a_dangling_symlink(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(TbonError, match="already exists"):
        write_certificate(path, new_certificate())
    assert not (tmp_path / "elsewhere.toml").exists()


def test_force_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("old and loose\n")
    path.chmod(0o644)
    cert = new_certificate()
    write_certificate(path, cert, force=True)
    assert load_certificate(path) == cert
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.toml"]


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "node.toml"
    with pytest.raises(TbonError) as caught:
        write_certificate(path, new_certificate())
    message = str(caught.value)
    assert "\n" not in message
    assert message == f"cannot write {path}: directory {path.parent} does not exist"


def test_parent_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(TbonError, match="is not a directory"):
        write_certificate(tmp_path / "file" / "node.toml", new_certificate())


def test_force_onto_a_directory_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "node.toml").mkdir()
    with pytest.raises(TbonError, match=r"^cannot write .*node\.toml: "):
        write_certificate(tmp_path / "node.toml", new_certificate(), force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["node.toml"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o666])
def test_secret_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.toml"
    cert = new_certificate()
    write_certificate(path, cert)
    path.chmod(mode)
    message = load_error(path)
    assert message.endswith(
        f"is readable by group or others (mode {mode:04o}): run chmod 600 {path}"
    )
    assert cert.secret is not None and cert.secret not in message


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_secret_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.toml"
    write_certificate(path, new_certificate())
    path.chmod(mode)
    assert load_error(path).endswith(
        f"is writable by group or others (mode {mode:04o}): run chmod 600 {path}"
    )


@pytest.mark.parametrize("mode", [0o400, 0o600, 0o700])
def test_owner_only_modes_are_accepted(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.toml"
    cert = new_certificate()
    write_certificate(path, cert)
    path.chmod(mode)
    assert load_certificate(path) == cert


def test_public_only_certificate_loads_whatever_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "node.pub.toml"
    cert = replace(new_certificate(), secret=None)
    write_certificate(path, cert)
    assert "secret" not in path.read_text()
    path.chmod(0o644)
    loaded = load_certificate(path)
    assert loaded == cert
    assert loaded.secret is None


def test_mismatched_public_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    other_public, _ = generate_keypair()
    cert = replace(new_certificate(), public=other_public)
    write_certificate(path, cert)
    message = load_error(path)
    assert message.endswith("[curve] public-key does not match secret-key")
    assert cert.secret is not None and cert.secret not in message


def test_mismatch_is_reported_after_a_loose_mode(tmp_path: Path) -> None:
    """A loose mode is the first thing to fix: the secret may already have leaked."""
    path = tmp_path / "node.toml"
    other_public, _ = generate_keypair()
    write_certificate(path, replace(new_certificate(), public=other_public))
    path.chmod(0o644)
    assert "chmod 600" in load_error(path)


def test_missing_file(tmp_path: Path) -> None:
    assert load_error(tmp_path / "absent.toml").endswith(": no such file")


def test_directory_is_not_a_certificate(tmp_path: Path) -> None:
    assert load_error(tmp_path).endswith(": not a regular file")


def _key(fill: int) -> str:
    return z85.encode(bytes([fill]) * 32).decode("ascii")


GOOD = new_certificate("fixture")
GOOD_SECRET = GOOD.secret or ""
GARBAGE: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "no [curve] table"),
    "binary": (b"\x00\xff\xfe garbage", "not UTF-8"),
    "not toml": (b"this is = = not toml [\n", "not valid TOML"),
    "ssh key": (b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n", "not valid TOML"),
    "curve not a table": (b'curve = "x"\n', "no [curve] table"),
    "metadata not a table": (
        f'metadata = 3\n[curve]\npublic-key = "{GOOD.public}"\n'.encode(),
        "[metadata] must be a table",
    ),
    "no public key": (f'[curve]\nsecret-key = "{GOOD_SECRET}"\n'.encode(), "missing"),
    "public key not a string": (b"[curve]\npublic-key = 5\n", "bad [curve] public-key"),
    "public key too short": (b'[curve]\npublic-key = "abc"\n', "not 3"),
    "public key bad character": (
        ('[curve]\npublic-key = "' + "0" * 39 + '~"\n').encode(),
        "only Z85 characters",
    ),
    "public key overflows": (
        ('[curve]\npublic-key = "' + "#" * 40 + '"\n').encode(),
        "overflows 32 bits",
    ),
    "secret key malformed": (
        f'[curve]\npublic-key = "{GOOD.public}"\nsecret-key = "{"0" * 20}"\n'.encode(),
        "bad [curve] secret-key",
    ),
    "secret key not a string": (
        f'[curve]\npublic-key = "{GOOD.public}"\nsecret-key = [1, 2]\n'.encode(),
        "bad [curve] secret-key",
    ),
    "name not a string": (
        f'[metadata]\nname = 17\n[curve]\npublic-key = "{_key(1)}"\n'.encode(),
        "[metadata] name must be a string",
    ),
    "too large": (b"#" * (MAX_CERTIFICATE_BYTES + 1), "too large"),
}


@pytest.mark.parametrize("content, problem", GARBAGE.values(), ids=list(GARBAGE))
def test_garbage_is_refused_on_one_line(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "node.toml"
    path.write_bytes(content)
    path.chmod(0o600)
    message = load_error(path)
    assert problem in message
    assert GOOD_SECRET not in message


def test_metadata_is_optional_and_a_toml_datetime_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    public = _key(7)
    path.write_text(f'[metadata]\ntime = 2025-01-31T12:00:00Z\n[curve]\npublic-key = "{public}"\n')
    assert load_certificate(path) == Certificate(
        public=public,
        secret=None,
        name="",
        hostname="",
        created="2025-01-31T12:00:00+00:00",
        version="",
    )


@FILE_EXAMPLES
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_file_loads_or_fails_on_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(content)
    path.chmod(0o600)
    try:
        load_certificate(path)
    except TbonError as error:
        assert "\n" not in str(error) and str(error).startswith(f"{path}: ")


@FILE_EXAMPLES
@given(
    public=st.one_of(
        st.text(alphabet=Z85_CHARS, min_size=40, max_size=40),
        st.text(max_size=45),
        st.integers(),
    ),
    secret=st.none() | st.text(alphabet=Z85_CHARS, min_size=40, max_size=40) | st.text(),
)
def test_any_curve_table_loads_or_fails_on_one_line(
    tmp_path: Path, public: object, secret: str | None
) -> None:
    import tomli_w

    curve: dict[str, object] = {"public-key": public}
    if secret is not None:
        curve["secret-key"] = secret
    path = tmp_path / "fuzz.toml"
    path.write_text(tomli_w.dumps({"curve": curve}))
    path.chmod(0o600)
    try:
        cert = load_certificate(path)
    except TbonError as error:
        message = str(error)
        assert "\n" not in message and message.startswith(f"{path}: ")
        # Only a key-shaped secret can be told apart from the messages' own words.
        if secret is not None and len(secret) == 40 and set(secret) <= set(Z85_CHARS):
            assert secret not in message.removeprefix(f"{path}: ")
        return
    assert cert.public == public
    if secret is not None:
        assert public_from_secret(secret) == public


# --- the keygen command, in process -----------------------------------------------------------


def keygen_app() -> typer.Typer:
    """An app holding `keygen` alone, so the command can be tried before its siblings exist."""
    from tbon.cli import keygen

    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        """Keep `keygen` a subcommand."""

    keygen.register(app)
    return app


def test_keygen_command_in_process(tmp_path: Path) -> None:
    runner = CliRunner()
    path = tmp_path / "a.toml"
    result = runner.invoke(keygen_app(), ["keygen", str(path), "--name", "n1"])
    assert result.exit_code == 0, result.output
    cert = load_certificate(path)
    assert cert.name == "n1"
    assert result.output == (
        f"tbon keygen: wrote {path} (public key {cert.public},"
        f" fingerprint {fingerprint(cert.public)})\n"
    )

    result = runner.invoke(keygen_app(), ["keygen", str(path), "--json", "--force"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    cert = load_certificate(path)
    assert record == {
        "path": str(path),
        "name": cert.hostname,
        "public_key": cert.public,
        "fingerprint": fingerprint(cert.public),
    }


# --- the keygen command, through the real console script --------------------------------------


def tbon(*args: str | Path, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TBON_DEBUG", "TBON_URI")}
    env["COLUMNS"] = "100"
    return subprocess.run(
        [str(TBON), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        umask=umask,
        timeout=60,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def test_cli_keygen_writes_a_0600_certificate(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    result = tbon("keygen", path, umask=0)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert mode_of(path) == 0o600
    cert = load_certificate(path)
    assert result.stdout == (
        f"tbon keygen: wrote {path} (public key {cert.public},"
        f" fingerprint {fingerprint(cert.public)})\n"
    )
    assert cert.secret is not None and cert.secret not in result.stdout


def test_cli_keygen_refuses_to_overwrite_then_forces(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    assert tbon("keygen", path).returncode == 0
    first = load_certificate(path)

    line = assert_one_line_error(tbon("keygen", path), 1)
    assert line == f"tbon keygen: {path} already exists: use --force to overwrite it"
    assert load_certificate(path) == first

    result = tbon("keygen", "--force", path)
    assert result.returncode == 0, result.stderr
    second = load_certificate(path)
    assert second.public != first.public
    assert mode_of(path) == 0o600


def test_cli_keygen_json(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    result = tbon("keygen", path, "--json", "--name", "login1")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    cert = load_certificate(path)
    assert record == {
        "path": str(path),
        "name": "login1",
        "public_key": cert.public,
        "fingerprint": fingerprint(cert.public),
    }
    assert cert.secret is not None and cert.secret not in result.stdout


def test_cli_keygen_missing_directory(tmp_path: Path) -> None:
    line = assert_one_line_error(tbon("keygen", tmp_path / "no" / "node.toml"), 1)
    assert line.startswith("tbon keygen: cannot write ")


def test_cli_keygen_bad_name_is_a_usage_error(tmp_path: Path) -> None:
    line = assert_one_line_error(tbon("keygen", tmp_path / "a.toml", "--name", " "), 2)
    assert "--name" in line
    assert not (tmp_path / "a.toml").exists()


def test_cli_keygen_without_path_is_a_usage_error() -> None:
    result = tbon("keygen")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_cli_keygen_help() -> None:
    result = tbon("keygen", "--help")
    assert result.returncode == 0, result.stderr
    assert "0600" in result.stdout
    assert "--force" in result.stdout
    assert "--json" in result.stdout
