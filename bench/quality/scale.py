"""Every number that sizes a run, per scale: ``gpu`` (one H200, two commands of ~9 minutes)
and ``tiny`` (CPU, one command).

The GPU figures are estimates for a 1x H200, not measurements: the target trains for a fixed
time (its step count is fitted to the measured step time), and every stage has a wall-clock
budget. A budget warns and is reported (``over_budget`` in the result file); it does not stop
a stage that is nearly done on a noisy machine. A stage's subprocess is stopped only at its
hard limit (``hard_limit_factor`` x its budget, never past ``run_limit_s`` of the whole run),
and what it logged so far is still read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    name: str
    device: str  # "cuda" or "cpu"
    seed: int = 0

    # Corpus and tokenizer.
    heldout_fraction: float = 0.05  # of files, by a stable hash of the path
    max_corpus_chars: int = 0  # 0: every Python source on the machine (corpus.py)
    vocab_size: int = 8192
    tokenizer_sample_chars: int = 6_000_000  # BPE trains on a seeded subsample of files

    # The target: a Qwen3ForCausalLM trained from scratch.
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 2048
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    seq_len: int = 1024  # tokens per training sequence, chat markup included
    user_tokens: tuple[int, int] = (16, 256)  # prefix given as the user turn, drawn per batch
    batch_size: int = 64
    lr: float = 1.5e-3
    warmup_steps: int = 60
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    compile_target: bool = True
    target_train_s: float = 125.0  # wall clock for the training loop, compile included
    # ... or fewer steps: the target sees its training tokens at most this many times, so
    # that it learns the language, not the files (held-out loss near training loss).
    target_max_epochs: float = 1.0
    heldout_eval_tokens: int = 262_144

    # Prompts and their regenerated answers.
    # 6144 prompts let the drafter memorise its data: its training loss fell at every epoch's
    # start (2.99 -> 2.35 -> 1.44 -> 0.82) while tau rose slowly (1.95 at step 300, 2.54 at 576).
    num_train_prompts: int = 24576
    num_heldout_prompts: int = 96  # tau prompts: from held-out files, seen by no trainer
    prompt_tokens: tuple[int, int] = (32, 192)
    max_new_tokens: int = 192
    regen_batch_size: int = 2048

    # The drafters (see overrides.py for how these reach the trainers).
    block_size: int = 16
    drafter_layers: int = 3
    num_taps: int = 5  # spread by the pipeline's default rule over the target's layers
    num_anchors: int = 192
    # Set here, not inherited from the demo's drafter preset (conf/drafter/tiny.yaml), which
    # the trainers start from: position 1 weighted above the rest, layers from the target.
    gamma: float = 1.0
    init: str = "target_layers"
    drafter_lr: float = 1.5e-3
    micro_batch_size: int = 32  # the sweep: 16 -> 32 learns more per step at a like cost per second
    epochs: int = 3
    max_steps: int = 2000
    data_max_length: int = 448  # prompt (<= ~200) + answer (<= 192) + chat markup
    # tau is decoded one prompt at a time (~30 ms a round, estimated): the untrained drafter's
    # eval costs prompts x new tokens rounds, a trained one's about a third of that.
    eval_every: int = 500
    eval_prompts: int = 16
    eval_max_new_tokens: int = 48
    cluster_device: str = "cuda"
    # Ray CPUs per actor (one_gpu's 4 on the 16-core GPU machine). The driver starts Ray with
    # targets+drafters x this + 1 CPUs, but the prefetcher takes this many too: on a 2-core
    # machine 4 leaves the placement group unschedulable.
    cpus_per_actor: float = 4.0
    # Tap layers and attention/compile choices are fixed in overrides.py (defaults, flex).
    attention: str = "flex"
    compile: str = "default"

    # Wall-clock budgets (seconds), reported against; the sum of each call's (calls()) must
    # fit the 10 minutes of one GPU command, with room to overrun.
    corpus_budget_s: float = 60.0  # in this process: sized by tokenizer_sample_chars
    target_extra_s: float = 40.0  # held-out loss and save_pretrained, after training
    regen_budget_s: float = 240.0  # 6240 lines took 96 s at batch 1024
    train_budget_s: float = 460.0  # each trainer; both run at the same time
    export_budget_s: float = 30.0  # the export's tau by the second decoder (25 s measured)
    concurrent_trainers: bool = True
    # Two GPU commands: corpus, target and data in the first (``--until data``), drafters and
    # export in the second (``--resume``), each within one command's 600 s. False: one call.
    two_calls: bool = True
    # A subprocess still running at this multiple of its budget is stopped (a safety net for
    # a hung run, not a time limit) ...
    hard_limit_factor: float = 3.0
    # ... and so is one still running this long after the run started (0: no such limit):
    # the result file must be written before the GPU command's 600 s are up.
    run_limit_s: float = 575.0

    def calls(self) -> list[tuple[str, ...]]:
        """The stages of each GPU command, whose budgets must fit ``run_limit_s`` together."""
        first, second = ("corpus", "target", "data"), ("drafters", "export")
        return [first, second] if self.two_calls else [first + second]

    def budgets(self) -> dict[str, float]:
        drafters = self.train_budget_s * (1 if self.concurrent_trainers else 2)
        return {"corpus": self.corpus_budget_s,
                "target": self.target_train_s + self.target_extra_s,
                "data": self.regen_budget_s, "drafters": drafters,
                "export": self.export_budget_s}


GPU = Scale(name="gpu", device="cuda")

# A whole chain on two shared CPU cores in a few minutes: shapes tiny, the wiring the same.
TINY = Scale(
    name="tiny", device="cpu", max_corpus_chars=1_500_000, vocab_size=1024,
    tokenizer_sample_chars=300_000, hidden_size=64, num_layers=6, num_heads=4, num_kv_heads=2,
    head_dim=16, intermediate_size=192, max_position_embeddings=512, seq_len=160,
    user_tokens=(8, 48), batch_size=8, lr=3e-3, warmup_steps=10, compile_target=False,
    target_train_s=25.0, heldout_eval_tokens=8192, num_train_prompts=96,
    num_heldout_prompts=8, prompt_tokens=(16, 40), max_new_tokens=48, regen_batch_size=64,
    block_size=8, drafter_layers=1, num_taps=3, num_anchors=16, drafter_lr=3e-3, micro_batch_size=4,
    epochs=1, max_steps=8, data_max_length=128, eval_every=4, eval_prompts=4,
    eval_max_new_tokens=24, cluster_device="cpu", cpus_per_actor=0.5,
    # FlexAttention has no backward on CPU, and inductor's C++ build takes minutes here.
    attention="sdpa", compile="off",
    corpus_budget_s=120.0,
    regen_budget_s=240.0, train_budget_s=600.0, export_budget_s=20.0, two_calls=False,
    run_limit_s=0.0)

SCALES = {s.name: s for s in (GPU, TINY)}


def get_scale(name: str) -> Scale:
    if name not in SCALES:
        raise ValueError(f"--scale={name!r}: allowed {sorted(SCALES)}")
    return SCALES[name]
