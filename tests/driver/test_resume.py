"""Checkpoints: N steps, stop, resume, N more == 2N steps in one go; other layouts resume too.

One stopped run serves both tests (each resumes a copy of it). The run in one go is the
single-process reference: tests/driver/test_equivalence.py shows the Ray pipeline gives its
updates, so a resume that matches it continues the uninterrupted run, without a third job.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.model.target_init import target_init_of
from pipeline.job.resolve import resolve_job
from pipeline.training.drafter_trainer import build_drafter
from pipeline.reference.trainer import SingleProcessTrainer

N = 3
BASE = ["cluster.cpus_per_actor=0.5", "train.eval.every=-1", "train.export_dtype=float32",
        "data.micro_batch_size=2", "train.optim.lr=2e-3", "train.plan.epochs=1",
        "cluster.drafters_per_node=2"]


def _losses(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _base(small_train_file):
    return BASE + [f"data.train_path={small_train_file}", f"train.plan.max_steps={2 * N}"]


@pytest.fixture(scope="module")
def stopped(ray_cluster, small_train_file, tmp_path_factory):
    """(out_dir, summary) of a 2-drafter run stopped after N of its 2N steps."""
    part = tmp_path_factory.mktemp("resume") / "part"
    first = Driver(compose_job(_base(small_train_file) + [f"train.plan.stop_at_step={N}",
                                                          f"train.out_dir={part}"])).run()
    assert first.checkpoints and ckpt.latest(part).name == f"step_{N:08d}"
    return part, first


def test_resume_matches_an_uninterrupted_run(stopped, small_train_file, tmp_path):
    part = tmp_path / "part"
    shutil.copytree(stopped[0], part)
    resumed = Driver(compose_job(_base(small_train_file) + [
        f"train.out_dir={part}", "train.checkpoint.resume=auto"])).run()
    assert (resumed.first_step, resumed.end_step) == (N, 2 * N)
    ref = tmp_path / "ref"
    ref_job = compose_job(_base(small_train_file) + [f"train.out_dir={ref}"])
    history = SingleProcessTrainer(ref_job).train()
    want, got = {i + 1: row["train/loss"] for i, row in enumerate(history)}, _losses(part)
    assert sorted(got) == sorted(want) == list(range(1, 2 * N + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), step
    # The whole update by norm, as test_equivalence compares it: per element, fp32 rounding
    # in another summation order is a sizeable share of a step on a weight near zero.
    r = resolve_job(ref_job)
    start = build_drafter(r.spec, ref_job.train.seed, "cpu",
                          target_init_of(ref_job.drafter, r.spec, r.target_path)).state_dict()
    a = load_file(str(ref / "export" / "model.safetensors"))
    b = load_file(str(part / "export" / "model.safetensors"))
    ref_update = torch.cat([(a[n] - start[n]).flatten() for n in sorted(a)])
    got_update = torch.cat([(b[n] - start[n]).flatten() for n in sorted(a)])
    assert ref_update.norm() > 1e-2, "the steps did not change the weights: vacuous comparison"
    rel = float((got_update - ref_update).norm() / ref_update.norm())
    assert rel < 1e-5, f"updates differ by {rel:.2e} relative"


def test_resume_onto_another_number_of_drafters(stopped, small_train_file, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stopped[0], run)
    point = ckpt.read_point(ckpt.latest(run))
    assert point.step == N and point.samples_done == N * 2 * 2
    # No max_steps: the rest of epoch 0 with one drafter, 2 samples a step instead of 4.
    over = [o for o in _base(small_train_file) if not o.startswith("train.plan.max_steps")]
    second = Driver(compose_job(over + ["cluster.drafters_per_node=1", f"train.out_dir={run}",
                                        "train.checkpoint.resume=auto"])).run()
    account = second.accounts[0]
    assert not account.repeated and account.trained == account.expected
    assert account.expected == stopped[1].samples - point.samples_done > 0
