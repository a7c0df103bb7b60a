"""tau evaluation speed: today's per-prompt evaluator against the batched one, same prompts,
same drafter; JSON out.

    python -m bench.decode_eval --target qwen3_8b_random --prompts 64 --max-new-tokens 256 \
        --device cuda --baseline-prompts 8 --out /tmp/decode_eval_8b.json
    python -m bench.decode_eval --target /path/to/hf_target --drafter /path/to/export \
        --prompts 64 --max-new-tokens 256 --device cuda --out /tmp/decode_eval.json
    python -m bench.decode_eval --target builtin:tiny-qwen3 --prompts 4 --max-new-tokens 8 \
        --device cpu --graphs off --out /tmp/decode_eval_cpu.json      # seconds, on CPU

``--target``: an HF folder, ``builtin:tiny-<model_type>`` (the suite's tiny targets), or
``qwen3_8b_random`` (Qwen3-8B's config with random bf16 weights built on the device, and a
random drafter of the 8B preset's shape: 5 layers, block 16, taps 1, 9, 17, 25, 33).
``--drafter``: an export folder (pipeline/export.py) or ``random``. Prompts are random token
ids (lengths between half of ``--prompt-len`` and all of it), or ``--data`` (a conversations
file: each conversation up to its first assistant turn, with the target's tokenizer).

The batched path decodes all prompts, ``--batch-size`` at a time (after an untimed warm-up on
two prompts), then the baseline decodes the first ``--baseline-prompts`` prompts (default:
all) one at a time; the JSON is written after each, so a baseline cut short keeps the batched
figure. Reported: ``eval_seconds``
and seconds per prompt for both, tau for both (the batched one also on the baseline's
prompts), the share of the baseline's prompts whose outputs agree and the tau difference on
them (bf16 on a GPU: ties may break apart; fp32 on CPU: equal).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from pathlib import Path
from typing import Optional

import torch

from bench.decode_common import RANDOM_8B, humaneval_prompts, random_qwen3, timed
from pipeline.eval.batched import RowDrafter, decode_many
from pipeline.eval.speculative import DrafterProposer, acceptance_length
from pipeline.model.config import DrafterConfig, DrafterSpec, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.target import TargetHead

log = logging.getLogger("bench.decode_eval")
_8B_DRAFTER = DrafterConfig(num_layers=5, block_size=16, target_layer_ids=[1, 9, 17, 25, 33],
                            mask_token_id=151669)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _target(name: str, device: str, dtype: torch.dtype):
    """(target model, its config dict, its head, its folder or None)."""
    from transformers import AutoConfig

    if name == RANDOM_8B:
        model = random_qwen3(device, dtype)
        head = TargetHead.of_model(model)
        return model, model.config.to_dict(), head, None
    if name.startswith("builtin:tiny-"):
        from pipeline.assets.family_targets import ensure_family_target

        name = ensure_family_target(name[len("builtin:tiny-"):])
    from pipeline.eval.tau import load_full_target
    from pipeline.model.target import load_target_head

    model = load_full_target(name, device, dtype)
    return model, AutoConfig.from_pretrained(name).to_dict(), load_target_head(name), name


def _drafter(source: str, target_name: str, config: dict, layers: int, block_size: int,
             device: str) -> DFlashDrafter:
    """An exported drafter read back, or a random one built on the device (fp32, as the
    evaluator runs it)."""
    if source != "random":
        from safetensors.torch import load_file

        folder = Path(source)
        hf = json.loads((folder / "config.json").read_text())
        drafter = DFlashDrafter(DrafterSpec.from_hf_config(hf))
        drafter.load_state_dict(load_file(str(folder / "model.safetensors")))
        return drafter
    options = _8B_DRAFTER if target_name == RANDOM_8B else DrafterConfig(
        num_layers=layers, block_size=block_size)
    spec = build_drafter_spec(config, options, tokenizer_mask_id=int(config["vocab_size"]) - 1)
    torch.manual_seed(1)
    with torch.device(device):
        return DFlashDrafter(spec)


def _prompts(args, config: dict, folder: Optional[str]) -> list[list[int]]:
    if args.humaneval:
        from transformers import AutoTokenizer

        if folder is None:
            raise SystemExit(f"--humaneval needs a target folder with a tokenizer, not {args.target}")
        return humaneval_prompts(AutoTokenizer.from_pretrained(folder), args.humaneval,
                                 args.prompts)
    if args.data:
        from transformers import AutoTokenizer

        from pipeline.eval.tau import heldout_prompts

        if folder is None:
            raise SystemExit(f"--data needs a target folder with a tokenizer, not {args.target}")
        return heldout_prompts(args.data, AutoTokenizer.from_pretrained(folder), args.prompts)
    rng = random.Random(args.seed)
    vocab = int(config["vocab_size"])
    return [[rng.randrange(4, vocab - 1) for _ in range(rng.randint(max(1, args.prompt_len // 2),
                                                                    args.prompt_len))]
            for _ in range(args.prompts)]


def run(args) -> dict:
    dtype = DTYPES[args.dtype or ("bfloat16" if args.device == "cuda" else "float32")]
    target, config, head, folder = _target(args.target, args.device, dtype)
    drafter = _drafter(args.drafter, args.target, config, args.drafter_layers, args.block_size,
                       args.device)
    drafter = drafter.to(args.device).eval()
    # As the evaluator: the target's own head, scored in slices cast to the drafter's dtype.
    proposer = RowDrafter(DrafterProposer(drafter, head.to(args.device)))
    prompts = _prompts(args, config, folder)
    k = min(args.baseline_prompts or len(prompts), len(prompts))
    taps, eos = drafter.spec.target_layer_ids, None
    graphs = {"on": True, "off": False, "auto": args.device == "cuda"}[args.graphs]
    result = {"target": args.target, "drafter": args.drafter, "device": args.device,
              "dtype": str(dtype).replace("torch.", ""), "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
              "graphs": graphs, "block_size": drafter.spec.block_size}
    with torch.no_grad():
        # Untimed: the first kernels (library handles, algorithm choices) and allocations.
        decode_many(target, proposer, prompts[:2], taps, 4, eos, 2, graphs=graphs)
        fast, fast_s = timed(lambda: decode_many(target, proposer, prompts, taps,
                                                 args.max_new_tokens, eos, args.batch_size,
                                                 graphs=graphs), args.device)
        result["batched"] = {"prompts": len(prompts), "eval_seconds": round(fast_s, 3),
                             "seconds_per_prompt": round(fast_s / len(prompts), 4),
                             "tau": acceptance_length(fast)}
        _write(args.out, result)  # the batched figure survives a baseline cut short
        base, base_s = timed(lambda: decode_many(target, proposer, prompts[:k], taps,
                                                 args.max_new_tokens, eos, batch_size=1),
                             args.device)
    agree = sum(a.tokens == b.tokens for a, b in zip(base, fast[:k]))
    tau_base, tau_fast_k = acceptance_length(base), acceptance_length(fast[:k])
    result["batched"]["tau_on_baseline_prompts"] = tau_fast_k
    result.update({
        "baseline": {"prompts": k, "eval_seconds": round(base_s, 3),
                     "seconds_per_prompt": round(base_s / k, 4), "tau": tau_base},
        "speedup_per_prompt": round((base_s / k) / (fast_s / len(prompts)), 2),
        "outputs_agree_share": agree / k,
        "tau_difference": tau_fast_k - tau_base,
    })
    return result


def _write(out: Optional[str], result: dict) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True,
                   help=f"HF folder, builtin:tiny-<model_type>, or {RANDOM_8B}")
    p.add_argument("--drafter", default="random", help="export folder, or random")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--data", default=None, help="conversations file for real prompts")
    p.add_argument("--humaneval", default=None,
                   help="HumanEval.jsonl.gz: its prompts as a user turn (folder targets)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--graphs", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--baseline-prompts", type=int, default=0,
                   help="time the per-prompt baseline on this many prompts (0: all)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--drafter-layers", type=int, default=1, help="random drafter only")
    p.add_argument("--block-size", type=int, default=16, help="random drafter only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.graphs == "on" and args.device != "cuda":
        p.error(f"--graphs on needs --device cuda, not {args.device}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = run(args)
    _write(args.out, result)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
