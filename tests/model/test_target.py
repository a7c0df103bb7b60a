import torch
from transformers import AutoModelForCausalLM

from pipeline.model.target import load_target, load_target_head


def test_tap_features_equal_full_forward_hidden_states(random_target_dir):
    taps = [0, 2, 3]
    feats = load_target(random_target_dir, taps, "cpu", torch.float32)
    full = AutoModelForCausalLM.from_pretrained(random_target_dir)
    ids = torch.randint(0, 90, (2, 17))
    attn = torch.ones_like(ids)
    attn[1, 12:] = 0  # right padding: real positions must still match
    with torch.no_grad():
        ref = full(ids, attention_mask=attn, output_hidden_states=True).hidden_states
    expected = torch.cat([ref[i + 1] for i in taps], dim=-1)
    got = feats(ids)  # no mask: right padding cannot change real positions
    assert got.shape == (2, 17, 3 * 32)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :12], expected[1, :12])


def test_feature_path_stops_at_deepest_tap(random_target_dir):
    feats = load_target(random_target_dir, [1, 2], "cpu", torch.float32)
    decoder = feats.model.get_decoder()
    assert len(decoder.layers) == 3
    # Nothing after the deepest tap computes: the final norm and the head are identities.
    assert isinstance(decoder.norm, torch.nn.Identity)
    assert isinstance(feats.model.lm_head, torch.nn.Identity)
    ids = torch.randint(0, 90, (1, 5))
    layer_out = []
    decoder.layers[2].register_forward_hook(lambda _m, _i, out: layer_out.append(out))
    got = feats(ids)
    torch.testing.assert_close(got[..., 32:], layer_out[0])


def test_head_loaded_without_the_model(random_target_dir):
    head = load_target_head(random_target_dir)
    full = AutoModelForCausalLM.from_pretrained(random_target_dir)
    torch.testing.assert_close(head.embed, full.get_input_embeddings().weight.detach())
    torch.testing.assert_close(head.lm_head, full.lm_head.weight.detach())
