"""Every supported family through the real loading code: a tiny random-weight target built by
transformers (save_pretrained), the drafter derived from its config, taps, embedding, lossless
speculative decoding with the family's cache rollback, and the export read back by AutoModel."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from pipeline.assets.family_targets import FAMILY_TARGETS
from pipeline.eval.speculative import DrafterProposer, acceptance_length, speculative_generate
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter, embed_tokens
from pipeline.model.families import FAMILIES, UnsupportedTarget, drafter_fields
from pipeline.model.serving_format import save_drafter
from pipeline.model.target import load_target, load_target_head

OPTIONS = DrafterConfig(num_layers=1, block_size=4, num_taps=2)


def _setup(family_target, model_type):
    path = family_target(model_type)
    config = AutoConfig.from_pretrained(path).to_dict()
    spec = build_drafter_spec(config, OPTIONS, tokenizer_mask_id=3)
    target = AutoModelForCausalLM.from_pretrained(path).eval()
    return path, config, spec, target


def test_every_family_has_a_tiny_target():
    assert set(FAMILY_TARGETS) == set(FAMILIES)


@pytest.mark.parametrize("model_type", FAMILY_TARGETS)
def test_drafter_shares_what_it_must_with_the_target(family_target, model_type):
    path, config, spec, target = _setup(family_target, model_type)
    hf = spec.hf_config
    text = target.config
    assert hf["hidden_size"] == text.hidden_size and hf["vocab_size"] == text.vocab_size
    assert hf["rms_norm_eps"] == text.rms_norm_eps
    assert hf["model_type"] == "qwen3" and hf["tie_word_embeddings"] is False
    # Rope: the target's theta and scaling; Gemma's global rope (drafter layers attend fully).
    rope = hf["rope_parameters"]
    want = text.rope_parameters
    if model_type == "gemma3_text":
        want = want["full_attention"]
    assert rope["rope_type"] == want["rope_type"] and rope["rope_theta"] == want["rope_theta"]
    assert rope.get("factor") == want.get("factor")
    assert "partial_rotary_factor" not in rope  # Qwen3 layers rotate whole heads
    if model_type == "deepseek_v3":  # MLA: value-head wide heads filling the hidden size
        assert hf["head_dim"] == text.v_head_dim
        assert hf["num_attention_heads"] * hf["head_dim"] == text.hidden_size
    else:
        assert hf["head_dim"] == text.head_dim
    # The drafter builds, and its rope is the one the config says (HF's own init for it).
    drafter = DFlashDrafter(spec)
    cos, _ = drafter.rotary_emb(torch.zeros(1), torch.arange(300)[None])
    assert cos.shape == (1, 300, hf["head_dim"])


@pytest.mark.parametrize("model_type", FAMILY_TARGETS)
def test_taps_and_embedding_are_the_targets(family_target, model_type):
    path, _, spec, target = _setup(family_target, model_type)
    torch.manual_seed(0)
    ids = torch.randint(4, 500, (2, 24))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        taps = load_target(path, spec.target_layer_ids, "cpu", torch.float32)(ids)
        embedded = target.get_input_embeddings()(ids)
    want = torch.cat([hidden[i + 1] for i in spec.target_layer_ids], dim=-1)
    torch.testing.assert_close(taps, want, rtol=1e-5, atol=1e-5)
    head = load_target_head(path)
    torch.testing.assert_close(embed_tokens(head.embed, ids, scale=head.embed_scale), embedded)
    torch.testing.assert_close(head.lm_head, target.get_output_embeddings().weight)
    # Gemma scales its embedding: a drafter fed unscaled rows would train on other inputs.
    assert (head.embed_scale != 1.0) == (model_type == "gemma3_text")
    # In bf16 too, bit for bit: the scale rounds to the weight's dtype as the target's does.
    module = target.get_input_embeddings().to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(embed_tokens(module.weight, ids, scale=head.embed_scale), module(ids))


class ExportedProposer:
    """Drafts with the exported drafter as AutoModel loads it (z-lab's calling convention)."""

    def __init__(self, model, head) -> None:
        self.model, self.head = model, head
        self.block_size = model.block_size

    @torch.no_grad()
    def propose(self, tokens, features):
        a = tokens.numel() - 1
        block = torch.full((1, self.block_size), self.model.mask_token_id)
        block[0, 0] = tokens[-1]
        positions = torch.arange(a + self.block_size)[None]
        hidden = self.model(position_ids=positions, target_hidden=features[:, :a],
                            noise_embedding=embed_tokens(self.head.embed, block,
                                                         scale=self.head.embed_scale))
        return (hidden[0, 1:] @ self.head.lm_head.T).argmax(-1)


class OracleProposer:
    """Drafts the target's own greedy tokens (read off its greedy decoding of the prompt):
    every draft is accepted, tau is B."""

    def __init__(self, greedy_text, block_size):
        self.text, self.block_size = greedy_text, block_size

    def propose(self, tokens, features):
        assert tokens.tolist() == self.text[:tokens.numel()]
        return torch.tensor(self.text[tokens.numel():tokens.numel() + self.block_size - 1])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILY_TARGETS)
