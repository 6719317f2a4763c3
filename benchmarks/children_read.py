"""What one read of a child's report costs rank 0's `Children`, on real CURVE sockets, in-process.

    .venv/bin/python benchmarks/children_read.py [--children 31] [--reports 20] [--events 3]

A parent (rank 0 of a 1024-rank kary:32 tree) admits `--children` keys, each child (a DEALER with
its key) says hello and is welcomed, then sends `--reports` reports of `--events` Onlines each
(ranks of its own subtree, as at wire-up). Once all of them wait in the ROUTER's queue, they are
read the way the broker's `_read_children` reads them (`readable`, then `read`), and the main
thread's CPU for that (time.thread_time) is printed per read: the cost of the adapter alone
(frames, decode, sender, liveness, the report's events), without the table. Rounds are repeated
and the least is shown, the figure least disturbed by a busy machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import zmq


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=31)
    parser.add_argument("--reports", type=int, default=20, help="reports per child each round")
    parser.add_argument("--events", type=int, default=3, help="Onlines per report")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from tbon.overlay.config.attributes import broker_config
    from tbon.overlay.links.children import Children
    from tbon.overlay.state.ranktable import Online
    from tbon.overlay.state.reports import encode_events
    from tbon.overlay.state.topology import Topology
    from tbon.overlay.wire.message import PROTOCOL_VERSION, Kind, Message, encode

    topology = Topology("kary:32", 1024)
    config = broker_config({"tbon.heartbeat": "10s", "tbon.torpid": "60s", "tbon.timeout": "120s"})
    context = zmq.Context()
    public, secret = zmq.curve_keypair()
    children = Children(context, 0, topology, config, secret.decode())
    endpoint = children.bind("tcp://127.0.0.1:*")
    dealers = []
    interior = [rank for rank in topology.children(0) if topology.children(rank)]
    for rank in interior[: args.children]:
        child_public, child_secret = zmq.curve_keypair()
        children.authorize(rank, 1, child_public.decode())
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.curve_serverkey, dealer.curve_publickey = public, child_public
        dealer.curve_secretkey = child_secret
        dealer.connect(endpoint)
        hello = {
            "rank": rank,
            "incarnation": 1,
            "version": PROTOCOL_VERSION,
            "hostname": "node",
            "pid": 1000 + rank,
        }
        dealer.send_multipart(encode(Message(Kind.CONTROL, "hello", hello)))
        dealers.append((rank, dealer))

    def pump(until: int, count: list[int]) -> None:
        deadline = time.monotonic() + 30
        while count[0] < until and time.monotonic() < deadline:
            while children.zap.socket.poll(0):
                children.zap.handle()
            children.drain_monitor()
            while children.readable():
                children.read(time.monotonic())
                count[0] += 1
            if count[0] < until:
                zmq.select([children.socket, children.zap.socket, children.monitor], [], [], 0.05)

    pump(len(dealers), [0])
    welcomed = sum(1 for rank, _ in dealers if children.attached(rank))
    if welcomed != len(dealers):
        print(f"only {welcomed} of {len(dealers)} children welcomed", file=sys.stderr)
        return 1
    best = float("inf")
    total = args.reports * len(dealers)
    for _ in range(args.rounds):
        for rank, dealer in dealers:
            below = topology.children(rank)
            for i in range(args.reports):
                events = [
                    Online(below[(i * args.events + j) % len(below)], 1, "node", 7, rank, "K" * 40)
                    for j in range(args.events)
                ]
                report = Message(Kind.CONTROL, "report", encode_events(events))
                dealer.send_multipart(encode(report))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # all in the parent's queue, nothing read yet
            time.sleep(0.05)
            if children.socket.get(zmq.EVENTS) & zmq.POLLIN:
                time.sleep(0.3)
                break
        read, reports = 0, 0
        start = time.thread_time()
        while read < total:
            if not children.readable():
                zmq.select([children.socket], [], [], 1.0)
                continue
            inbound = children.read(time.monotonic())
            reports += len(inbound.reports)
            read += 1
        spent = time.thread_time() - start
        best = min(best, spent / read)
        each = spent / read * 1e6
        print(f"{read} reads, {reports} events: {each:.1f} µs a read", file=sys.stderr)
    print(f"children_read: {best * 1e6:.1f} µs a read (least of {args.rounds} rounds)")
    for _, dealer in dealers:
        dealer.close()
    children.close()
    context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
