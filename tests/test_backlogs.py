"""The bounds on what local clients leave unread (overlay/links/backlogs.py), and an outbox that
gives up what it has not begun (overlay/wire/frames.py): without sockets, driven by hypothesis
against oracles simpler than the code."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rawlocal import partial_writes

from tbon.overlay.links.backlogs import Admission, Drop, Ledger
from tbon.overlay.wire.frames import FrameReader, Outbox, encode_frames, frame_parts

EACH, TOTAL = 100, 250


def test_a_client_past_its_own_bound_is_dropped_whatever_the_others_hold() -> None:
    ledger = Ledger(EACH, TOTAL)
    ledger.set("l1", 90)
    assert ledger.admit("l1", 101) == Admission((Drop("l1", total=False),), send=False)
    assert ledger.admit("l1", 100).send


def test_past_the_total_the_greediest_goes_not_the_one_that_tipped_it() -> None:
    ledger = Ledger(EACH, TOTAL)
    for hop, unread in (("l1", 95), ("l2", 90), ("l3", 10)):
        ledger.set(hop, unread)
    assert ledger.total == 195
    admitted = ledger.admit("l3", 70)  # 95 + 90 + 70 > 250: l1 holds the most
    assert admitted == Admission((Drop("l1", total=True),), send=True)
    # the one being sent to goes when it is the greediest (and on a tie)
    ledger.set("l3", 61)  # 95 + 95 + 61 > 250, and l1 and l2 tie
    assert ledger.admit("l2", 95) == Admission((Drop("l2", total=True),), send=False)


def test_a_ledger_forgets_a_client_that_has_gone() -> None:
    ledger = Ledger(EACH, TOTAL)
    ledger.set("l1", 80)
    ledger.set("l1", 30)
    ledger.forget("l1")
    ledger.forget("l9")
    assert ledger.total == 0 and ledger.unread == {}


hops = st.sampled_from([f"l{n}" for n in range(6)])
steps = st.lists(
    st.tuples(st.sampled_from(["send", "read", "gone"]), hops, st.integers(0, 120)), max_size=60
)


@given(steps)
def test_no_sequence_of_sends_takes_the_clients_past_either_bound(script) -> None:
    """The oracle: a plain dict of what each client holds. After every admitted send, each
    client is within its bound and all are within theirs; whoever is dropped held the most (or
    was past its own bound), and nobody is dropped while the send would fit."""
    ledger = Ledger(EACH, TOTAL)
    held: dict[str, int] = {}
    for what, hop, amount in script:
        if what == "read":
            if hop in held:
                held[hop] = max(0, held[hop] - amount)
                ledger.set(hop, held[hop])
            continue
        if what == "gone":
            held.pop(hop, None)
            ledger.forget(hop)
            continue
        after = held.get(hop, 0) + amount
        admitted = ledger.admit(hop, after)
        fits = after <= EACH and sum(held.values()) - held.get(hop, 0) + after <= TOTAL
        assert (admitted == Admission((), send=True)) == fits
        trial = {**held, hop: after}
        for drop in admitted.drops:
            if drop.total:
                assert trial[drop.hop] == max(trial.values())
            else:
                assert drop.hop == hop and after > EACH
            trial.pop(drop.hop)
            held.pop(drop.hop, None)
            ledger.forget(drop.hop)
        if admitted.send:
            held[hop] = after
            ledger.set(hop, after)
        assert all(value <= EACH for value in held.values())
        assert sum(held.values()) == ledger.total <= TOTAL


messages_st = st.lists(
    st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=4), min_size=1, max_size=8
)


@given(messages_st, st.lists(st.integers(-1, 90), min_size=1), st.integers(0, 20))
def test_an_outbox_that_gives_up_leaves_a_stream_of_whole_messages(messages, takes, turns) -> None:
    """Whenever it gives up, what the reader gets is whole messages (those begun, in order),
    then the last word; and what is freed is all that had not begun."""
    outbox = Outbox()
    sendmsg, written = partial_writes(takes)
    for frames in messages:
        outbox.send(frame_parts(frames), sendmsg)
    for _ in range(turns):
        outbox.flush(sendmsg)
    before = outbox.size
    freed = outbox.give_up()
    assert outbox.size == before - freed
    last = [b"dropped"]
    outbox.push(frame_parts(last))
    takes[:] = [1 << 20]  # the client reads again: everything
    outbox.flush(sendmsg)
    assert not outbox
    reader = FrameReader()
    reader.feed(written)
    got = reader.drain()
    assert len(reader) == 0 and got[-1] == last and got[:-1] == messages[: len(got) - 1]
    stream = b"".join(encode_frames(frames) for frames in got[:-1])
    assert freed == sum(len(encode_frames(f)) for f in messages) - len(stream)
