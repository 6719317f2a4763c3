"""Proof of possession (issue 25): a reservation is used from another connection only by one that
answers rank 0's challenge with the secret half of the reservation's key. The proof itself
(keys/proof.py), rank 0's open challenges (state/possession.py) and FLUB's use of them
(services/flub.py), without sockets. The process tests are in tests/test_flub_restart.py."""

from __future__ import annotations

import errno
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from rank0 import AtRank0
from tables import bring_up, started

from tbon.keys.cert import generate_keypair
from tbon.keys.proof import (
    Challenge,
    check,
    decode_nonce,
    encode_nonce,
    new_challenge,
    prove,
    statement,
)
from tbon.overlay.services.actions import Action, Call, Respond
from tbon.overlay.services.flub import FlubService, flub_attributes
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.possession import CHALLENGE_LIFE, PER_CONNECTION, Challenges
from tbon.overlay.state.ranktable import RankState, RankTable
from tbon.overlay.wire.message import Kind, Message

NOW = 200.0
KEYS = [generate_keypair() for _ in range(3)]  # (public, secret), made once: they are slow-ish
JOINER, OTHER, THIRD = KEYS
CARD = {"endpoint": "tcp://10.0.0.1:5000", "public_key": "P" * 40, "hostname": "parent"}


def answer(challenge: Challenge, keys: tuple[str, str], rank: int, incarnation: int) -> str:
    """The proof a broker holding `keys` gives for (rank, incarnation) of keys' public key."""
    public, secret = keys
    return prove(secret, challenge.public, challenge.nonce, statement(rank, incarnation, public))


# --- the proof ----------------------------------------------------------------------------------


def test_only_the_secret_key_of_the_named_key_makes_a_proof_that_holds() -> None:
    challenge = new_challenge()
    said = statement(3, 1, JOINER[0])
    assert check(challenge, JOINER[0], said, answer(challenge, JOINER, 3, 1))
    # another secret key, whatever it claims
    assert not check(
        challenge, JOINER[0], said, prove(OTHER[1], challenge.public, challenge.nonce, said)
    )
    # a proof for another rank, incarnation or challenge says nothing of this one
    assert not check(challenge, JOINER[0], said, answer(challenge, JOINER, 2, 1))
    assert not check(challenge, JOINER[0], said, answer(challenge, JOINER, 3, 2))
    assert not check(challenge, JOINER[0], said, answer(new_challenge(), JOINER, 3, 1))
    # nor does it hold for another key than the one that made it
    assert not check(
        challenge, OTHER[0], statement(3, 1, OTHER[0]), answer(challenge, JOINER, 3, 1)
    )


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.hex()), st.integers(), st.none()))
def test_no_made_up_answer_holds(proof: Any) -> None:
    challenge = new_challenge()
    assert not check(challenge, JOINER[0], statement(3, 1, JOINER[0]), proof)


def test_a_challenge_is_16_bytes_of_base64_and_a_key_made_for_it() -> None:
    one, two = new_challenge(), new_challenge()
    assert len(one.nonce) == 16 and one.nonce != two.nonce and one.public != two.public
    assert "secret" not in repr(one)
    assert decode_nonce(encode_nonce(one.nonce)) == one.nonce and decode_nonce("AAAA") is None
    assert decode_nonce("not base64!") is None and decode_nonce(16) is None


# --- rank 0's open challenges -------------------------------------------------------------------


def test_an_answer_holds_once_on_its_connection_for_its_reservation_before_it_expires() -> None:
    challenges = Challenges()
    issued = challenges.issue("a", 3, 1, JOINER[0], NOW)
    proof = answer(issued.challenge, JOINER, 3, 1)
    assert challenges.redeem("a", 3, 1, JOINER[0], proof, NOW + 1) is None
    replayed = challenges.redeem("a", 3, 1, JOINER[0], proof, NOW + 1)
    assert replayed is not None and "no challenge is open" in replayed.why


