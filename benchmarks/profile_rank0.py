"""Where rank 0's CPU goes while an instance wires up: cProfile on rank 0, from fork to all online.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/profile_rank0.py --size 1024 [--top 40]

Runs the launcher of `tbon start` (tbon.overlay.launch.local) in this process, with rank 0's
broker wrapped in cProfile: the profile stops when rank 0 starts its initial program (`true`),
which it does once every rank is online, and the top functions by their own time are printed,
with rank 0's CPU (utime + stime of all its threads, from times(2)) at that moment. The profiler
itself slows rank 0 down a few times over: the CPU figure to quote is the `rank 0 CPU` column of
`wireup.py --sections scale`, this is for where it goes. Nothing of tbon is changed: the two
functions are wrapped from outside, in the forked broker only.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import tempfile
import time

from common import progress, save_profile, show_profile, start_here


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--top", type=int, default=40, help="functions shown (default 40)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("-S", "--setattr", action="append", default=[])
    args = parser.parse_args()

    from tbon.overlay.broker import program
    from tbon.overlay.launch import local

    out = tempfile.mkdtemp(prefix="tbon-profile-")
    stats_path = os.path.join(out, "rank0.prof")
    profiler = cProfile.Profile(time.thread_time)  # CPU of the loop, not wall time
    original_run, original_start = local.run_broker, program.InitialProgram.start

    def run_broker(config, command):  # type: ignore[no-untyped-def]
        if command:  # rank 0: the only broker with the initial program
            profiler.enable()
        return original_run(config, command)

    def start(self):  # type: ignore[no-untyped-def]
        save_profile(profiler, stats_path)
        return original_start(self)

    local.run_broker = run_broker
    program.InitialProgram.start = start  # type: ignore[method-assign]
    progress(f"profile: {args.size} brokers, rank 0 under cProfile")
    code = start_here(local.main, args.size, ["true"], args.setattr)
    if not os.path.exists(stats_path):
        print(f"rank 0 never started its program (launcher exit {code})", file=sys.stderr)
        return 1
    show_profile(stats_path, "at all online", args.sort, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
