import pytest
"""The GPU resume tests' weight rule (tests/gpu/resume_match.py) tells reduction-order noise
from a lost optimizer state, shown on CPU by bench.resume_noise: gradients given additive
noise pass it, a run that dropped AdamW's state after 3 of 6 steps does not."""

from bench import resume_noise


@pytest.mark.slow
def test_noise_passes_the_weight_rule_and_a_lost_optimizer_state_does_not(tiny_assets):
    noisy, lost = resume_noise.main(["--noise", "1e-6", "--lose-state-at", "3"])
    assert noisy["noise"] == 1e-6 and noisy["refused_tensors"] == 0
    assert lost["lost_state_at"] == 3
    assert lost["share"] > 0.5 and lost["refused_tensors"] > 0