def test_every_wrong_answer_is_refused_and_spends_the_challenge() -> None:
    cases = {
        "wrong key": lambda c: ("a", 3, 1, JOINER[0], answer(c, OTHER, 3, 1), NOW),
        "other rank": lambda c: ("a", 2, 1, JOINER[0], answer(c, JOINER, 2, 1), NOW),
        "other incarnation": lambda c: ("a", 3, 2, JOINER[0], answer(c, JOINER, 3, 2), NOW),
        "other key named": lambda c: ("a", 3, 1, OTHER[0], answer(c, OTHER, 3, 1), NOW),
        "other connection": lambda c: ("b", 3, 1, JOINER[0], answer(c, JOINER, 3, 1), NOW),
        "expired": lambda c: ("a", 3, 1, JOINER[0], answer(c, JOINER, 3, 1), NOW + CHALLENGE_LIFE),
    }
    for name, case in cases.items():
        challenges = Challenges()
        issued = challenges.issue("a", 3, 1, JOINER[0], NOW)
        refused = challenges.redeem(*case(issued.challenge))
        assert refused is not None, name
        assert refused.expired == (name == "expired"), name
        good = answer(issued.challenge, JOINER, 3, 1)
        after = challenges.redeem("a", 3, 1, JOINER[0], good, NOW)
        if name not in ("other rank", "other connection"):  # those named no open challenge
            assert after is not None, f"{name}: the challenge outlived a wrong answer"


def test_a_connection_keeps_a_bounded_number_of_challenges_and_they_go_with_it() -> None:
    challenges = Challenges()
    for rank in range(1, 2 * PER_CONNECTION):
        challenges.issue("a", rank, 1, JOINER[0], NOW)
    challenges.issue("a", 1, 1, JOINER[0], NOW)  # a new one for a rank replaces the old
    assert sum(1 for conn, _ in challenges.open if conn == "a") == PER_CONNECTION
    challenges.issue("b", 1, 1, JOINER[0], NOW)
    challenges.forget("a")
    assert list(challenges.open) == [("b", 1)]


# --- FLUB at rank 0 -----------------------------------------------------------------------------


def flub_at_rank0(table: RankTable) -> Any:
    attributes = flub_attributes(2.0, 10.0, 60.0, 30.0)
    flub = FlubService(0, table.topology, table, Lifecycle(), CARD, attributes)
    return AtRank0.of(lambda _: flub, table)


def ask(topic: str, payload: dict[str, Any], route: list[str]) -> Message:
    return Message(Kind.REQUEST, topic, payload, nodeid=0, tag=7, route=route)


def response(actions: list[Action]) -> Message:
    [found] = [a.message for a in actions if isinstance(a, Respond)]
    return found


def prove_on(flub: Any, route: list[str], keys: tuple[str, str], triple: dict[str, Any]) -> str:
    """Ask rank 0 for a challenge on `route` and answer it with `keys`."""
    said = response(flub.challenge(ask("flub.challenge", triple, route), NOW)).payload
    nonce = decode_nonce(said["challenge"])
    assert nonce is not None and said["expires"] == CHALLENGE_LIFE
    what = statement(triple["rank"], triple["incarnation"], triple["public_key"])
    return prove(keys[1], said["key"], nonce, what)


def test_a_restarted_joiner_proves_its_key_and_the_reservation_moves_to_it() -> None:
    table = started("kary:2", 4, launched=2)  # rank 3's parent, rank 1, is not online
    flub = flub_at_rank0(table)
    old, new, other = ["l0a"], ["l0b"], ["l0c"]
    asked = {"public_key": JOINER[0], "hostname": "j", "rank": 3}
    first = response(flub.allocate(ask("flub.allocate", asked, old), NOW)).payload
    again = response(flub.allocate(ask("flub.allocate", asked, new), NOW)).payload
    assert (first["held"], again["held"]) == (True, False)
    assert (again["rank"], again["incarnation"]) == (3, 1)
    bring_up(table, [1])
    triple = {"rank": 3, "incarnation": 1, "public_key": JOINER[0]}
    # a holder of the public key alone: no proof, a made-up one, or one made with its own key
    plain = response(flub.kex(ask("flub.kex", triple, other), NOW))
    assert plain.errnum == errno.EPERM and "not reserved by this connection" in plain.errstr
    forged = prove_on(flub, other, OTHER, triple)
    refused = response(flub.kex(ask("flub.kex", {**triple, "proof": forged}, other), NOW))
    assert refused.errnum == errno.EPERM and "not made with the secret key" in refused.errstr
    # the restarted joiner proves it; a replay of its proof on the same connection does not
    proof = prove_on(flub, new, JOINER, triple)
    [call] = flub.kex(ask("flub.kex", {**triple, "proof": proof}, new), NOW)
    assert isinstance(call, Call) and call.request.topic == "flub.authorize"
    assert call.request.payload == triple and call.request.nodeid == 1
    replay = response(flub.kex(ask("flub.kex", {**triple, "proof": proof}, other), NOW))
    assert replay.errnum == errno.EPERM and "no challenge is open" in replay.errstr
    # the reservation is the new connection's now: the old process, if alive, is refused
    stale = response(flub.kex(ask("flub.kex", triple, old), NOW))
    assert stale.errnum == errno.EPERM and "not reserved by this connection" in stale.errstr
    assert isinstance(flub.kex(ask("flub.kex", triple, new), NOW)[0], Call)  # no proof needed
    # and it may give it back at once
    assert response(flub.release(ask("flub.release", triple, new), NOW)).payload == {}
    assert table.entry(3).state is RankState.VACANT


