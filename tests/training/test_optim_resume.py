"""A resume takes train.optim from its config: torch's load_state_dict restores the saved lr,
betas and weight decay, which would make a changed train.optim.lr a setting silently ignored."""

import pytest

from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.target import load_target_head
from pipeline.training.config import OptimConfig
from pipeline.training.drafter_trainer import DrafterTrainer
from pipeline.training.optim import lr_factor


def _trainer(target_dir, target_config, optim: OptimConfig, total_steps: int):
    options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=95,
                            num_anchors=4)
    return DrafterTrainer(build_drafter_spec(target_config, options), options, optim, 0,
                          load_target_head(target_dir), "cpu", None, total_steps)


def test_a_resume_takes_lr_betas_and_weight_decay_from_its_config(random_target_dir,
                                                                   target_config):
    first = _trainer(random_target_dir, target_config, OptimConfig(lr=1e-3, warmup_ratio=0.2), 10)
    for _ in range(4):  # zero gradients: only the schedule matters here
        first.step()
    state = first.state_dict()

    same = _trainer(random_target_dir, target_config, OptimConfig(lr=1e-3, warmup_ratio=0.2), 10)
    same.load_state_dict(state)
    assert same.lr == first.lr  # unchanged settings: the saved LR exactly

    changed = _trainer(random_target_dir, target_config,
                       OptimConfig(lr=5e-4, warmup_ratio=0.2, weight_decay=0.1,
                                   betas=(0.8, 0.9)), 20)
    changed.load_state_dict(state)
    assert changed.steps_done == 4
    assert changed.lr == pytest.approx(5e-4 * lr_factor(4, 20, 0.2, 0.0))
    group = changed.optimizer.param_groups[0]
    assert group["betas"] == (0.8, 0.9) and group["weight_decay"] == 0.1
    changed.step()
    assert changed.lr == pytest.approx(5e-4 * lr_factor(5, 20, 0.2, 0.0))
