"""Where rank 0's CPU goes while `tbon expand -n N` brings N brokers into it: cProfile on rank 0.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/profile_expand.py --size 256 [--top 40]

Runs the launcher of `tbon start` (tbon.overlay.launch.local) in this process for an instance of
rank 0 alone (`-S size=N+1`) whose initial program is `tbon expand -n N`; rank 0's broker is
wrapped in cProfile (thread CPU time) from its fork until it ends with that program, and the top
functions are printed with rank 0's CPU (utime + stime, from times(2)) at its end. The profiler
slows rank 0 down a few times over: `expand_rank0.py` gives the CPU figure to quote, this shows
where it goes. Nothing of tbon is changed: run_broker is wrapped from outside, in the fork only.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import tempfile
import time

from common import TBON, progress, save_profile, show_profile, start_here


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256, help="joiners (default 256)")
    parser.add_argument("--top", type=int, default=40, help="functions shown (default 40)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("-S", "--setattr", action="append", default=[])
    args = parser.parse_args()

    from tbon.overlay.launch import local

    out = tempfile.mkdtemp(prefix="tbon-profile-")
    stats_path = os.path.join(out, "rank0.prof")
    original_run = local.run_broker

    def run_broker(config, command):  # type: ignore[no-untyped-def]
        if not command:
            return original_run(config, command)
        profiler = cProfile.Profile(time.thread_time)  # CPU of the loop, not wall time
        profiler.enable()
        try:
            return original_run(config, command)
        finally:
            save_profile(profiler, stats_path)

    local.run_broker = run_broker
    progress(f"profile: expand -n {args.size} into rank 0 alone, rank 0 under cProfile")
    command = [str(TBON), "expand", "-n", str(args.size), "--timeout", "5m"]
    assignments = [f"size={args.size + 1}", *args.setattr]
    code = start_here(local.main, 1, command, assignments)
    if not os.path.exists(stats_path):
        print(f"rank 0 left no profile (launcher exit {code})", file=sys.stderr)
        return 1
    show_profile(stats_path, "from boot to end", args.sort, args.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