def test_speculative_output_is_greedy_and_the_export_drafts_the_same(family_target, model_type,
                                                                     tmp_path, greedy_tokens):
    path, _, spec, target = _setup(family_target, model_type)
    head = load_target_head(path)
    torch.manual_seed(1)
    drafter = DFlashDrafter(spec).eval()
    # Prompts longer than the sliding windows (8), so rolled-back caches cross them.
    prompts = [torch.randint(4, 500, (n,)).tolist() for n in (9, 14)]
    new = 12
    greedy = [greedy_tokens(target, p, new + 4) for p in prompts]
    oracle = [speculative_generate(target, OracleProposer(p + g, 4), p, spec.target_layer_ids,
                                   new) for p, g in zip(prompts, greedy)]
    assert acceptance_length(oracle) == 4.0  # accepted drafts survive the rollback
    ours = [speculative_generate(target, DrafterProposer(drafter, head), p,
                                 spec.target_layer_ids, new) for p in prompts]
    for g, r, o in zip(greedy, ours, oracle):
        assert r.tokens[:new] == g[:new] and o.tokens[:new] == g[:new]  # lossless

    out = save_drafter(drafter, tmp_path / "export", "float32")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    loaded, info = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32,
                                             output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    theirs = [speculative_generate(target, ExportedProposer(loaded.eval(), head), p,
                                   spec.target_layer_ids, new) for p in prompts]
    assert [r.accepted for r in theirs] == [r.accepted for r in ours]
    assert acceptance_length(theirs) == acceptance_length(ours)


def test_recompute_rollback_equals_crop(family_target):
    """The cache-free fallback decodes what cropping does, where both are possible."""
    path, _, spec, target = _setup(family_target, "llama")
    torch.manual_seed(2)
    proposer = DrafterProposer(DFlashDrafter(spec).eval(), load_target_head(path))
    prompt = torch.randint(4, 500, (15,)).tolist()
    crop, recompute = (speculative_generate(target, proposer, prompt, spec.target_layer_ids, 10,
                                            rollback=kind) for kind in ("crop", "recompute"))
    assert crop.tokens == recompute.tokens and crop.accepted == recompute.accepted


@pytest.mark.parametrize("config,match", [
    ({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]},
     r"the target is Phi3ForCausalLM \(model_type='phi3'\).*supported: qwen3 \(Qwen3\), "
     r"qwen3_moe.*deepseek_v3 \(DeepSeek-V3\)"),
    ({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
     r"multimodal wrapper: use a text-only checkpoint of model_type 'gemma3_text'"),
    ({"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4,
      "final_logit_softcapping": 30.0, "vocab_size": 10}, r"caps its logits"),
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10,
      "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     r"rope_type='longrope' has no Qwen3 drafter equivalent"),
])
def test_what_cannot_be_served_is_refused_by_name(config, match):
    with pytest.raises(UnsupportedTarget, match=match):
        drafter_fields(config)


def test_builtin_family_targets_resolve_and_build_once(tmp_path, monkeypatch):
    from pipeline.assets.resolve import resolve_target_path

    monkeypatch.setenv("DFLASH_ASSETS_DIR", str(tmp_path / "tiny"))
    folder = resolve_target_path("builtin:tiny-mistral")
    assert folder == str(tmp_path / "tiny-families-v1" / "mistral")
    assert AutoConfig.from_pretrained(folder).model_type == "mistral"
    assert resolve_target_path("builtin:tiny-mistral") == folder  # cached
    with pytest.raises(ValueError, match=r"names no built-in target; allowed: \['builtin:tiny'\]"
                                         r" and \['builtin:tiny-qwen3'"):
        resolve_target_path("builtin:tiny-phi3")
