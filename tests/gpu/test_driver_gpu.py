"""The real driver on CUDA: resume, a SIGKILLed drafter, the evaluator and its death.

The CPU suite runs the same paths on CPU; these prove the CUDA branches (RNG states that must
stay CPU tensors, pinned host snapshots, CUDA IPC between two processes on one GPU). Layout:
cluster=one_gpu's shape on the tiny demo target: 1 target and 1 drafter at 0.45 of the GPU
each, the evaluator at 0.1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import pytest
import ray

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from tests.gpu.resume_match import DRIFT, close_exports, losses, same_step

ONE_GPU = ["cluster.drafters_per_node=1", "cluster.gpus_per_actor=0.45",
           "cluster.cpus_per_actor=0.5", "data.micro_batch_size=2", "train.optim.lr=2e-3",
           "train.export_dtype=float32", "train.log_every=100", "train.precision=fp32"]


@pytest.fixture()
def gpu_job(device, small_train_file, tmp_path):
    def make(*extra: str):
        return compose_job(ONE_GPU + [f"cluster.device={device}",
                                      f"data.train_path={small_train_file}", *extra])
    return make


def test_resume_on_cuda_continues_the_uninterrupted_run(ray_cluster, gpu_job, tmp_path):
    """3 steps, stop, resume, 3 more == 6 in one go: the first resumed step within CUDA's
    run-to-run noise (FIRST_STEP), the rest and the final weights within its drift."""
    base = ["train.eval.every=-1", "train.plan.max_steps=6"]
    Driver(gpu_job(*base, f"train.out_dir={tmp_path / 'full'}")).run()
    part = tmp_path / "part"
    Driver(gpu_job(*base, "train.plan.stop_at_step=3", f"train.out_dir={part}")).run()
    assert ckpt.latest(part).name == "step_00000003"
    resumed = Driver(gpu_job(*base, f"train.out_dir={part}",
                             "train.checkpoint.resume=auto")).run()
    assert (resumed.first_step, resumed.end_step) == (3, 6)
    want, got = losses(tmp_path / "full"), losses(part)
    assert sorted(got) == sorted(want) == list(range(1, 7))
    same_step(got[4][-1], want[4][-1], want[3][-1])
    for step in range(1, 7):
        assert got[step][-1] == pytest.approx(want[step][-1], rel=DRIFT), step
    close_exports(tmp_path / "full", part)


def _actor_pid(handle) -> int:
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))


def test_sigkilled_drafter_restarts_alone_and_continues(ray_cluster, gpu_job, tmp_path,
                                                        caplog):
    """SIGKILL of the drafter after step 5: only the drafter restarts (the target and its
    ring stay), it resumes from the last checkpoint, and the steps trained twice repeat the
    first pass's losses."""
    out = tmp_path / "run"
    driver = Driver(gpu_job("train.eval.every=-1", "train.plan.max_steps=8",
                            "train.checkpoint.every=2", f"train.out_dir={out}"))
    seen: dict = {"actors": []}

    def kill_after(done: int) -> None:
        seen["actors"].append(driver.actors.targets[0]._actor_id)
        if done == 5 and "killed_at" not in seen:
            os.kill(_actor_pid(driver.actors.drafters[0]), signal.SIGKILL)
            seen["killed_at"] = time.time()
    driver.step_listeners.append(kill_after)
    with caplog.at_level(logging.INFO):
        summary = driver.run()
    (rec,) = summary.restarts
    # The newest checkpoint: step 4, or 6 when step 6 completed before the loss was seen.
    assert rec.actor.startswith("drafter 0") and rec.resumed_step in (4, 6)
    assert len(seen["actors"]) > 8 and len(set(seen["actors"])) == 1, "target restarted"
    assert seen["killed_at"] <= rec.detected_at <= rec.training_at
    trained = losses(out)
    assert sorted(trained) == list(range(1, 9))
    repeated = [s for s, values in trained.items() if len(values) == 2]
    assert repeated and all(s > rec.resumed_step for s in repeated)
    first = min(repeated)  # the first step after the restart repeats to CUDA's noise
    same_step(trained[first][1], trained[first][0], trained[first - 1][0])
    for step in repeated:  # later ones within CUDA's run-to-run drift
        assert trained[step][1] == pytest.approx(trained[step][0], rel=DRIFT), step
    assert all(a.exact for a in summary.accounts)
    assert ckpt.latest(out).name == "step_00000008"


def test_evaluator_on_cuda_and_its_death(ray_cluster, gpu_job, tmp_path, caplog):
    """tau before and during training on the GPU; after the evaluator is killed, training
    goes on untouched (no restart of the training set) and a later evaluation lands."""
    out = tmp_path / "run"
    driver = Driver(gpu_job("train.plan.max_steps=8", "train.eval.every=2",
                            "train.eval.prompts=2", "train.eval.max_new_tokens=8",
                            f"train.out_dir={out}"))

    def kill_evaluator(done: int) -> None:
        if done == 3:
            # The evaluations sent so far (before training, after step 2) land first: the
            # actor runs its calls in order, so this no-op returns after them. Without it the
            # test depends on the evaluator's speed beside training (killed before tau before
            # was in, on an H200 shared with another job, 2026-12-03).
            ray.get(driver.evaluator.actor.__ray_ready__.remote())
            ray.kill(driver.evaluator.actor)
    driver.step_listeners.append(kill_evaluator)
    with caplog.at_level(logging.INFO):
        summary = driver.run()
    assert summary.restarts == []
    assert summary.tau_before is not None and summary.tau_after is not None
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    tau_steps = sorted(r["step"] for r in rows if "eval/tau" in r)
    assert 0 in tau_steps and 8 in tau_steps
    assert any(s in tau_steps for s in (4, 6)), tau_steps  # evaluated again after the death
    assert "tau evaluator" in caplog.text
    # the weights went GPU to GPU through drafter rank 0's snapshot ring (CUDA IPC)
    assert "weights through the ring" in caplog.text
