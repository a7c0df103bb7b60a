"""Gradient accumulation under CUDA graphs: compile=reduce-overhead against eager, same steps.

    python -m bench.scale.accum_check

Two micro-batches per step, three steps, a 2-layer drafter at Qwen3-8B width. Prints the
per-micro-batch losses of both and fails when they disagree beyond bf16 noise. This is the
case that failed inside the pipeline's drafter actor (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import torch

from bench.scale.drafter import make_trainer
from bench.scale.synthetic import token_batch


def losses(compile_mode: str, n: int = 2, seq_len: int = 512, steps: int = 3) -> list[float]:
    torch.manual_seed(0)
    trainer = make_trainer(64, "flex", compile_mode, num_layers=2)
    ids, mask = token_batch(n, seq_len, trainer.spec.hf_config["vocab_size"], "cuda")
    feats = torch.randn(n, seq_len, trainer.spec.feature_size, device="cuda",
                        dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(1))
    out = []
    for step in range(steps):
        for micro in range(2):
            sample_ids = list(range((2 * step + micro) * n, (2 * step + micro + 1) * n))
            parts = trainer.forward_backward(feats, ids, mask, sample_ids, epoch=0)
            out.append(float(parts.numerator) / float(parts.denominator))
        trainer.step()
    return out


def main() -> None:
    eager, graphs = losses("off"), losses("reduce-overhead")
    print("eager          ", [round(x, 4) for x in eager])
    print("reduce-overhead", [round(x, 4) for x in graphs])
    worst = max(abs(a - b) / abs(a) for a, b in zip(eager, graphs))
    print(f"largest relative difference {worst:.2e}")
    assert worst < 2e-2, "reduce-overhead with accumulation drifts from eager"


if __name__ == "__main__":
    main()
