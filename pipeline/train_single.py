"""Train a DFlash drafter in one process on one device, without Ray: the reference trainer.

    python -m pipeline.train_single                      # embedded demo on CPU
    python -m pipeline.train_single train.plan.max_steps=20 train.out_dir=runs/ref

It follows the same step plan as ``pipeline.train`` (cluster.drafters_per_node x
train.plan.grad_accum micro-batches per step), so the two must produce the same updates.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import hydra

from pipeline.runtime import startup_gc
from pipeline.job.cli_help import TRAIN_SINGLE_EXAMPLES, help_asked, hydra_page
from pipeline.job.config import check_command_line, register_configs, to_job_config
from pipeline.driver.runlock import RunLock
from pipeline.checks.preflight import PreflightError

if TYPE_CHECKING:
    from pipeline.reference.trainer import SingleProcessTrainer

register_configs()
log = logging.getLogger(__name__)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg) -> None:
    # torch and transformers (seconds of imports) once the command line passed its checks.
    from pipeline.reference.trainer import SingleProcessTrainer

    try:
        job = to_job_config(cfg)
        with RunLock(job.train.out_dir):  # its metrics.jsonl and export/ are this job's
            _refuse_checkpoints(job.train.out_dir)
            trainer = SingleProcessTrainer(job)
            startup_gc.started()  # the reference trainer built: its imports are done
            _train(trainer)
    except ValueError as e:  # PreflightError included: a config, file, data or folder mistake
        log.error("%s", e)  # one line, no traceback
        raise SystemExit(2) from None


def _refuse_checkpoints(out_dir: str) -> None:
    """The reference trainer neither writes nor resumes checkpoints: a folder holding those of
    a pipeline.train run is that run's, whose metrics and export it would overwrite."""
    from pipeline.checkpoint import step_folders

    found = step_folders(out_dir)
    if found:
        raise PreflightError(
            f"train.out_dir={out_dir!r} holds {len(found)} checkpoint(s) of a pipeline.train "
            f"run (newest {found[-1].name}); pipeline.train_single does not resume them and "
            f"would overwrite that run's metrics.jsonl and export/: pick another train.out_dir")


def _train(trainer: SingleProcessTrainer) -> None:
    off = trainer.tau_off
    if off:
        log.info("tau is not evaluated (%s)", off)
    tau_before = None if off else trainer.evaluate_tau()
    history = trainer.train()
    tau_after = None if off else trainer.evaluate_tau()
    shown = ["off" if t is None else f"{t:.3f}" for t in (tau_before, tau_after)]
    log.info("done: %d steps, loss %.4f -> %.4f, accuracy %.3f -> %.3f, tau %s -> %s",
             len(history), history[0]["train/loss"], history[-1]["train/loss"],
             history[0]["train/accuracy"], history[-1]["train/accuracy"], *shown)


if __name__ == "__main__":
    if help_asked(sys.argv[1:]):  # ours, not Hydra's: that one prints the whole config
        print(hydra_page("pipeline.train_single", __doc__, TRAIN_SINGLE_EXAMPLES, cluster=False))
        sys.exit(0)
    startup_gc.defer_full_collections()  # until the trainer is built (main)
    try:  # a config mistake in one line before Hydra, whose own report is several
        check_command_line(sys.argv[1:])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from pipeline.runtime import stop_signals  # Ray: after the checks

    stop_signals.install()  # SIGTERM unwinds as Ctrl-C does: the run folder is released
    try:
        main()
    except KeyboardInterrupt as stop:
        log.error("%s: pipeline.train_single keeps no checkpoint; the same command starts over",
                  stop_signals.cause(stop))
        sys.exit(stop_signals.exit_code(stop))
