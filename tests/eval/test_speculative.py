import torch
from transformers import AutoModelForCausalLM

from pipeline.eval.speculative import DrafterProposer, acceptance_length, speculative_generate


class OracleProposer:
    """Proposes the target's own greedy continuation: tau must equal B."""

    def __init__(self, target, block_size: int) -> None:
        self.target = target
        self.block_size = block_size

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        seq = tokens[None]
        for _ in range(self.block_size - 1):
            nxt = self.target(seq, use_cache=False).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        return seq[0, tokens.numel():]


def _greedy(model, prompt, n):
    ids = torch.tensor(prompt)[None]
    out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_oracle_drafter_gives_tau_equal_block_size(random_target_dir):
    target = AutoModelForCausalLM.from_pretrained(random_target_dir).eval()
    prompts = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 3]]
    results = [speculative_generate(target, OracleProposer(target, 4), p, [1, 2, 3], 12)
               for p in prompts]
    assert acceptance_length(results) == 4.0
    # Speculative decoding is lossless: the output is the target's own greedy continuation.
    for p, r in zip(prompts, results):
        assert r.tokens[:12] == _greedy(target, p, 12)


def test_untrained_drafter_gives_tau_near_one(drafter_setup, random_target_dir):
    drafter, _, head, spec, _ = drafter_setup
    target = AutoModelForCausalLM.from_pretrained(random_target_dir).eval()
    proposer = DrafterProposer(drafter.eval(), head)
    prompts = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 3], [1, 2, 3, 4]]
    results = [speculative_generate(target, proposer, p, spec.target_layer_ids, 16)
               for p in prompts]
    assert 1.0 <= acceptance_length(results) < 1.3
    for p, r in zip(prompts, results):
        assert r.tokens[:16] == _greedy(target, p, 16)