def test_a_release_is_obeyed_from_a_connection_that_proves_the_key() -> None:
    table = started("kary:2", 4, launched=2)
    flub = flub_at_rank0(table)
    asked = {"public_key": JOINER[0], "hostname": "j", "rank": 3}
    flub.allocate(ask("flub.allocate", asked, ["l0a"]), NOW)
    triple = {"rank": 3, "incarnation": 1, "public_key": JOINER[0]}
    proof = prove_on(flub, ["l0b"], JOINER, triple)
    late = response(
        flub.release(ask("flub.release", {**triple, "proof": proof}, ["l0b"]), NOW + 11)
    )
    assert late.errnum == errno.ETIMEDOUT and "expired" in late.errstr  # a joiner exits 75
    assert table.entry(3).state is RankState.RESERVED
    proof = prove_on(flub, ["l0b"], JOINER, triple)
    done = response(flub.release(ask("flub.release", {**triple, "proof": proof}, ["l0b"]), NOW))
    assert done.payload == {} and table.entry(3).state is RankState.VACANT
    stale = response(flub.challenge(ask("flub.challenge", triple, ["l0b"]), NOW))
    assert stale.errnum == errno.ESTALE  # nothing to prove: the reservation is gone


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.sampled_from(["wrong key", "other rank", "replay", "expired", "other connection"]),
        min_size=1,
        max_size=6,
    )
)
def test_no_wrong_answer_ever_lets_a_connection_use_the_reservation(tries: list[str]) -> None:
    """Whatever a client without the secret key (or with a spent or late proof) tries, in any
    order, the reservation stays where it was granted and no parent is ordered."""
    table = started("kary:2", 8, launched=2)
    bring_up(table, [1])
    flub = flub_at_rank0(table)
    hostile = ["l0h"]
    for rank, keys in ((3, JOINER), (4, THIRD)):
        asked = {"public_key": keys[0], "hostname": "j", "rank": rank}
        flub.allocate(ask("flub.allocate", asked, ["l0j"]), NOW)
    triple = {"rank": 3, "incarnation": 1, "public_key": JOINER[0]}
    spent: str | None = None
    for t, attempt in enumerate(tries):
        now = NOW + t
        route, payload = hostile, dict(triple)
        if attempt == "wrong key":
            payload["proof"] = prove_on(flub, hostile, OTHER, triple)
        elif attempt == "other rank":  # a proof of a reservation it holds the key of, rank 4
            mine = {"rank": 4, "incarnation": 1, "public_key": THIRD[0]}
            payload["proof"] = prove_on(flub, hostile, THIRD, mine)
        elif attempt == "replay":
            payload["proof"] = spent or "AAAA"
        elif attempt == "expired":
            payload["proof"] = prove_on(flub, hostile, JOINER, triple)
            now += CHALLENGE_LIFE
        else:  # a proof made on another connection, sent on this one
            payload["proof"] = spent = prove_on(flub, ["l0x"], JOINER, triple)
        for topic, serve in (("flub.kex", flub.kex), ("flub.release", flub.release)):
            actions = serve(ask(topic, payload, route), now)
            assert not [a for a in actions if isinstance(a, Call)], (attempt, actions)
            assert response(actions).errnum in (errno.EPERM, errno.ETIMEDOUT), attempt
    assert table.entry(3).state is RankState.RESERVED
    assert flub.service.held.get(("l0j",)) == {(3, 1), (4, 1)}


def test_a_challenges_secret_half_is_in_neither_its_repr_nor_its_str() -> None:
    """A challenge may be logged: its key pair's secret half must not be (keys/proof.py)."""
    challenge = new_challenge()
    shown = repr(challenge) + str(challenge)
    assert challenge.public in shown
    assert repr(challenge.secret) not in shown and challenge.secret.hex() not in shown
