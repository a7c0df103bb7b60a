"""Train a DFlash drafter on Ray: prefetcher, target and drafter actors, one process per GPU.

    python -m pipeline.train                                  # embedded demo on CPU
    python -m pipeline.train cluster.drafters_per_node=1 train.plan.max_steps=50
    python -m pipeline.train --config-name qwen3_8b target.path=/models/Qwen3-8B
    python -m pipeline.train --cfg job                        # print the resolved config
    (Ctrl-C, or SIGTERM from `ray job stop`/kill: one line with the command that resumes)
    ray job submit --address http://HEAD:8265 --working-dir . \\
        --runtime-env launch/runtime_env.yaml -- python -m pipeline.train key=value ...
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import hydra

from pipeline.runtime import startup_gc
from pipeline.job.cli_help import TRAIN_EXAMPLES, help_asked, hydra_page
from pipeline.job.config import check_command_line, register_configs, to_job_config
from pipeline.runtime.diskfull import disk_full_headline
from pipeline.driver.runlock import RunLock
from pipeline.job.gpu_oom import gpu_oom_headline
from pipeline.checks.preflight import PreflightError

if TYPE_CHECKING:
    from pipeline.driver.job import Driver, RunSummary

log = logging.getLogger(__name__)
register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg) -> None:
    # The job's modules (torch, Ray, transformers: seconds of imports) are imported here, once
    # the command line passed its checks: a refused command line exits without them.
    from pipeline.runtime import stop_signals
    from pipeline.driver.resume_hint import interrupted_line

    try:
        job = to_job_config(cfg)
    except ValueError as e:  # a config mistake: one line
        log.error("%s", e)
        raise SystemExit(2) from None
    driver = None
    try:
        with RunLock(job.train.out_dir):  # before the driver reads out_dir to resume
            driver = _driver(job)
            summary = driver.run()
    except PreflightError as e:
        log.error("%s", e)  # one line: a missing file, a wandb key or a locked folder
        raise SystemExit(2) from None
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (stop_signals.Terminated)
        # Caught here, inside Hydra's task function: Hydra would print the traceback. By
        # now the driver has stopped the actors and Ray, removed its unpublished checkpoint
        # writes and released out_dir.
        log.error("%s", interrupted_line(job.train.out_dir, sys.argv[1:],
                                         job.train.checkpoint.resume, stop_signals.cause(stop),
                                         driver.saves.last if driver is not None else None))
        raise SystemExit(stop_signals.exit_code(stop)) from None
    except Exception as e:
        kept = driver.saves.last if driver is not None else None
        line = gpu_oom_headline(e, job, None if kept is None else str(kept))
        if line is None:
            line = disk_full_headline(e, kept)
            if line is None:
                raise
            logging.raiseExceptions = False  # train.log sits on the full disk: no traceback
        log.error("%s", line)  # one line: what ran out, what is kept
        raise SystemExit(1) from None
    if _report(summary):
        raise SystemExit(1)


def _report(summary: RunSummary) -> int:
    """The job's last line; 1 when eval was on and every tau evaluation failed."""
    if summary.nothing_to_train:
        return 0  # the driver said why, in one line
    loss = (f"loss {summary.losses[0]:.4f} -> {summary.losses[-1]:.4f}" if summary.losses
            else "no loss reported")
    done = f"{summary.steps} steps in {summary.wall_s:.1f}s, {loss}"
    if summary.evals.all_failed:  # trained and exported, but without the figure asked for
        kept = (f"export {summary.export_dir} and checkpoint {summary.checkpoints[-1]} are kept"
                if summary.checkpoints else f"export {summary.export_dir} is kept")
        log.error("%s; training finished (%s): %s", summary.evals.never_line(), done, kept)
        return 1
    log.info("done: %s, %s, export %s", done,
             summary.evals.phrase(summary.tau_before, summary.tau_after), summary.export_dir)
    return 0


def _driver(job) -> Driver:
    """The driver, or a refusal: what its constructor rejects (a tap id, a mask token, a
    changed setting on resume) is a user's mistake, found before Ray starts."""
    from pipeline.driver.job import Driver

    try:
        return Driver(job)
    except ValueError as e:
        raise PreflightError(str(e)) from None


if __name__ == "__main__":
    if help_asked(sys.argv[1:]):  # ours, not Hydra's: that one prints the whole config
        print(hydra_page("pipeline.train", __doc__, TRAIN_EXAMPLES))
        sys.exit(0)
    startup_gc.defer_full_collections()  # until the job trains (Driver._run)
    try:  # a config mistake in one line before Hydra, whose own report is several
        check_command_line(sys.argv[1:])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from pipeline.runtime import stop_signals  # Ray: after the checks (see main)

    # SIGTERM (ray job stop, a preemption, kill) unwinds the job as Ctrl-C does: exit 143.
    stop_signals.install()
    try:
        main()
    except KeyboardInterrupt as stop:  # before the job started (Hydra composing), or a second
        print("interrupted", file=sys.stderr)  # Ctrl-C while the first one unwound
        sys.exit(stop_signals.exit_code(stop))
