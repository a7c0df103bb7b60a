"""Every number that shapes the tiny assets, in one place (and copied into the manifest)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# Bump when the recipe or the code that follows it changes what gets built: the cache
# directory is named after it, so an old build is never mistaken for a new one.
ASSETS_VERSION = "tiny-v3"


@dataclass(frozen=True)
class TinyRecipe:
    seed: int = 0
    # 1024 rather than 2048: shorter tokens, so more of each word is predictable from its
    # start and the drafter's tau at the demo's 500 steps rose by about 0.15 (docs/BENCHMARKS.md,
    # "The demo drafts"); the smaller head also makes target and drafter steps cheaper.
    vocab_size: int = 1024
    # Help text the target is trained on, about 3.2 characters a token. Half a minute of CPU
    # is too little to learn 0.5 MB of text, but enough to nearly memorise this much: then the
    # target's greedy answers are varied text rather than one phrase repeated (measured:
    # ~5k tokens, 200 steps -> loss ~0.95, 78% distinct 4-grams per answer). 12k characters
    # memorised better but answered more briefly and drafted worse (tau 1.37 against 1.72).
    target_corpus_chars: int = 16000
    # The last part of that text: held-out prompts come from it, training prompts never do.
    heldout_fraction: float = 0.15

    # The target: a real Qwen3, small enough to train in about half a minute of one core. 8 layers
    # leave room for several tap layers; hidden 64 (not 128) buys the steps memorising needs.
    hidden_size: int = 64
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 192
    rope_theta: float = 10000.0
    max_position_embeddings: int = 1024

    # Target training on (user: a span of help text, assistant: the span that follows).
    train_steps: int = 200
    train_batch_size: int = 8
    lr: float = 1e-2
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    user_tokens: tuple[int, int] = (32, 64)  # inclusive range, drawn per batch
    assistant_tokens: tuple[int, int] = (64, 112)

    # Data files: prompts from the help text, answers generated greedily by the target.
    num_train: int = 400
    num_heldout: int = 32
    prompt_tokens: tuple[int, int] = (32, 64)
    max_new_tokens: int = 96
    # Extra prompts drawn per split, to make up for answers that end too early (about 15% of
    # them, varying with the machine's float results). Generous, since a second generation
    # round costs nearly as much as the first; the build still draws again if it falls short.
    prompt_slack: float = 0.35
    # A drafter with block size 16 needs 2*16 supervised tokens per sample.
    min_assistant_tokens: int = 32
    generate_batch_size: int = 512


def recipe_changes(manifest: dict) -> dict[str, tuple]:
    """The recipe fields a build's ``manifest`` records otherwise than this code's recipe:
    name -> (built, wanted), compared as the manifest stores them (tuples as JSON lists)."""
    built = manifest.get("recipe") or {}
    wanted = json.loads(json.dumps(asdict(TinyRecipe())))
    return {k: (built.get(k), wanted.get(k)) for k in sorted(built.keys() | wanted.keys())
            if built.get(k) != wanted.get(k)}
