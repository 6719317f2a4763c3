"""A broker's start-up, before its loop: its key pair, its rank (by one of the four bootstraps in
overlay/boot/), the children's ROUTER if its rank has children, then its run directory, its
local socket and its link to the parent.

`boot` makes a `Booted`, in the order that bootstrap demands (a parent binds before its card is
shared, children are authorized before they connect); `open_links` adds the rest. Whatever fails
half-way is closed again here, so the caller has nothing to guard.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import zmq

from tbon import exitcodes, tmpdir
from tbon.errors import TbonError
from tbon.keys.cert import generate_keypair
from tbon.overlay.boot.pmi_client import PmiClient
from tbon.overlay.boot.singleton import singleton_wireup
from tbon.overlay.boot.wireup import Wireup
from tbon.overlay.config.attributes import BrokerConfig, host_address
from tbon.overlay.links.local import LocalServer
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.standbys import MAX_STANDBYS
from tbon.overlay.state.topology import Topology

if TYPE_CHECKING:
    from tbon.overlay.boot.config_file import BootConfig
    from tbon.overlay.links.children import Children
    from tbon.overlay.links.parent import ParentLink
    from tbon.overlay.links.uplink import Uplink

# Each bootstrap's module (config_file, flub with the client it joins through, pmi) is imported
# by the broker that boots that way only: a broker's memory is mostly the modules it loaded.


class Booted:
    """What boot made. Plain classes here, not dataclasses, for start-up time (tbon/record.py)."""

    __slots__ = ("by_config", "children", "config", "endpoint", "pmi", "public", "secret", "wireup")

    def __init__(
        self,
        config: BrokerConfig,
        public: str,
        secret: str,
        wireup: Wireup,
        children: Children | None,
        endpoint: str,
        pmi: PmiClient | None,
        by_config: bool,
    ) -> None:
        self.config = config  # a joiner's carries the instance's liveness settings
        self.public, self.secret, self.wireup = public, secret, wireup
        self.children = children  # bound if the rank has children
        self.endpoint = endpoint  # what children dial: the address bound, or the config file's
        self.pmi = pmi  # finalized once the broker is in the tree
        self.by_config = by_config  # config-file bootstrap: its ranks belong to their hosts

    def close(self) -> None:
        if self.children is not None:
            self.children.close()


def boot(config: BrokerConfig, context: zmq.Context) -> Booted:
    """Learn this broker's rank and parent, binding the children's ROUTER on the way."""
    binder = _Binder(context, config)
    try:
        return _boot(config, binder)
    except BaseException:
        if binder.children is not None:
            binder.children.close()
        raise


def _boot(config: BrokerConfig, binder: _Binder) -> Booted:
    file = _bootconfig(config.config_file) if config.config_file is not None else None
    public, secret = keypair(config, file.curve_cert if file else config.cert)
    binder.secret = secret
    pmi = PmiClient.from_environment() if file is None else None
    if file is not None:
        from tbon.overlay.boot.config_file import config_wireup

        def share() -> None:  # its config-booted children hold the instance's key
            assert binder.children is not None
            binder.children.keyring.share(public)

        wireup = config_wireup(
            file, config.topo, config.size, config.hostname, public, binder.bind, share
        )
        if binder.children is not None:  # what its children dial, as the file says
            binder.endpoint = file.hosts[wireup.rank].connect
    elif config.boot_server is not None:
        from tbon.overlay.boot.flub import flub_wireup

        wireup, attributes = flub_wireup(
            config.boot_server,
            config.requested_rank,
            config.hostname,
            (public, secret),
            config.join_timeout,
            binder.bind,
            warm=_warm_up_link,
        )
        config = adopt(config, attributes)
        if binder.children is not None:
            binder.children.config = config
    elif pmi is not None:
        from tbon.overlay.boot.pmi import pmi_wireup

        wireup = pmi_wireup(
            pmi, config.topo, config.size, config.hostname, public, binder.bind, binder.authorize
        )
    else:
        wireup = singleton_wireup(config.topo, config.size, config.hostname, binder.bind)
    if binder.children is None and _stands_by(config, wireup):
        binder.config = config
        if file is None:
            binder.bind(wireup.topology, wireup.rank)
        else:  # where the file says this host binds, and is dialed
            binder.bind(wireup.topology, wireup.rank, file.hosts[wireup.rank].bind)
            assert binder.children is not None
            binder.children.keyring.share(public)  # the other members hold the instance's key
            binder.endpoint = file.hosts[wireup.rank].connect
    return Booted(
        config, public, secret, wireup, binder.children, binder.endpoint, pmi, file is not None
    )


def _stands_by(config: BrokerConfig, wireup: Wireup) -> bool:
    """Whether this rank is a standby of the root: one with no children binds all the same,
    since the other members may have to reach it across a dead root (docs/protocol.md §13.4);
    under a config file, at its host's `bind`, dialed at its `connect`."""
    from tbon.overlay.state.standbys import kept_standbys

    return wireup.rank in kept_standbys(wireup.topology, config.standbys)[0]


