"""bench/quality: the trainer overrides compose into the job config both trainers validate."""

import pytest

from bench.quality.overrides import trainer_overrides
from bench.quality.scale import SCALES
from pipeline.driver.compose import compose_job


@pytest.mark.parametrize("name", sorted(SCALES))
def test_overrides_compose_and_carry_the_scale(name):
    scale = SCALES[name]
    job = compose_job(trainer_overrides(scale, "/w/target", "/w/train.jsonl",
                                        "/w/heldout.jsonl", "/w/runs/x"))
    assert job.cluster.num_drafters == 1 and job.cluster.device == scale.cluster_device
    assert job.cluster.cpus_per_actor == scale.cpus_per_actor
    assert job.logger.kind == "none"
    d = job.drafter
    assert (d.block_size, d.num_layers, d.num_anchors) == (scale.block_size,
                                                           scale.drafter_layers,
                                                           scale.num_anchors)
    assert d.attention == scale.attention and d.static_shapes
    assert d.target_layer_ids is None and d.num_taps == scale.num_taps  # the default spread
    assert job.data.train_path == "/w/train.jsonl" and job.target.path == "/w/target"
    assert job.train.plan.max_steps == scale.max_steps and job.train.optim.lr == scale.drafter_lr
    assert job.train.eval.every == scale.eval_every and job.train.out_dir == "/w/runs/x"


def test_gpu_scale_is_block_16_on_cuda():
    gpu = SCALES["gpu"]
    assert gpu.block_size == 16 and gpu.device == gpu.cluster_device == "cuda"
    assert (gpu.attention, gpu.compile) == ("flex", "default")


def test_gpu_budgets_fit_two_ten_minute_commands():
    # Python start-up, imports and the result files get the rest of each command's 600 s.
    gpu = SCALES["gpu"]
    budgets = gpu.budgets()
    assert len(gpu.calls()) == 2
    for call in gpu.calls():
        assert sum(budgets[stage] for stage in call) <= 570, call
