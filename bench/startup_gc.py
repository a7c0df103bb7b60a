"""What deferring full garbage collections saves a process's start-up (pipeline/startup_gc.py).

    python -m bench.startup_gc --runs 7

Starts fresh Python processes that import what an actor of ours imports (torch with dynamo,
transformers' masking utilities, Ray, our package first), alternately with and without the
deferral our launcher asks for, and prints each way's median CPU-seconds (user + system)
of the imports, the full collections run meanwhile, and the median saving.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from pipeline import startup_gc

_IMPORTS = """
import gc, json, resource
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0 = cpu()
import pipeline, torch, torch._dynamo, transformers.masking_utils, ray
print(json.dumps({"cpu_s": cpu() - t0, "full": gc.get_stats()[2]["collections"]}))
"""


def one(deferred: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != startup_gc.ENV_VAR}
    if deferred:
        env[startup_gc.ENV_VAR] = "1"
    out = subprocess.run([sys.executable, "-c", _IMPORTS], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="processes each way")
    args = parser.parse_args()
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(args.runs):  # alternated: the machine's drift falls on both ways alike
        for deferred in (False, True):
            runs[deferred].append(one(deferred))
    median = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    for deferred, label in ((False, "Python's thresholds"), (True, "deferred")):
        full = sorted({r["full"] for r in runs[deferred]})
        print(f"{label:20s} median {median[deferred]:.2f} CPU-s over {args.runs} processes, "
              f"full collections {full}")
    print(f"saved: {median[False] - median[True]:.2f} CPU-s a process "
          f"({1 - median[True] / median[False]:.0%})")


if __name__ == "__main__":
    main()