class _Binder:
    """Makes this broker a parent when bootstrap finds its rank has children."""

    def __init__(self, context: zmq.Context, config: BrokerConfig) -> None:
        self.context = context
        self.config = config
        self.secret = ""
        self.children: Children | None = None
        self.endpoint = ""

    def bind(self, topology: Topology, rank: int, template: str | None = None) -> str:
        """Bind the ROUTER to tbon.endpoint, or to the config file's bind URI; returns the
        address bound."""
        from tbon.overlay.links.children import Children  # a broker with children only

        self.children = Children(self.context, rank, topology, self.config, self.secret)
        address = host_address(self.config.hostname)
        where = (template or self.config.endpoint).replace("%h", address)
        try:
            self.endpoint = self.children.bind(where)
        except zmq.ZMQError as error:  # a port taken, an address not of this host (boot closes)
            reason = zmq.strerror(error.errno) if error.errno is not None else str(error)
            raise TbonError(f"cannot bind the tree endpoint {where}: {reason}") from None
        return self.endpoint

    def authorize(self, rank: int, incarnation: int, public_key: str) -> None:
        assert self.children is not None
        self.children.authorize(rank, incarnation, public_key)


def _warm_up_link() -> None:
    """Import what the link to the parent needs while a joiner waits for its parent's card, so
    that the card, when it comes, is used at once (some 50 ms a link here, on each level of a
    chain of joiners: the link up is made only once the card is in)."""
    from tbon.overlay.links import parent, uplink  # noqa: F401


def _bootconfig(path: str) -> BootConfig:
    from tbon.overlay.boot.config_file import load_bootconfig

    return load_bootconfig(path)


def keypair(config: BrokerConfig, path: str | None) -> tuple[str, str]:
    """A fresh key pair, or the one in a certificate: broker.cert, or the instance's shared
    one (config bootstrap). A broker that keeps its key keeps its identity, so that once
    retired it is recognised and refused should it come back."""
    if path is None:
        return generate_keypair()
    from tbon.keys.cert import load_certificate

    what = "curve_cert" if config.config_file else "broker.cert"
    try:
        cert = load_certificate(path)
    except TbonError as error:
        raise TbonError(f"{what}: {error}", exitcodes.USAGE) from None
    if cert.secret is None:
        raise TbonError(
            f"{what}: {path} has no secret key (make one with tbon keygen)", exitcodes.USAGE
        )
    return cert.public, cert.secret


def check_files(config: BrokerConfig) -> None:
    """Read the files a broker is given, its config file and its certificate, before anything
    starts: a bad one is a usage error, said on one line as every command says one (`tbon
    broker: ...`), not logged by a broker that has begun to boot. Boot reads them again."""
    file = _bootconfig(config.config_file) if config.config_file is not None else None
    path = file.curve_cert if file is not None else config.cert
    if path is not None:
        keypair(config, path)


