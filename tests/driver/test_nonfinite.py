"""NaN and inf: a non-finite loss on one rank skips the update on every rank alike; K such steps
in a row stop the job with a clear error after saving the last good state."""

import logging
import shutil

import pytest
import ray
import torch
from safetensors.torch import load_file, save_file

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint import sharded
from pipeline.checkpoint.files import load_state
from pipeline.checkpoint.writer import TRAINER_FILE
from pipeline.dist.reduce import FlatReducer
from pipeline.dist.rendezvous import MasterAddress, init_group, pick_master
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.driver.recovery import NonFiniteError
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.target import load_target, load_target_head
from pipeline.training.config import OptimConfig
from pipeline.training.drafter_trainer import DrafterTrainer, build_drafter
from pipeline.training.optim import build_optimizer


class Replica:
    """One drafter replica on CPU: the plain trainer plus the real gloo all-reduce."""

    def __init__(self, rank: int, target_dir: str, target_config: dict) -> None:
        options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=95,
                                num_anchors=4)
        spec = build_drafter_spec(target_config, options)
        self.rank = rank
        self.target = load_target(target_dir, spec.target_layer_ids, "cpu", torch.float32)
        self.trainer = DrafterTrainer(spec, options, OptimConfig(lr=1e-2, warmup_ratio=0.0), 0,
                                      load_target_head(target_dir), "cpu", None, 4)
        self.reducer = None

    def master(self) -> MasterAddress:
        return pick_master()

    def join(self, addr: str, port: int) -> None:
        init_group(self.rank, 2, addr, port, "gloo", timeout_s=60)
        numel = sum(p.numel() for p in self.trainer.model.parameters())
        self.reducer = FlatReducer(numel, "cpu")

    def train_step(self, poison: bool) -> tuple[bool, float, int]:
        """(skipped, parameter checksum, AdamW states) after one step on 2 samples."""
        torch.manual_seed(self.rank)
        ids = torch.randint(0, 90, (2, 20))
        mask = torch.zeros_like(ids)
        mask[:, 6:] = 1
        with torch.no_grad():
            feats = self.target(ids)
        if poison:
            feats = torch.full_like(feats, float("nan"))
        self.trainer.forward_backward(feats, ids, mask, [2 * self.rank, 2 * self.rank + 1], 0)
        out = self.trainer.step(self.reducer)
        with torch.no_grad():  # a float() of a tensor that requires grad warns
            checksum = float(sum(p.double().sum() for p in self.trainer.model.parameters()))
        return out.skipped, checksum, len(self.trainer.optimizer.state)


def test_a_nan_on_one_rank_skips_the_update_on_every_rank(ray_session, random_target_dir,
                                                          target_config):
    replicas = [ray.remote(Replica).remote(r, str(random_target_dir), target_config)
                for r in range(2)]
    try:
        master = ray.get(replicas[0].master.remote())
        ray.get([r.join.remote(master.addr, master.port) for r in replicas])
        first = ray.get([r.train_step.remote(False) for r in replicas])  # a good step
        assert [f[0] for f in first] == [False, False] and first[0][1] == first[1][1]
        start = first[0]
        poisoned = ray.get([r.train_step.remote(r is replicas[1]) for r in replicas])
        # Only rank 1 saw NaN, and both skipped: weights and AdamW state as before.
        assert [p[0] for p in poisoned] == [True, True]
        assert {p[1] for p in poisoned} == {start[1]}
        good = ray.get([r.train_step.remote(False) for r in replicas])
        assert [g[0] for g in good] == [False, False]
        assert good[0][1] == good[1][1] != start[1]
    finally:
        for r in replicas:
            ray.kill(r)


@pytest.fixture(scope="module")
def nan_target(tiny_assets, tmp_path_factory):
    """The tiny target with NaN weights in its first layer: every tap, every loss is NaN."""
    path = tmp_path_factory.mktemp("nan_target") / "target"
    shutil.copytree(tiny_assets.target_dir, path)
    weights = load_file(str(path / "model.safetensors"))
    weights["model.layers.0.mlp.down_proj.weight"].fill_(float("nan"))
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_nonfinite_steps_in_a_row_stop_the_job_after_saving_the_last_good_state(
        ray_cluster, small_train_file, nan_target, tmp_path, caplog):
    out = tmp_path / "run"
    # drafter.init=random: the seeded initial weights are then build_drafter's below.
    job = compose_job(["drafter.init=random", "cluster.cpus_per_actor=0.5",
                       "train.eval.every=-1", "data.micro_batch_size=2", f"data.train_path={small_train_file}",
                       f"target.path={nan_target}", f"train.out_dir={out}",
                       "train.recovery.max_nonfinite_in_row=2", "train.plan.max_steps=6"])
    driver = Driver(job)
    with caplog.at_level(logging.WARNING), pytest.raises(NonFiniteError) as err:
        driver.run()
    assert "2 steps in a row (up to step 2) had a non-finite loss or gradient" in str(err.value)
    assert "train.recovery.max_nonfinite_in_row=2" in str(err.value)
    assert "step 1: non-finite loss or gradient" in caplog.text
    assert "update skipped on every drafter (2 in a row, 2 in this job)" in caplog.text
    saved = ckpt.latest(out)
    assert saved is not None and str(saved) in str(err.value)
    # The last good state: no update was applied, so the weights are the seeded initial ones.
    assert load_state(saved / TRAINER_FILE)["steps_done"] == ckpt.read_point(saved).step >= 2
    init = build_drafter(driver.r.spec, job.train.seed, "cpu").state_dict()
    model = build_drafter(driver.r.spec, job.train.seed + 1, "cpu")
    optim = build_optimizer(model, job.train.optim)
    sharded.load(model, optim, saved, group=None)
    for name, value in init.items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    assert optim.state_dict()["state"] == {}  # saved as it was: no update, no AdamW state
