"""The Ray pipeline against the single-process reference: same updates, every sample once."""

import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.model.target_init import target_init_of
from pipeline.job.resolve import resolve_job
from pipeline.training.drafter_trainer import build_drafter
from pipeline.reference.trainer import SingleProcessTrainer

BASE = ["cluster.drafters_per_node=2", "cluster.cpus_per_actor=0.5", "train.eval.every=-1",
        "train.export_dtype=float32", "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0"]
# The objectives besides DFlash's decayed CE: D-PACE weights (computed per micro-batch from
# its own CE), and distillation (the target's final hidden state rides in the slot).
OBJECTIVES = {"decay": [], "dpace": ["drafter.position_weights=dpace", "drafter.gamma=null"],
              "distill": ["drafter.distill_weight=0.5", "drafter.distill_temperature=2.0"]}


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("init,objective", [("random", "decay"), ("target_layers", "decay"),
                                            ("random", "dpace"), ("random", "distill")])
def test_two_drafters_three_micro_batches_match_single_process(ray_cluster, small_train_file,
                                                               tmp_path, init, objective):
    over = BASE + ["train.plan.grad_accum=3", "data.micro_batch_size=1", "train.plan.max_steps=2",
                   f"data.train_path={small_train_file}", f"drafter.init={init}",
                   *OBJECTIVES[objective]]
    ray_job = compose_job(over + [f"train.out_dir={tmp_path / 'ray'}"])
    summary = Driver(ray_job).run()
    ref_job = compose_job(over + [f"train.out_dir={tmp_path / 'ref'}"])
    history = SingleProcessTrainer(ref_job).train()

    assert summary.steps == 2 and len(history) == 2
    for loss, row in zip(summary.losses, history):
        assert loss == pytest.approx(row["train/loss"], rel=1e-5)
    assert summary.checksums_agree, "drafter replicas diverged"
    ray_w, ref_w = _weights(tmp_path / "ray" / "export"), _weights(tmp_path / "ref" / "export")
    assert ray_w.keys() == ref_w.keys()
    r = resolve_job(ref_job)
    start = target_init_of(ref_job.drafter, r.spec, r.target_path)
    assert (start is None) == (init == "random")
    initial = build_drafter(r.spec, ref_job.train.seed, "cpu", start).state_dict()
    # The update (weights minus their common init) over all parameters at once. Per element
    # the fp32 weights themselves limit the comparison (a norm weight near 1.0 is stored to
    # ~6e-8, a sizeable share of a 1e-3 step), so the whole update is compared by norm.
    ref_update = torch.cat([(ref_w[n] - initial[n]).flatten() for n in sorted(ref_w)])
    ray_update = torch.cat([(ray_w[n] - initial[n]).flatten() for n in sorted(ref_w)])
    assert ref_update.norm() > 1e-2, "the steps did not change the weights: vacuous comparison"
    rel = float((ray_update - ref_update).norm() / ref_update.norm())
    assert rel < 1e-5, f"updates differ by {rel:.2e} relative"
    # Per element, to 1e-6 but for a few: Adam divides each gradient by sqrt(v) + eps (1e-8),
    # so an element whose micro-batch gradients (~0.5) nearly cancel, then are clipped by
    # 1/50, sits near eps, and the float32 rounding of its sum (the all-reduce adds in another
    # order) reaches ~1e-6 of its update (seen with D-PACE: one of 4096 q_proj elements,
    # 1.8e-6, its step-1 sum -9.5e-5 of terms up to 0.77). Those stay within 1e-5.
    for name in ref_w:
        torch.testing.assert_close(ray_w[name], ref_w[name], rtol=1e-5, atol=1e-5)
    diff = torch.cat([(ray_w[n] - ref_w[n]).abs().flatten() for n in sorted(ref_w)])
    assert int((diff > 1e-6).sum()) <= diff.numel() // 10000, "more than 1 in 10^4 elements"
    rows = [json.loads(x) for x in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]


def test_every_sample_trained_exactly_once_per_epoch(ray_cluster, tiny_assets, tmp_path):
    subset = tmp_path / "subset.jsonl"
    lines = open(tiny_assets.train_path).read().splitlines()[:22]
    subset.write_text("\n".join(lines) + "\n")
    job = compose_job(BASE + ["train.plan.epochs=2", "data.micro_batch_size=3",
                              f"data.train_path={subset}", f"train.out_dir={tmp_path}"])
    summary = Driver(job).run()
    assert [a.epoch for a in summary.accounts] == [0, 1]
    for account in summary.accounts:
        assert account.exact, account.summary()
        assert account.trained == account.expected == summary.samples
    assert summary.samples > 0
    # 22 lines minus the ones dropped as too short, in steps of 2 drafters x 3 samples.
    assert summary.steps == 2 * -(-summary.samples // 6)
    assert summary.on_main_thread
