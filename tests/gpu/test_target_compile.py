"""target.compile=true: the compiled decoder gives the uncompiled tap features, at every length."""

import torch
from torch._dynamo.utils import counters

from pipeline.model.target import load_target

TAPS = (1, 3, 5)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_compiled_target_gives_the_same_tap_features(random_target_dir, device, fresh_dynamo):
    plain = load_target(random_target_dir, TAPS, device, torch.bfloat16)
    compiled = load_target(random_target_dir, TAPS, device, torch.bfloat16, compile=True)
    assert isinstance(compiled._decoder, torch._dynamo.eval_frame.OptimizedModule)
    graphs_before = counters["stats"]["unique_graphs"]
    g = torch.Generator().manual_seed(0)
    # Three lengths: the first compiles static, the second dynamic, the third reuses it.
    for length in (37, 64, 113):
        ids = torch.randint(0, 90, (2, length), generator=g).to(device)
        ours, ref = compiled(ids), plain(ids)
        assert ours.shape == ref.shape == (2, length, 32 * len(TAPS))
        assert ours.dtype == torch.bfloat16
        # Random-init features are small (~0.05): errors are measured against their norm.
        assert rel(ours, ref) < 2e-2, (length, rel(ours, ref))
        # Sharp enough to tell taps apart: the deepest tap is far from a copy of the first.
        assert rel(ref[..., :32], ref[..., -32:]) > 0.3
    compiles = counters["stats"]["unique_graphs"] - graphs_before
    assert 1 <= compiles <= 3, compiles
