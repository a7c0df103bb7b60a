"""The drafter alone at the real shape: DrafterTrainer on synthetic features, timed."""

from __future__ import annotations

import time

import torch

from bench.scale.flops import drafter_flops
from bench.scale.synthetic import token_batch
from pipeline.training.config import OptimConfig
from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.model.target import TargetHead
from pipeline.objective.blocks import build_blocks
from pipeline.training.drafter_trainer import DrafterTrainer

H100_H200_DENSE_BF16 = 989e12  # datasheet dense bf16 FLOP/s (H100/H200 SXM)


def make_trainer(num_anchors: int, attention: str, compile_mode: str, num_layers: int = 5,
                 target_config: dict | None = None) -> DrafterTrainer:
    options = DrafterConfig(num_layers=num_layers, block_size=16, mask_token_id=151669,
                            num_anchors=num_anchors, attention=attention, compile=compile_mode,
                            static_shapes=True)
    spec = build_drafter_spec(target_config or qwen3_8b_config(), options)
    vocab, hidden = spec.hf_config["vocab_size"], spec.hidden_size
    g = torch.Generator(device="cuda").manual_seed(0)
    head = TargetHead(
        embed=torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16, generator=g),
        lm_head=torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
        * hidden ** -0.5)
    return DrafterTrainer(spec, options, OptimConfig(), 0, head, "cuda", torch.bfloat16,
                          total_steps=10_000)


def run_drafter(n: int, seq_len: int, num_anchors: int, attention: str = "flex",
                compile_mode: str = "default", warmup: int = 3, steps: int = 8) -> dict:
    """Samples/s, model TFLOP/s, MFU and peak memory; recompiles after warm-up are errors."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    trainer = make_trainer(num_anchors, attention, compile_mode)
    spec, obj = trainer.spec, trainer.objective
    ids, mask = token_batch(n, seq_len, spec.hf_config["vocab_size"], "cuda")
    feats = torch.randn(n, seq_len, spec.feature_size, device="cuda", dtype=torch.bfloat16)

    def one_step(i: int) -> float:
        sample_ids = list(range(i * n, (i + 1) * n))  # new anchors every step
        trainer.forward_backward(feats, ids, mask, sample_ids, epoch=0)
        trainer.step()
        anchors = obj.anchors(mask.cpu(), sample_ids, trainer.seed, 0)
        blocks = build_blocks(ids.cpu(), mask.cpu(), anchors, obj.block_size,
                              obj.mask_token_id, obj.gamma)
        return drafter_flops(spec.hf_config, len(spec.target_layer_ids), obj.block_size,
                             n * seq_len, anchors.positions, anchors.keep,
                             int(blocks.supervised.sum()))

    t_compile = time.perf_counter()
    for i in range(warmup):
        one_step(i)
    torch.cuda.synchronize()
    t_compile = time.perf_counter() - t_compile
    torch._dynamo.config.error_on_recompile = compile_mode != "off"
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        flops = sum(one_step(warmup + i) for i in range(steps))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    finally:
        torch._dynamo.config.error_on_recompile = False
    peak = torch.cuda.max_memory_allocated() / 1e9
    del trainer
    torch.cuda.empty_cache()
    return {"n": n, "seq_len": seq_len, "num_anchors": num_anchors, "attention": attention,
            "compile": compile_mode, "samples_per_s": n * steps / dt,
            "step_s": dt / steps, "tflops": flops / dt / 1e12,
            "mfu": flops / dt / H100_H200_DENSE_BF16, "peak_mem_gb": peak,
            "warmup_s": t_compile}


@torch.no_grad()
def bf16_vs_fp32_logits(num_anchors: int = 64, seq_len: int = 800) -> dict:
    """The same drafter weights, bf16 autocast against fp32: how close are the logits?"""
    from pipeline.model.drafter import embed_tokens
    from pipeline.objective.masks import build_mask

    trainer = make_trainer(num_anchors, "flex", "off")
    spec, obj, head = trainer.spec, trainer.objective, trainer.head
    ids, mask = token_batch(1, seq_len, spec.hf_config["vocab_size"], "cuda", seed=7)
    feats = torch.randn(1, seq_len, spec.feature_size, device="cuda", dtype=torch.bfloat16)
    anchors = obj.anchors(mask.cpu(), [0], 0, 0).to("cuda")
    blocks = build_blocks(ids, mask, anchors, obj.block_size, obj.mask_token_id, obj.gamma)
    attn = build_mask(anchors.positions, seq_len, obj.block_size, "flex")
    pos = torch.arange(seq_len, device="cuda")[None]
    rows = blocks.supervised[0]

    def logits(dtype):
        emb = embed_tokens(head.embed, blocks.token_ids, dtype)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            hidden = trainer.model(feats.to(dtype), emb, pos, blocks.positions, attn)
        return (hidden[0, rows].float() @ head.lm_head.float().t())

    lo, hi = logits(torch.bfloat16), logits(torch.float32)
    rel = ((lo - hi).norm(dim=-1) / hi.norm(dim=-1)).max().item()
    top1 = (lo.argmax(-1) == hi.argmax(-1)).float().mean().item()
    del trainer
    torch.cuda.empty_cache()
    return {"rows": int(rows.sum()), "max_row_rel_err": rel, "top1_agreement": top1}
