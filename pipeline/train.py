"""Train a DFlash drafter on Ray: prefetcher, target and drafter actors, one process per GPU.

    python -m pipeline.train                                  # embedded demo on CPU
    python -m pipeline.train cluster.drafters_per_node=1 train.plan.max_steps=50
    python -m pipeline.train --config-name qwen3_8b target.path=/models/Qwen3-8B
    python -m pipeline.train --cfg job                        # print the resolved config
    ray job submit --address http://HEAD:8265 --working-dir . \\
        --runtime-env launch/runtime_env.yaml -- python -m pipeline.train key=value ...
"""

import logging
import sys

import hydra

from pipeline.config import register_configs, reject_moved_keys, to_job_config
from pipeline.diskfull import disk_full_headline
from pipeline.driver.job import Driver
from pipeline.preflight import PreflightError

log = logging.getLogger(__name__)
register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg) -> None:
    job = to_job_config(cfg)
    try:
        driver = Driver(job)
    except PreflightError as e:
        log.error("%s", e)  # one line: a missing file or wandb key needs no traceback
        raise SystemExit(2) from None
    try:
        summary = driver.run()
    except Exception as e:
        line = disk_full_headline(e, driver.saves.last)
        if line is None:
            raise
        logging.raiseExceptions = False  # train.log sits on the full disk: no traceback for it
        log.error("%s", line)  # one line: the file that could not be written, what is kept
        raise SystemExit(1) from None
    log.info(
        "done: %d steps in %.1fs, loss %.4f -> %.4f, tau %s -> %s, export %s", summary.steps,
        summary.wall_s, summary.losses[0], summary.losses[-1], summary.tau_before,
        summary.tau_after, summary.export_dir)


if __name__ == "__main__":
    try:
        reject_moved_keys(sys.argv[1:])  # before Hydra, which would only call the key unknown
    except ValueError as e:
        sys.exit(f"error: {e}")
    main()
