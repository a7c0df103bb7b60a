"""Checkpoints: N steps, stop, resume, N more == 2N steps in one go; other layouts resume too."""

import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver

BASE = ["cluster.cpus_per_actor=0.5", "train.eval.every=-1", "train.export_dtype=float32",
        "data.micro_batch_size=2", "train.optim.lr=2e-3"]


def _losses(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_resume_matches_an_uninterrupted_run(ray_cluster, small_train_file, tmp_path):
    n = 3
    base = BASE + [f"data.train_path={small_train_file}", f"train.plan.max_steps={2 * n}"]
    Driver(compose_job(base + [f"train.out_dir={tmp_path / 'full'}"])).run()
    part = tmp_path / "part"
    first = Driver(compose_job(base + [f"train.plan.stop_at_step={n}",
                                       f"train.out_dir={part}"])).run()
    assert first.checkpoints and ckpt.latest(part).name == f"step_{n:08d}"
    resumed = Driver(compose_job(base + [f"train.out_dir={part}",
                                         "train.checkpoint.resume=auto"])).run()
    assert (resumed.first_step, resumed.end_step) == (n, 2 * n)
    want, got = _losses(tmp_path / "full"), _losses(part)
    assert sorted(got) == sorted(want) == list(range(1, 2 * n + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-6), step
    a = load_file(str(tmp_path / "full" / "export" / "model.safetensors"))
    b = load_file(str(part / "export" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-6, atol=1e-7)


def test_resume_onto_another_number_of_drafters(ray_cluster, small_train_file, tmp_path):
    over = BASE + [f"data.train_path={small_train_file}", f"train.out_dir={tmp_path / 'run'}"]
    first = Driver(compose_job(over + ["cluster.drafters_per_node=2",
                                       "train.plan.max_steps=2"])).run()
    point = ckpt.read_point(ckpt.latest(tmp_path / "run"))
    assert point.step == 2 and point.samples_done == 2 * 2 * 2
    second = Driver(compose_job(over + ["cluster.drafters_per_node=1",
                                        "train.checkpoint.resume=auto"])).run()
    # The rest of epoch 0 with one drafter: every remaining sample exactly once.
    account = second.accounts[0]
    assert not account.repeated and account.trained == account.expected
    assert account.expected == first.samples - point.samples_done
