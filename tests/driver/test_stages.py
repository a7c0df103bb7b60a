"""target.stages through the driver: same losses as the single-process reference, refusals
before any actor starts, and cluster.layout=auto counting a staged target's GPUs."""

import json

import pytest

from pipeline.job.config import ClusterConfig
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.driver.launcher import check_gpu_layout
from pipeline.driver.layout import Rates, choose_layout
from pipeline.driver.memory import (BUSY_BYTES, CONTEXT_BYTES, GB, _needs, busy_line,
                                    check_target_memory)
from pipeline.eval.config import EvalConfig
from pipeline.job.resolve import resolve_job
from pipeline.reference.trainer import SingleProcessTrainer

BASE = ["cluster.drafters_per_node=2", "cluster.cpus_per_actor=0.5", "train.eval.every=-1",
        "train.export_dtype=float32", "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0",
        "train.plan.grad_accum=2", "data.micro_batch_size=2", "train.plan.max_steps=2",
        "train.checkpoint.final=false"]


def test_more_stages_than_layers_is_refused(ray_cluster, tiny_assets, tmp_path):
    # The demo drafter taps [1, 3, 5] of the tiny target: 6 layers up to the deepest tap.
    job = compose_job(BASE + ["target.stages=7", f"train.out_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"target.stages=7 is not allowed: .* 6 decoder "
                                         r"layers.* allowed 1..6"):
        Driver(job).run()


def test_a_stage_too_large_for_its_gpu_share_is_refused_naming_what_fits(tiny_assets,
                                                                          tmp_path):
    job = compose_job(BASE + [f"train.out_dir={tmp_path}"])
    r = resolve_job(job, device="cuda")
    one, two = max(n.total for n in _needs(job, r, 1)), max(n.total for n in _needs(job, r, 2))
    assert two < one
    # A GPU whose whole share fits two stages but not the whole target.
    gb = (CONTEXT_BYTES + (one + two) / 2) / GB
    for stages, refused in ((1, True), (2, False)):
        sized = compose_job(BASE + [f"train.out_dir={tmp_path}", f"target.stages={stages}",
                                    f"cluster.gpu_memory_gb={gb}", "cluster.gpus_per_actor=1"])
        if not refused:
            check_target_memory(sized, r, "cuda", [])
            continue
        with pytest.raises(ValueError, match=r"target.stages=1 is not allowed: stage 0 of the "
                                             r"target needs .* GB \(weights .*allowed: "
                                             r"target.stages >= 2"):
            check_target_memory(sized, r, "cuda", [])
    # The tau evaluator holds the whole target on one GPU, unstaged.
    tiny_gpu = compose_job(BASE[:2] + BASE[3:] + [
        f"train.out_dir={tmp_path}", "target.stages=2", "train.eval.every=0",
        f"cluster.gpu_memory_gb={CONTEXT_BYTES / GB + 1e-4}", "cluster.gpus_per_actor=1"])
    with pytest.raises(ValueError, match=r"train.eval.every=0 is not allowed with this target: "
                                         r"the tau evaluator holds the whole target"):
        check_target_memory(tiny_gpu, r, "cuda", [])
    # On CPU only the layer count is checked.
    check_target_memory(compose_job(BASE + [f"train.out_dir={tmp_path}",
                                            "cluster.gpu_memory_gb=0.001"]), r, "cpu", [])


def test_a_gpu_already_in_use_is_named_before_any_actor_starts():
    """The 8B job on an 80 GB H100 beside a process holding 32 GB (2026-12-05) ran out of
    memory in its evaluator; the driver now says so up front."""
    total = int(80 * GB)
    assert busy_line(CONTEXT_BYTES, total) is None  # a context's worth
    assert busy_line(CONTEXT_BYTES + BUSY_BYTES, total) is None
    line = busy_line(int(33.5 * GB), total)
    assert line.startswith("GPU memory: 33.5 GB of this GPU's 80 GB are in use before any "
                           "actor starts")
    assert "\n" not in line


def test_layout_auto_counts_a_staged_target_as_its_stages():
    ev = EvalConfig(every=-1)
    rates = Rates(10.0, 5.0)
    choice = choose_layout(rates, 8, ev, stages=2)
    c = choice.chosen
    # t targets x 2 GPUs + (8 - 2t) drafters: min(10t, 5(8-2t)) is best at t=2: 20 vs 20.
    assert (c.targets, c.drafters, c.stages, c.gpus) == (2, 4, 2, 8)
    assert c.samples_per_s == pytest.approx(20.0)
    assert not any(x.colocated for x in choice.candidates)
    cluster = ClusterConfig(device="cuda", targets_per_node=c.targets,
                            drafters_per_node=c.drafters, gpus_per_actor=c.gpus_per_actor)
    check_gpu_layout(cluster, ev, [8], stages=2)
    with pytest.raises(ValueError, match="do not pack"):
        check_gpu_layout(cluster, ev, [7], stages=2)
    with pytest.raises(ValueError, match=r"no layout on 2 GPU\(s\) per node for "
                                         r"target.stages=2"):
        choose_layout(rates, 2, ev, stages=2)


def test_two_stages_give_the_losses_of_one_and_a_killed_stage_restarts_the_set(
        ray_cluster, small_train_file, tmp_path):
    """One staged job: its losses are the unstaged reference's, also for the steps trained
    again after stage 0 is killed and the set restarts from the last checkpoint; every sample
    is trained once per epoch."""
    import ray

    # One drafter of 4 micro-batches a step (the same 8 samples as 2 x 2): the stages are what
    # is checked, and each restart of the set starts one drafter fewer.
    over = [{"cluster.drafters_per_node=2": "cluster.drafters_per_node=1",
             "train.plan.grad_accum=2": "train.plan.grad_accum=4"}.get(o, o) for o in BASE[:-2]]
    over += ["train.plan.epochs=2", f"data.train_path={small_train_file}"]
    driver = Driver(compose_job(over + ["target.stages=2", "train.checkpoint.every=2",
                                        f"train.out_dir={tmp_path / 'ray'}"]))
    seen, killed = [], []

    def kill_stage_0(done: int) -> None:
        seen.append([len(c) for c in driver.actors.chains])
        if done == 3 and not killed:
            ray.kill(driver.actors.chains[0][0])  # stage 0: the last stage's calls wait on it
            killed.append(done)
    driver.step_listeners.append(kill_stage_0)
    summary = driver.run()
    assert seen and all(chains == [2] for chains in seen), seen  # one target of 2 stage actors
    assert killed and [r.actor for r in summary.restarts] == ["target 0 stage 0 (node 0)"]
    # Step 4 may be saved before the loss shows.
    assert summary.restarts[0].resumed_step in (2, 4)
    for account in summary.accounts:
        assert account.exact, account.summary()
    assert [a.epoch for a in summary.accounts] == [0, 1]
    history = SingleProcessTrainer(compose_job(over + [f"train.out_dir={tmp_path / 'ref'}"])
                                   ).train()
    rows = [json.loads(x) for x in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    got = {}
    for row in rows:
        if "train/loss" in row:
            got.setdefault(row["step"], []).append(row["train/loss"])
    assert summary.end_step == len(history) == 6 and sorted(got) == list(range(1, 7))
    for i, row in enumerate(history):
        for loss in got[i + 1]:  # the first try and the one after the restart alike
            assert loss == pytest.approx(row["train/loss"], rel=1e-5), i + 1
    assert summary.checksums_agree and summary.on_main_thread


def test_a_distilling_target_is_sized_with_every_layer_and_one_more_ring_block(tiny_assets,
                                                                              tmp_path):
    """With distillation the target runs to its end and each slot carries its final hidden
    state after the taps: the memory check counts both, or it would pass a target that then
    runs out of memory."""
    taps = "drafter.target_layer_ids=[0,1]"  # well short of the tiny target's last layer
    plain = compose_job(BASE + [f"train.out_dir={tmp_path}", taps])
    distil = compose_job(BASE + [f"train.out_dir={tmp_path}", taps, "drafter.distill_weight=0.5"])
    r_plain, r_distil = resolve_job(plain, device="cuda"), resolve_job(distil, device="cuda")
    (a,), (b,) = _needs(plain, r_plain, 1), _needs(distil, r_distil, 1)
    assert b.rings * 2 == a.rings * 3  # 2 taps, then 3 column blocks
    assert b.weights > a.weights  # the layers after the deepest tap load too
