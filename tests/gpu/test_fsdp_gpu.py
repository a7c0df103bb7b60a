"""drafter.parallel=fsdp on CUDA at world size 1 (NCCL): it trains as the replicated path and
resumes. Layout: cluster=one_gpu's shape on the tiny demo target (see test_driver_gpu.py)."""

from __future__ import annotations

import pytest

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from tests.gpu.resume_match import DRIFT, close_exports, losses

ONE_GPU = ["cluster.drafters_per_node=1", "cluster.gpus_per_actor=0.45",
           "cluster.cpus_per_actor=0.5", "data.micro_batch_size=2", "train.optim.lr=2e-3",
           "train.export_dtype=float32", "train.log_every=100", "train.precision=fp32",
           "train.eval.every=-1", "train.plan.max_steps=6"]


def test_fsdp_trains_as_replicated_and_resumes(ray_cluster, device, small_train_file,
                                               tmp_path):
    def run(*extra: str):
        return Driver(compose_job(ONE_GPU + [f"cluster.device={device}",
                                             f"data.train_path={small_train_file}",
                                             *extra])).run()

    run(f"train.out_dir={tmp_path / 'replicate'}")
    sharded = tmp_path / "fsdp"
    run("drafter.parallel=fsdp", "train.plan.stop_at_step=3", f"train.out_dir={sharded}")
    assert ckpt.latest(sharded).name == "step_00000003"
    resumed = run("drafter.parallel=fsdp", "train.checkpoint.resume=auto",
                  f"train.out_dir={sharded}")
    assert (resumed.first_step, resumed.end_step) == (3, 6)
    want, got = losses(tmp_path / "replicate"), losses(sharded)
    assert sorted(got) == sorted(want) == list(range(1, 7))
    assert abs(want[6][0] - want[1][0]) > 1e-2 * abs(want[1][0]), "the run did not train"
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=DRIFT), step
    close_exports(tmp_path / "replicate", sharded)
