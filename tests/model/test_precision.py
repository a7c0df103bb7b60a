"""The bf16 path stays bf16: no norm or cast turns activations back into fp32."""

import torch
from torch.nn import functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from pipeline.model.drafter import attend
from pipeline.model.norm import RMSNorm


def test_rmsnorm_matches_hf_in_fp32_and_keeps_bf16():
    torch.manual_seed(0)
    ours, hf = RMSNorm(32, eps=1e-6), Qwen3RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(32))
        hf.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(ours(x), hf(x))
    y = ours(x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert hf(x.bfloat16()).dtype == torch.float32  # the defect this norm replaces
    torch.testing.assert_close(y.float(), hf(x), rtol=2e-2, atol=2e-2)


def test_drafter_activations_stay_bf16_under_autocast(drafter_setup):
    drafter, _, head, _, _ = drafter_setup
    from pipeline.model.drafter import embed_tokens
    from pipeline.objective.masks import build_mask
    from tests.objective.test_objective import fixed_anchors

    seen = []

    def record(module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            seen.append((type(module).__name__, output.dtype))

    hooks = [m.register_forward_hook(record) for m in drafter.modules()
             if not isinstance(m, torch.nn.ModuleList)]
    anchors = fixed_anchors([5, 11], [3, 9])
    ids = torch.randint(0, 90, (2, 24))
    tokens = ids.gather(1, anchors.positions).repeat_interleave(4, dim=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = drafter(torch.randn(2, 24, 96), embed_tokens(head.embed, tokens, torch.bfloat16),
                      torch.arange(24).expand(2, 24),
                      (anchors.positions[:, :, None] + torch.arange(4)).flatten(1),
                      build_mask(anchors.positions, 24, 4, "sdpa"))
    for h in hooks:
        h.remove()
    assert out.dtype == torch.bfloat16
    fp32 = [name for name, dtype in seen if dtype != torch.bfloat16
            and name != "Qwen3RotaryEmbedding"]  # cos/sin tables, not activations
    assert not fp32, f"modules returning fp32 under bf16 autocast: {sorted(set(fp32))}"


def test_masked_gqa_attention_expands_heads_with_the_same_result():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 12, 16), torch.randn(2, 2, 20, 16), torch.randn(2, 2, 20, 16)
    mask = torch.rand(2, 1, 12, 20) > 0.3
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                         attn_mask=mask)
    torch.testing.assert_close(attend(q, k, v, mask, 16 ** -0.5), ref)
