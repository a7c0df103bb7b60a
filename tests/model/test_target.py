import torch
from transformers import AutoModelForCausalLM

import pipeline.model.target as target_module
from pipeline.model.target import TargetHead, load_target, load_target_head


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


def test_head_of_a_loaded_model_shares_its_weights(random_target_dir):
    full = AutoModelForCausalLM.from_pretrained(random_target_dir)
    head = TargetHead.of_model(full, embed_scale=2.0)
    assert head.embed.data_ptr() == full.get_input_embeddings().weight.data_ptr()
    assert head.lm_head.data_ptr() == full.lm_head.weight.data_ptr()
    assert head.embed_scale == 2.0
    assert head.to("cpu").lm_head.data_ptr() == head.lm_head.data_ptr()  # no copy on its device


def test_head_argmax_casts_the_head_slice_by_slice_and_ties_keep_the_lowest_id(monkeypatch):
    # Small integers: every score is exact in bf16 weights and fp32 sums, on any machine.
    g = torch.Generator().manual_seed(0)
    vocab, width = 50, 8
    lm_head = torch.randint(-3, 4, (vocab, width), generator=g).to(torch.bfloat16)
    hidden = torch.randint(-3, 4, (2, 3, width), generator=g).float()
    lm_head[41] = 40  # the best score of row (0, 0), tied by 47 (a later slice) ...
    lm_head[47] = 40
    hidden[0, 0] = 1
    lm_head[12] = lm_head[44]  # ... and everywhere 12 ties with 44
    expected = (hidden @ lm_head.float().t()).argmax(-1)
    head = TargetHead(embed=lm_head, lm_head=lm_head)
    for rows in (50, 13, 7, 1):  # one slice, slices of 13 (the last shorter), ...
        monkeypatch.setattr(target_module, "_CAST_BYTES", rows * width * 4)
        got = head.argmax(hidden)
        assert torch.equal(got, expected), rows
    assert int(got[0, 0]) == 41
    # In the head's own dtype nothing is cast: the plain product.
    same = TargetHead(embed=lm_head, lm_head=lm_head.float())
    assert torch.equal(same.argmax(hidden), expected)


def test_final_hidden_follows_the_taps_and_gives_the_models_logits(random_target_dir):
    """drafter.distill_weight > 0: the whole target runs and its final normed hidden state
    comes after the taps; through the LM head it gives HF's own logits."""
    taps = [0, 2, 3]
    feats = load_target(random_target_dir, taps, "cpu", torch.float32, final_hidden=True)
    cut = load_target(random_target_dir, taps, "cpu", torch.float32)
    full = AutoModelForCausalLM.from_pretrained(random_target_dir)
    assert isinstance(feats.model.lm_head, torch.nn.Identity)  # logits are the drafter's job
    ids = torch.randint(0, 90, (2, 17))
    with torch.no_grad():
        out = full(ids, output_hidden_states=True)
    got = feats(ids)
    assert got.shape == (2, 17, 4 * 32)
    torch.testing.assert_close(got[..., :96], cut(ids))
    torch.testing.assert_close(got[..., 96:], out.hidden_states[-1])
    head = load_target_head(random_target_dir)
    torch.testing.assert_close(got[..., 96:] @ head.lm_head.t(), out.logits,
                               rtol=1e-5, atol=1e-5)
