"""The drafter's random init on the device it trains on: seeded (every replica and the
reference start identical), every weight drawn there, and the target layers copied over it."""

import torch

from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.training.drafter_trainer import build_drafter


def _spec():
    target = qwen3_8b_config()
    target.update(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=1024)
    return build_drafter_spec(target, DrafterConfig(num_layers=2, mask_token_id=0))


def test_init_on_the_device_is_seeded_and_stays_there(device):
    spec = _spec()
    a = build_drafter(spec, seed=0, device=device).state_dict()
    b = build_drafter(spec, seed=0, device=device).state_dict()
    c = build_drafter(spec, seed=1, device=device).state_dict()
    assert a.keys() == b.keys() == c.keys()
    assert all(t.device.type == torch.device(device).type for t in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    drawn = [k for k in a if a[k].float().std() > 0]  # norms start at one: not drawn
    assert drawn and all(not torch.equal(a[k], c[k]) for k in drawn)