def adopt(config: BrokerConfig, attributes: dict[str, Any]) -> BrokerConfig:
    """A joiner takes the instance's liveness settings, so that both ends of each link agree,
    and its tbon.standbys (an older root's grant has none: the joiner's own is kept), so that
    one refilling a standby's rank binds its endpoint with no children (`_stands_by`)."""
    standbys = attributes.get("tbon.standbys", config.standbys)
    if not (is_int(standbys) and 0 <= standbys <= MAX_STANDBYS):
        standbys = config.standbys
    return config.replaced(
        heartbeat=float(attributes["tbon.heartbeat"]),
        torpid=float(attributes["tbon.torpid"]),
        timeout=float(attributes["tbon.timeout"]),
        join_timeout=float(attributes["broker.join-timeout"]),
        standbys=standbys,
    )


class Rundir:
    """The run directory that holds the local socket; removed at the end if this broker made it."""

    __slots__ = ("created", "path")

    def __init__(self, path: str, created: bool) -> None:
        self.path, self.created = path, created

    @staticmethod
    def make(wanted: str | None, rank: int) -> Rundir:
        if wanted is None:
            return Rundir(private_directory(), True)
        wanted = wanted.replace("%r", str(rank))  # one launch line, a directory per rank
        created = not os.path.isdir(wanted)
        if created:
            os.makedirs(wanted, mode=0o700)
        os.chmod(wanted, 0o700)
        return Rundir(wanted, created)

    def remove(self) -> None:
        if not self.created:
            return
        try:  # empty by now, as a rule (the local socket is gone): rmtree costs 0.3 ms more
            os.rmdir(self.path)
        except OSError:
            import shutil  # at the end only: a broker starts faster without it

            shutil.rmtree(self.path, ignore_errors=True)


def private_directory() -> str:
    """A new directory of mode 0700 under $TMPDIR (else in memory: tbon/tmpdir.py), named after
    this broker (`tbon-PID-HEX`, links/sweep.py) so that it can be swept should the broker be
    killed; and those of brokers killed before it are swept now. A name no one could claim
    first, as tempfile.mkdtemp makes, without the start-up cost of importing tempfile."""
    from tbon.overlay.links.sweep import run_directory_name, sweep

    parent = tmpdir.parent()
    for _ in range(100):
        path = os.path.join(parent, run_directory_name(os.getpid()))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        sweep(parent)
        return path
    raise FileExistsError(f"no free name for a run directory in {parent}")


class Links:
    """Every socket a broker holds, and the run directory of its local one."""

    __slots__ = ("children", "context", "local", "parent", "rundir")

    def __init__(
        self,
        children: Children | None,
        parent: ParentLink | Uplink | None,
        local: LocalServer,
        rundir: Rundir,
        context: zmq.Context,
    ) -> None:
        self.children = children
        self.parent = parent  # the first link up, until the broker wraps it in an Uplink
        self.local, self.rundir = local, rundir
        self.context = context  # for the links up a broker opens later (seeking a parent, home)

    def close(self, linger: bool) -> None:
        """`linger`: let the parent link deliver what is queued (a goodbye) before it closes."""
        if self.parent is not None:
            self.parent.close(linger=linger)
        if self.children is not None:
            self.children.close()
        self.local.close()
        self.rundir.remove()


def open_links(booted: Booted, context: zmq.Context, now: float) -> Links:
    """The local socket in a run directory of its own, and the link to the parent (hello sent)."""
    wireup, config = booted.wireup, booted.config
    rundir = Rundir.make(config.rundir, wireup.rank)
    local: LocalServer | None = None
    parent: ParentLink | None = None
    try:
        local = LocalServer(rundir.path, config.client_backlog, total=config.client_backlog_total)
        if wireup.parent is not None:
            from tbon.overlay.links.parent import ParentLink  # not at rank 0

            parent = ParentLink(
                context,
                wireup.rank,
                wireup.incarnation,
                config,
                (booted.public, booted.secret),
                (wireup.parent.endpoint, wireup.parent.public_key),
                now,
                peer=wireup.topology.parent(wireup.rank) if wireup.peer is None else wireup.peer,
                shared_key=booted.by_config,
            )
    except BaseException:
        if local is not None:
            local.close()
        rundir.remove()
        raise
    return Links(booted.children, parent, local, rundir, context)
