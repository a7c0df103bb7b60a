"""data.batching=bucket through the Ray pipeline: the reference's updates, every sample once,
and a resume that lands on the same micro-batch."""

import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.reference.trainer import SingleProcessTrainer

# The first 24 demo samples are 83 to 167 tokens: 5, 15 and 4 of them per bucket, in
# micro-batches of 4, 3 and 2 rows (512 tokens each at most).
pytestmark = pytest.mark.slow  # four Ray jobs and reference runs: a few minutes on 2 cores

BUCKETS = ["data.batching=bucket", "data.buckets=[128,160,256]",
           "data.tokens_per_micro_batch=512", "drafter.static_shapes=true"]
BASE = BUCKETS + ["cluster.drafters_per_node=2", "cluster.cpus_per_actor=0.5",
                  "train.eval.every=-1", "train.export_dtype=float32", "train.optim.lr=1e-3",
                  "train.optim.warmup_ratio=0.0"]


def _losses(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.parametrize("batching, steps", [("bucket", 5), ("pack", None)])
def test_bucketed_pipeline_matches_single_process(ray_cluster, small_train_file, tmp_path,
                                                   batching, steps):
    # pack: the same buckets for the target, one packed sequence and anchor pool per
    # micro-batch for the drafter (the workers' path against the reference's).
    over = BASE + [f"data.train_path={small_train_file}", "train.plan.epochs=1",
                   f"data.batching={batching}"]
    # No final save: the export still comes from the live drafter (a benchmark's setting).
    summary = Driver(compose_job(over + [f"train.out_dir={tmp_path / 'ray'}",
                                         "train.checkpoint.final=false"])).run()
    assert summary.checkpoints == [] and ckpt.latest(tmp_path / "ray") is None
    history = SingleProcessTrainer(compose_job(over + [f"train.out_dir={tmp_path / 'ref'}"])
                                   ).train()
    # Bucketed: 9 micro-batches (2 + 5 + 2) in steps of 2. One epoch, every sample once.
    assert summary.steps == len(history) == (steps or len(history))
    (account,) = summary.accounts
    assert account.exact and account.trained == summary.samples == 24, account.summary()
    assert len({row["samples"] for row in history}) > 1  # steps of different sizes
    for loss, row in zip(summary.losses, history):
        assert loss == pytest.approx(row["train/loss"], rel=1e-5)
    ray_w = load_file(str(tmp_path / "ray" / "export" / "model.safetensors"))
    ref_w = load_file(str(tmp_path / "ref" / "export" / "model.safetensors"))
    for name in ref_w:
        torch.testing.assert_close(ray_w[name], ref_w[name], rtol=1e-5, atol=1e-6)


def test_bucketed_resume_matches_an_uninterrupted_run(ray_cluster, small_train_file, tmp_path):
    """The run in one go is the reference (the test above shows the pipeline gives its
    losses), so two Ray jobs suffice: stopped at step 3, then resumed."""
    base = BASE + [f"data.train_path={small_train_file}", "train.plan.epochs=2",
                   "train.plan.max_steps=6"]
    history = SingleProcessTrainer(compose_job(base + [f"train.out_dir={tmp_path / 'ref'}"])
                                   ).train()
    part = tmp_path / "part"
    Driver(compose_job(base + ["train.plan.stop_at_step=3", f"train.out_dir={part}"])).run()
    point = ckpt.read_point(ckpt.latest(part))
    assert (point.step, point.epoch) == (3, 0) and 0 < point.samples_done < 24
    resumed = Driver(compose_job(base + [f"train.out_dir={part}",
                                         "train.checkpoint.resume=auto"])).run()
    assert (resumed.first_step, resumed.end_step) == (3, 6)
    want = {i + 1: row["train/loss"] for i, row in enumerate(history)}
    got = _losses(part)
    assert sorted(got) == sorted(want) == list(range(1, 7))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), step
