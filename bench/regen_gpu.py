"""Regeneration on the GPU: `python -m pipeline.regenerate` against plain HF generate.

    python -m bench.regen_gpu --target /tmp/bench_8b/qwen3-8b-random --out /tmp/regen

Both decode the same prompts greedily, batched at the same size, on one GPU; the figure is
generated tokens per second of wall time (the regenerate figure includes Ray and actor
start-up, the model load and writing the output). The target is random-weight Qwen3 with
Qwen3-1.7B's layer shapes (1.4B parameters without the embedding) over a small word
vocabulary, so every sampled id decodes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.scale.synthetic import build_target
from pipeline.model.config import qwen3_8b_config

# Qwen3-1.7B's layer shapes over the benchmark's word vocabulary (2,228 tokens).
TARGET_1B = dict(qwen3_8b_config(), hidden_size=2048, intermediate_size=6144,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 vocab_size=2304, bos_token_id=None, eos_token_id=2, tie_word_embeddings=True)


def write_prompts(path: Path, count: int) -> Path:
    from bench.scale.synthetic import _words

    words = _words()
    with path.open("w") as f:
        for i in range(count):
            user = " ".join(words[(i * 7 + j) % len(words)] for j in range(40 + i % 24))
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": "x"}]}) + "\n")
    return path


def answer_tokens(path: Path, tokenizer) -> int:
    total = 0
    for line in path.open():
        msgs = json.loads(line)["messages"]
        total += sum(len(tokenizer(m["content"], add_special_tokens=False)["input_ids"])
                     for m in msgs if m["role"] == "assistant")
    return total


@torch.no_grad()
def plain_generate(target: str, prompts: Path, batch: int, new_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).cuda().eval()
    texts = [tok.apply_chat_template(json.loads(line)["messages"][:1], tokenize=False,
                                     add_generation_prompt=True) for line in prompts.open()]
    generated = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], return_tensors="pt", padding=True,
                  add_special_tokens=False).to("cuda")
        out = model.generate(**enc, do_sample=False, max_new_tokens=new_tokens,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            generated += row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"tokens": generated, "seconds": dt, "tokens_per_s": generated / dt}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="/tmp/regen_target")
    p.add_argument("--out", default="runs/regen_gpu")
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_target(Path(args.target), TARGET_1B)
    prompts = write_prompts(out / "prompts.jsonl", args.prompts)
    regen_out = out / "regenerated.jsonl"
    regen_out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pipeline.regenerate", "--input", str(prompts), "--output",
           str(regen_out), "--target", args.target, "--device", "cuda", "--num-workers", "1",
           "--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens)]
    t0 = time.perf_counter()
    with open(out / "regenerate.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    tokens = answer_tokens(regen_out, AutoTokenizer.from_pretrained(args.target))
    result = {"batch_size": args.batch_size, "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens,
              "regenerate": {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall},
              "hf_generate": plain_generate(args.target, prompts, args.batch_size,
                                            args.max_new_tokens)}
    print(json.dumps(result, indent=2))
    (out / "regen_gpu.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
