"""Where a broker's CPU goes in one `tbon exec -r all true`: cProfile on a few brokers.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/profile_exec.py --size 1024 [--top 30]

Runs the launcher of `tbon start` in this process with an initial program that runs
`tbon exec -r all true` three times: a warm-up, the profiled run, and one more that ends the
profile. In the sampled brokers (rank 0, rank 1, and a few leaves; `--ranks`) the profiler is
switched on by the second exec.start the exec service handles and dumped at the third, each to
its own file; the sampled leaves' profiles are summed. Nothing of tbon is changed: the service
is wrapped from outside, in the forked brokers only. The profiler slows what it watches: this is
for where the time goes, benchmarks/exec_split.py for how much.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import tempfile
import time
from typing import Any

from common import TBON, progress, show_sampled, start_here, wrap_each

SPLIT = [
    # wrap_each also replaces them where the links imported them by name
    ("tbon.overlay.wire.message", "decode_frames"),
    ("tbon.overlay.wire.message", "encode"),
    ("zmq", "Poller.poll"),
    ("tbon.overlay.broker.router", "Router.route"),
    ("tbon.overlay.broker.router", "Router.respond"),
    ("tbon.overlay.services.exec", "ExecService.handle"),
    ("tbon.overlay.services.exec", "start_problem"),
    ("tbon.overlay.services.exec", "ExecService.gather"),
    ("tbon.overlay.services.exec", "ExecService.flush"),
    ("tbon.overlay.broker.jobs", "JobRunner.start"),
    ("tbon.overlay.broker.jobs", "launch"),
    ("tbon.overlay.broker.jobs", "program_environment"),
    ("tbon.overlay.broker.jobs", "spawn"),
    ("tbon.overlay.broker.jobs", "JobRunner.reap"),
    ("tbon.overlay.broker.jobs", "JobRunner._readable"),
    ("tbon.overlay.broker.jobs", "JobRunner.acknowledge"),
    ("tbon.overlay.broker.broker", "Broker._handle_signals"),
    ("tbon.overlay.broker.broker", "Broker._read_parent"),
    ("tbon.overlay.broker.broker", "Broker._read_children"),
    ("tbon.overlay.broker.broker", "Broker._tick"),
    ("tbon.overlay.broker.broker", "Broker._timers"),
]
"""(module, attribute path): the functions --split times, nested calls in each one's own. The
same name in two modules is one row; Poller.poll's calls are the
loop's turns."""


def _split(rank: int, out: str) -> None:
    """In the forked broker of `rank`: sum each SPLIT function's thread CPU from the second
    exec.start handled to the third, and write it with the process's CPU over that window."""

    from tbon.overlay.services import exec as exec_service

    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    seen = [0]
    began = [0.0, 0.0]

    def wrap(name: str, function: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            if seen[0] != 2:
                return function(*a, **k)
            start = time.thread_time()
            try:
                return function(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - start
                calls[name] = calls.get(name, 0) + 1

        return timed

    wrap_each(SPLIT, wrap)
    handle = exec_service.ExecService.handle

    def counted(self: Any, request: Any, now: float) -> Any:
        if request.topic == "exec.start":
            seen[0] += 1
            times = os.times()
            if seen[0] == 2:
                began[:] = [time.thread_time(), times.user + times.system]
            elif seen[0] == 3:
                names = dict.fromkeys(n for _, n in SPLIT)
                lines = [
                    f"{n:34} {calls.get(n, 0):5d} {spent.get(n, 0) * 1e3:8.2f} ms" for n in names
                ]
                main = (time.thread_time() - began[0]) * 1e3
                process = (times.user + times.system - began[1]) * 1e3
                lines.append(f"main thread {main:.2f} ms, process {process:.0f} ms")
                with open(os.path.join(out, f"{rank}.split"), "w") as report:
                    report.write("\n".join(lines) + "\n")
        return handle(self, request, now)

    exec_service.ExecService.handle = counted  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--top", type=int, default=30, help="functions shown (default 30)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("--ranks", default="0,1,40,500,900,1000", help="the brokers profiled")
    parser.add_argument(
        "--split", action="store_true", help="no profiler: time a few functions (SPLIT) only"
    )
    args = parser.parse_args()
    ranks = {int(r) for r in args.ranks.split(",")}

    from tbon.overlay.launch import local
    from tbon.overlay.services import exec as exec_service

    out = tempfile.mkdtemp(prefix="tbon-profile-exec-")
    original_run, original_handle = local.run_broker, exec_service.ExecService.handle

    def run_broker(config: Any, command: list[str]) -> int:
        rank = int(os.environ.get("PMI_RANK", "-1"))
        if rank in ranks and args.split:
            _split(rank, out)
        elif rank in ranks:
            profiler = cProfile.Profile(time.thread_time)
            seen = [0]

            def handle(self: Any, request: Any, now: float) -> Any:
                if request.topic == "exec.start":
                    seen[0] += 1
                    if seen[0] == 2:
                        profiler.enable()
                    elif seen[0] == 3:
                        profiler.disable()
                        profiler.dump_stats(os.path.join(out, f"{rank}.prof"))
                return original_handle(self, request, now)

            exec_service.ExecService.handle = handle  # type: ignore[method-assign]
        return original_run(config, command)

    local.run_broker = run_broker
    runs = " && ".join([f"{TBON} exec -r all true"] * 3)
    progress(f"profile: {args.size} brokers, ranks {sorted(ranks)} under cProfile")
    code = start_here(local.main, args.size, ["sh", "-c", runs])
    if code != 0:
        print(f"the launcher exited {code}", file=sys.stderr)
    show_sampled(out, ranks, args.split, args.sort, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
