"""Compose a JobConfig from conf/ outside a Hydra entry point (tests, tools, notebooks)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.job.config import JobConfig, register_configs, reject_moved_keys, to_job_config

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_job(overrides: Sequence[str] = (), config_name: str = "config") -> JobConfig:
    """The same composition as ``python -m pipeline.train key=value ...``."""
    from hydra import compose, initialize_config_dir

    reject_moved_keys(overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name, overrides=list(overrides))
    return to_job_config(cfg)
