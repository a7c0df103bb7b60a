"""drafter.parallel=fsdp against the single-process reference, and its resume at 1 rank."""

import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.drafter_group import FSDP_POLICY, POLICY, Dispatch, policy_for
from pipeline.driver.job import Driver
from pipeline.resolve import resolve_job
from pipeline.training.drafter_trainer import build_drafter
from pipeline.training.single import SingleProcessTrainer

BASE = ["cluster.cpus_per_actor=0.5", "train.export_dtype=float32",
        "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0", "data.micro_batch_size=1",
        "train.plan.max_steps=4"]


def _logged(out_dir, key):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def test_fsdp_policy_sends_gathers_to_every_rank():
    assert policy_for("replicate") is POLICY and policy_for("fsdp") is FSDP_POLICY
    for method in ("weights", "export"):
        assert POLICY[method] is Dispatch.OWNER and FSDP_POLICY[method] is Dispatch.EVERY_RANK
    # A DCP save is entered by every rank in both modes.
    for method in ("save_checkpoint", "wait_saves"):
        assert POLICY[method] is FSDP_POLICY[method] is Dispatch.EVERY_RANK


def test_fsdp_refuses_compiled_drafters():
    with pytest.raises(ValueError, match="drafter.compile.*drafter.parallel=fsdp"):
        compose_job(["drafter.parallel=fsdp", "drafter.compile=reduce-overhead"])
    with pytest.raises(ValueError, match="drafter.parallel"):
        compose_job(["drafter.parallel=zero3"])


def test_two_fsdp_ranks_match_single_process_and_resume_at_one(ray_cluster, small_train_file,
                                                                tmp_path):
    """2 sharded ranks x 1 micro-batch, saved at step 2, resumed at 1 rank x 2 micro-batches:
    every step sums the same 2 micro-batches, so all 4 losses and the final weights are the
    reference's (1 process, 2 micro-batches per step)."""
    data = [f"data.train_path={small_train_file}"]
    ref_job = compose_job(BASE + data + ["cluster.drafters_per_node=1", "train.eval.every=-1",
                                         "train.plan.grad_accum=2",
                                         f"train.out_dir={tmp_path / 'ref'}"])
    history = SingleProcessTrainer(ref_job).train()
    run = BASE + data + ["drafter.parallel=fsdp", f"train.out_dir={tmp_path / 'run'}"]
    # The evaluator takes its weights through the every-rank gather (FSDP_POLICY).
    first = Driver(compose_job(run + ["cluster.drafters_per_node=2", "train.plan.grad_accum=1",
                                      "train.plan.stop_at_step=2", "train.eval.every=2",
                                      "train.eval.prompts=2", "train.eval.max_new_tokens=8"])
                   ).run()
    assert first.steps == 2 and first.checksums_agree, "the gathered weights differ by rank"
    assert first.tau_before is not None and first.tau_after is not None
    assert first.tau_before >= 1 and first.tau_after >= 1
    assert ckpt.read_point(ckpt.latest(tmp_path / "run")).step == 2
    second = Driver(compose_job(run + ["cluster.drafters_per_node=1", "train.plan.grad_accum=2",
                                       "train.eval.every=-1", "train.checkpoint.resume=auto"])
                    ).run()
    assert (second.first_step, second.end_step) == (2, 4)

    want = {i + 1: row["train/loss"] for i, row in enumerate(history)}
    got = _logged(tmp_path / "run", "train/loss")
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), step
    # AdamW hides a wrong gradient scale from the weights; the norm (before clipping) shows
    # whether every rank's gradients were summed and divided by the global denominator.
    norms = _logged(tmp_path / "run", "train/grad_norm")
    for i, row in enumerate(history):
        assert norms[i + 1] == pytest.approx(row["grad_norm"], rel=1e-4), i + 1
    ref_w = load_file(str(tmp_path / "ref" / "export" / "model.safetensors"))
    run_w = load_file(str(tmp_path / "run" / "export" / "model.safetensors"))
    assert run_w.keys() == ref_w.keys()
    initial = build_drafter(resolve_job(ref_job).spec, ref_job.train.seed, "cpu").state_dict()
    ref_update = torch.cat([(ref_w[n] - initial[n]).flatten() for n in sorted(ref_w)])
    run_update = torch.cat([(run_w[n] - initial[n]).flatten() for n in sorted(ref_w)])
    assert ref_update.norm() > 1e-2, "the steps did not change the weights: vacuous comparison"
    rel = float((run_update - ref_update).norm() / ref_update.norm())
    assert rel < 1e-5, f"updates differ by {rel:.2e} relative"
