"""bench/quality/reference_decode.py, the bench's second decoder: the export loaded by AutoModel
with its own drafter cache drafts exactly what the pipeline's evaluator drafts, round by
round, and both decode the target's greedy text."""

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from bench.quality.reference_decode import Decoded, acceptance, decode, tau
from pipeline.eval.speculative import DrafterProposer, acceptance_length, speculative_generate
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.serving_format import save_drafter
from pipeline.model.target import load_target_head


class Recorder:
    """The evaluator's proposer, keeping what it drafted each round."""

    def __init__(self, inner):
        self.inner, self.drafts = inner, []
        self.block_size = inner.block_size

    def propose(self, tokens, features):
        draft = self.inner.propose(tokens, features)
        self.drafts.append(draft.tolist())
        return draft


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_export_decoded_with_its_cache_drafts_as_the_evaluator(family_target, model_type,
                                                               tmp_path, greedy_tokens):
    path = family_target(model_type)
    spec = build_drafter_spec(AutoConfig.from_pretrained(path).to_dict(),
                              DrafterConfig(num_layers=2, block_size=4, num_taps=2),
                              tokenizer_mask_id=3)
    target = AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(0)
    drafter = DFlashDrafter(spec).eval()
    head = load_target_head(path)
    draft = AutoModel.from_pretrained(save_drafter(drafter, tmp_path / "export", "float32"),
                                      trust_remote_code=True, dtype=torch.float32).eval()
    prompts = [torch.randint(4, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (7, 12)]
    new = 14
    ours, theirs = [], []
    for prompt in prompts:
        recorder = Recorder(DrafterProposer(drafter, head))
        ours.append(speculative_generate(target, recorder, prompt, spec.target_layer_ids, new))
        theirs.append(decode(target, draft, prompt, new))
        assert theirs[-1].drafts == recorder.drafts  # every round, every drafted token
        assert theirs[-1].accepted == ours[-1].accepted
        assert theirs[-1].tokens[:new] == greedy_tokens(target, prompt, new)  # lossless
    assert tau(theirs) == acceptance_length(ours)


def test_acceptance_counts_rounds_and_the_share_reaching_each_position():
    decoded = [Decoded(accepted=[0, 3, 1]), Decoded(accepted=[3])]
    got = acceptance(decoded, block_size=4)
    assert got == {"tau": 2.75, "rounds": 4, "accepted_at_position": [0.75, 0.5, 0.5]}
    assert acceptance([Decoded()], block_size=4) == {
        "tau": None, "rounds": 0, "accepted_at_position": [None, None, None]}
