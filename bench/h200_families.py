"""Other target families at their published shapes on one H200: the co-located pipeline
(cluster=one_gpu, shape A: 4 x 800 tokens, 256 anchors), as a user runs it.

    python -m bench.h200_families --out docs/bench                       # llama, gpt_oss
    python -m bench.h200_families --families gpt_oss --out /tmp/b        # a subset; keys merge

Each target is a random-weight model of its family with every layer of the published config
(Llama-3.1-8B; gpt-oss-20b, a MoE that fits one H200 in bf16), built by transformers,
``save_pretrained`` with a tokenizer carrying the family's chat format and read back by the
pipeline's loading code. The drafter is the Qwen3-8B recipe's (5 layers, block 16) derived
from the target's config, its taps spread by the default rule, eager with SDPA as in
bench.h200_parallel (whose Qwen3-8B run is the figure to set these beside). Per family, into
``<out>/h200_families.json``: ``samples_per_s``, ``target_busy``, ``drafter_busy``,
``peak_mem_gb`` (the GPU's memory in use at its highest, both actors, sampled by nvidia-smi)
and the drafter's own peak, with the experts path transformers chose for MoE targets. A
target that fails to compile is run again eager, and the json says so. Each target is deleted
after its run (the disk holds one at a time).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from bench.card import GpuMemory
from bench.scale.result import failed_parts, open_result

# The published config.json of each checkpoint named, every layer kept.
SHAPES = {
    "llama": ("Llama-3.1-8B", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rms_norm_eps=1e-5,
        max_position_embeddings=131072, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})),
    "gpt_oss": ("gpt-oss-20b", dict(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_local_experts=32,
        num_experts_per_tok=4, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        vocab_size=201088, sliding_window=128, max_position_embeddings=131072,
        layer_types=["sliding_attention", "full_attention"] * 12)),
}


# The drafter as bench.h200_parallel runs it (eager, SDPA), so that its Qwen3-8B figure
# (replicate_samples_per_s) stands beside these.
DRAFTER = ("drafter.attention=sdpa",)


def build(model_type: str, out: Path) -> dict:
    """Random bf16 weights of ``model_type``'s published shape, built on the GPU, saved."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bench.scale.synthetic import word_tokenizer
    from pipeline.assets.templates import family_tokenizer

    tokenizer = family_tokenizer(word_tokenizer(), model_type)
    config = AutoConfig.for_model(model_type, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, **SHAPES[model_type][1])
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    info = {"params_b": sum(p.numel() for p in model.parameters()) / 1e9,
            "attention": model.config._attn_implementation,
            "experts": getattr(model.config, "_experts_implementation", None)}
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return {**info, "build_s": time.perf_counter() - t0}


def run_family(model_type: str, work: Path, out: Path, steps: int) -> dict:
    from bench.scale.pipeline import run_pipeline

    target = work / f"{model_type}-random"
    shutil.rmtree(target, ignore_errors=True)
    built = build(model_type, target)
    # The recipe's taps and mask id are Qwen3-8B's; this target's come from its own config
    # and tokenizer (and its layers are not Qwen3 layers to initialise the drafter from).
    extra = ("drafter.target_layer_ids=null", "drafter.mask_token_id=null",
             "drafter.init=random", *DRAFTER)
    try:
        for compiled in (True, False):
            with GpuMemory() as memory:
                run = run_pipeline(work, out, steps=steps, name=model_type, target=target,
                                   target_compile=compiled, drafter_compile="off", extra=extra)
            if "error" not in run:
                break
        peak = memory.peak_mib()
        return {**run, "shape": SHAPES[model_type][0], **built, "target_compiled": compiled,
                "peak_mem_gb": None if peak is None else peak / 1024}
    finally:
        shutil.rmtree(target, ignore_errors=True)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(SHAPES))
    p.add_argument("--out", default="runs/bench_families")
    p.add_argument("--work", default="/tmp/bench_families", help="target folders (large)")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    path, result = open_result(out, work, "h200_families.json")
    for model_type in args.families.split(","):
        if model_type not in SHAPES:
            raise SystemExit(f"--families: {model_type!r} is not one of {list(SHAPES)}")
        result[model_type] = run_family(model_type, work, out, args.steps)
        print(f"[bench] {model_type}: {json.dumps(result[model_type])}", flush=True)
        path.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    failed = failed_parts(main())
    if failed:
        raise SystemExit(f"bench.h200_families: {', '.join(failed)} failed; see their logs")
