"""Where rank 0's CPU goes at wire-up, without a profiler's overhead: a few functions timed.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/rank0_split.py --size 1024

Like profile_rank0.py, runs the launcher of `tbon start` in this process and wraps functions of
the forked rank 0 only, from outside (nothing of tbon changes): each wrapped function's own
thread CPU (time.thread_time) is summed, nested calls counted once in their outermost wrapper,
and printed when rank 0 starts its initial program (every rank online), with rank 0's CPU by
thread (utime + stime from /proc, 10 ms steps). A split, not a profile: what the wrapped
functions do not cover is shown as the rest of the main thread.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from common import progress, start_here, wrap_each

# (module, attribute path): the parts of rank 0's work at wire-up
PARTS = [
    ("tbon.overlay.broker.broker", "boot"),
    ("tbon.overlay.broker.broker", "Broker.__init__"),
    ("tbon.overlay.boot.pmi", "pmi_wireup"),
    ("tbon.overlay.boot.pmi_client", "PmiClient.get"),
    ("tbon.overlay.boot.pmi_client", "PmiClient.barrier"),
    ("tbon.overlay.links.children", "Children.__init__"),
    ("tbon.overlay.links.children", "Children.bind"),
    ("tbon.overlay.state.ranktable", "RankTable.__init__"),
    ("tbon.overlay.services.rankpath", "RankPath.handle_all"),
    ("tbon.overlay.links.children", "Children._report"),
    ("tbon.overlay.links.children", "Children._hello"),
    ("tbon.overlay.links.children", "Children.drain_monitor"),
    ("tbon.overlay.links.children", "decode_frames"),
    ("tbon.overlay.links.children", "Children.read"),
    ("tbon.overlay.broker.broker", "Broker.perform"),
    ("tbon.overlay.broker.broker", "Broker._read_zap"),
    ("tbon.overlay.broker.broker", "Broker._read_children"),
    ("tbon.overlay.broker.broker", "Broker._timers"),
    ("tbon.overlay.broker.broker", "Broker._tick"),
    ("tbon.overlay.broker.broker", "Broker._next_deadline"),  # until 1adc237
    ("tbon.overlay.broker.broker", "Broker._deadlines"),  # since
    ("tbon.overlay.services.exec", "ExecService.flush"),
    ("tbon.overlay.services.status", "StatusService.pushes"),
    ("tbon.overlay.services.flub", "FlubService.unpark"),
    ("tbon.overlay.services.retire", "RetireService.settle"),
    ("tbon.overlay.broker.broker", "Broker._locate_late"),
    ("tbon.overlay.services.dmesg", "DmesgService.pushes"),
    ("tbon.overlay.links.local", "LocalServer.release"),
    ("tbon.overlay.broker.broker", "Broker._maybe_finish"),
    ("tbon.overlay.broker.broker", "Broker._send_reports"),
    ("tbon.overlay.links.children", "Children.settle"),
    ("tbon.overlay.links.children", "Children._known"),
    ("tbon.overlay.links.children", "Children._feed"),
    ("tbon.overlay.wire.message", "decode_payload"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("-S", "--setattr", action="append", default=[])
    parser.add_argument(
        "--markdown", action="store_true", help="a table of the totals only (for compare.py)"
    )
    args = parser.parse_args()


    from tbon.overlay.broker import program
    from tbon.overlay.launch import local

    out = tempfile.mkdtemp(prefix="tbon-split-")
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    depth = [0]

    def wrap(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            start = time.thread_time()
            try:
                return function(*a, **k)
            finally:
                depth[0] -= 1
                spent[name] += time.thread_time() - start
                calls[name] += 1

        return timed

    wrap_each(PARTS, wrap)
    counted: dict[str, int] = defaultdict(int)  # what reached rank 0, and what it sent

    def count_receive(function: Callable[..., Any]) -> Callable[..., Any]:
        def receive(sock: Any) -> Any:
            frames = function(sock)
            counted["messages read from children"] += 1
            counted["bytes read from children"] += sum(len(f.bytes) for f in frames[1:])
            return frames

        return receive

    def count_calls(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*a: Any, **k: Any) -> Any:
            counted[name] += 1
            return function(*a, **k)

        return counting

    def count_events(function: Callable[..., Any]) -> Callable[..., Any]:
        def decoding(payload: Any) -> Any:
            events = function(payload)
            counted["report events"] += len(events)
            return events

        return decoding

    from tbon.overlay.links import children as children_module
    from tbon.overlay.links import keyring as keyring_module

    # the children's reader by its name in children.py: receive (links/zmqio.py), _receive before
    reader = "receive" if hasattr(children_module, "receive") else "_receive"
    setattr(children_module, reader, count_receive(getattr(children_module, reader)))
    children_module.read_event = count_calls("monitor events", children_module.read_event)
    children_module.decode_events = count_events(children_module.decode_events)
    handler = keyring_module.ZapHandler
    handler.handle = count_calls("ZAP requests", handler.handle)  # type: ignore[method-assign]
    marks: dict[str, float] = {}  # wall-clock moments of rank 0's start-up

    def mark(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def marking(*a: Any, **k: Any) -> Any:
            marks.setdefault(name, time.monotonic())
            return function(*a, **k)

        return marking

    from tbon.overlay.boot import pmi_client

    barrier = pmi_client.PmiClient.barrier

    def barrier_left(self: Any) -> Any:  # the second ends the wire-up: children connect
        result = barrier(self)
        marks["PMI barriers left"] = time.monotonic()
        return result

    pmi_client.PmiClient.barrier = barrier_left  # type: ignore[method-assign]
    handler.handle = mark("first ZAP request answered", handler.handle)  # type: ignore[method-assign]
    sender = children_module.Children
    sender._send_raw = count_calls("messages sent to children", sender._send_raw)  # type: ignore[method-assign]
    original_start = program.InitialProgram.start
    import gc

    collecting = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[0] = time.thread_time()
        else:
            spent[f"gc gen {info['generation']}"] += time.thread_time() - collecting[0]
            calls[f"gc gen {info['generation']}"] += 1


    def start(self):  # type: ignore[no-untyped-def]
        lines = [f"{'part':32} {'calls':>6} {'ms (nested included)':>20}"]
        names = [n for _, n in PARTS] + sorted(n for n in spent if n.startswith("gc "))
        lines += [f"{n:32} {calls[n]:6d} {spent[n] * 1e3:20.1f}" for n in names]
        lines += [f"{n:32} {v:>6}" for n, v in counted.items()]
        left = marks.get("PMI barriers left")
        if left is not None and "first ZAP request answered" in marks:
            late = marks["first ZAP request answered"] - left
            lines.append(f"first ZAP answer, s after PMI  {late:8.2f}")
        for tid in sorted(os.listdir("/proc/self/task")):
            with open(f"/proc/self/task/{tid}/stat") as stat:
                text = stat.read()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])
            lines.append(f"thread {name:25} {ticks * 1000 // os.sysconf('SC_CLK_TCK'):6d} ms")
        usage = resource.getrusage(resource.RUSAGE_SELF)
        lines.append(f"page faults (minor)           {usage.ru_minflt:8d}")
        user, system = usage.ru_utime * 1e3, usage.ru_stime * 1e3
        lines.append(f"user / system CPU, all threads {user:.1f} / {system:.1f} ms")
        lines.append(f"main thread CPU {time.thread_time() * 1e3:.1f} ms (pid {os.getpid()})")
        with open(os.path.join(out, "split"), "w") as report:
            report.write("\n".join(lines) + "\n")
        return original_start(self)

    program.InitialProgram.start = start  # type: ignore[method-assign]
    original_run = local.run_broker

    def run_broker(config, command):  # type: ignore[no-untyped-def]
        if command:  # rank 0: the only broker with the initial program
            gc.callbacks.append(on_gc)
        return original_run(config, command)

    local.run_broker = run_broker
    progress(f"split: {args.size} brokers, rank 0's parts timed")
    code = start_here(local.main, args.size, ["true"], args.setattr)
    path = os.path.join(out, "split")
    if not os.path.exists(path):
        print(f"rank 0 never started its program (launcher exit {code})", file=sys.stderr)
        return 1
    with open(path) as report:
        text = report.read()
    if not args.markdown:
        print(text, end="")
        return code
    totals = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if line.startswith("main thread CPU"):
            totals["rank 0 main thread CPU (ms)"] = line.split()[3]
        elif line.startswith("thread ZMQbg/IO"):
            totals["rank 0 I/O thread CPU (ms, 10 ms ticks)"] = line.split()[2]
        elif name.strip() in ("messages read from children", "bytes read from children"):
            totals[name.strip()] = value
    print(f"| rank 0 at wire-up, {args.size} brokers | value |")
    print("|---|---|")
    for name, value in totals.items():
        print(f"| {name} | {value} |")
    return code


if __name__ == "__main__":
    sys.exit(main())
