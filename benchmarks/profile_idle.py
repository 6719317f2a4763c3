"""Where an idle broker's CPU goes: cProfile on a few brokers of an instance that does nothing.

    .venv/bin/python benchmarks/profile_idle.py [--size 64] [--heartbeat 0.2s] [--seconds 10]

Runs the launcher of `tbon start` in this process with `sleep` as the initial program, at a
short `tbon.heartbeat` so that many beats fall in a short run. In the sampled brokers (rank 0,
rank 1 and a few leaves; `--ranks`) the profiler is switched on by the loop's first turn after
the wire-up has settled (a third of the run) and dumped after `--seconds`; the leaves' profiles
are summed. Nothing of tbon is changed: the loop's _tick is wrapped from outside, in the forked
brokers only. The profiler slows what it watches: this is for where the time goes,
benchmarks/idle.py for how much.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import tempfile
import time
from typing import Any

from common import progress, show_sampled, start_here, wrap_each

SPLIT = [
    ("tbon.overlay.broker.broker", "Broker._read_parent"),
    ("tbon.overlay.broker.broker", "Broker._read_children"),
    ("tbon.overlay.broker.broker", "Broker._tick"),
    ("tbon.overlay.broker.broker", "Broker._timers"),
    ("tbon.overlay.broker.broker", "Broker._deadlines"),
    ("zmq.sugar.poll", "Poller.poll"),
    ("tbon.overlay.links.uplink", "Uplink.read"),
    ("tbon.overlay.links.parent", "ParentLink.read"),
    ("tbon.overlay.links.parent", "ParentLink._send_frames"),
    ("tbon.overlay.links.parent", "ParentLink.readable"),
    ("tbon.overlay.links.uplink", "Uplink.next_deadline"),
    ("tbon.overlay.services.exec", "ExecService.flush"),
    ("tbon.overlay.services.exec", "ExecService.next_deadline"),
]
"""(module, attribute path): the functions --split times, nested calls in each one's own."""


def _split(rank: int, out: str, settle: float, seconds: float) -> None:
    """In the forked broker of `rank`: sum each SPLIT function's thread CPU over the window,
    and write it with the main thread's CPU over that window."""
    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    window = [time.monotonic() + settle, time.monotonic() + settle + seconds, 0.0]

    def wrap(name: str, function: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            now = time.monotonic()
            if not window[0] <= now < window[1]:
                if now >= window[1] and window[2] >= 0:
                    main = (time.thread_time() - window[2]) * 1e6
                    lines = []
                    for _, n in SPLIT:
                        count = calls.get(n, 0)
                        each = spent.get(n, 0) * 1e6 / max(1, count)
                        lines.append(f"{n:28} {count:5d} {each:8.1f} us/call")
                    lines.append(f"main thread {main:.0f} us in all")
                    with open(os.path.join(out, f"{rank}.split"), "w") as report:
                        report.write("\n".join(lines) + "\n")
                    window[2] = -1.0
                return function(*a, **k)
            if window[2] == 0.0:
                window[2] = time.thread_time()
            start = time.thread_time()
            try:
                return function(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - start
                calls[name] = calls.get(name, 0) + 1

        return timed

    wrap_each(SPLIT, wrap)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--heartbeat", default="0.2s", help="tbon.heartbeat (default 0.2s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="profiled (default 10)")
    parser.add_argument("--top", type=int, default=30, help="functions shown (default 30)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("--ranks", default="0,1,40,50,60", help="the brokers profiled")
    parser.add_argument(
        "--split", action="store_true", help="no profiler: time a few functions (SPLIT) only"
    )
    args = parser.parse_args()
    ranks = {int(r) for r in args.ranks.split(",")}

    from tbon.overlay.broker import broker as broker_module
    from tbon.overlay.launch import local

    out = tempfile.mkdtemp(prefix="tbon-profile-idle-")
    original_run, original_tick = local.run_broker, broker_module.Broker._tick
    settle = args.seconds / 2

    def run_broker(config: Any, command: list[str]) -> int:
        rank = int(os.environ.get("PMI_RANK", "-1"))
        if rank in ranks and args.split:
            _split(rank, out, settle, args.seconds)
        elif rank in ranks:
            profiler = cProfile.Profile(time.thread_time)
            window = [time.monotonic() + settle, 0.0]

            def tick(self: Any, now: float) -> None:
                if window[1] == 0.0 and now >= window[0]:
                    window[1] = now + args.seconds
                    profiler.enable()
                elif window[1] and now >= window[1]:
                    profiler.disable()
                    profiler.dump_stats(os.path.join(out, f"{rank}.prof"))
                    window[1] = float("inf")
                original_tick(self, now)

            broker_module.Broker._tick = tick  # type: ignore[method-assign]
        return original_run(config, command)

    local.run_broker = run_broker
    wait = settle + args.seconds + 2 * float(args.heartbeat.rstrip("s")) + 1
    progress(f"profile: {args.size} brokers idle, ranks {sorted(ranks)} under cProfile")
    code = start_here(
        local.main, args.size, ["sleep", f"{wait:g}"], [f"tbon.heartbeat={args.heartbeat}"]
    )
    if code != 0:
        print(f"the launcher exited {code}", file=sys.stderr)
    show_sampled(out, ranks, args.split, args.sort, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
