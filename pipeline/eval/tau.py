"""tau on held-out prompts: the acceptance length the trained drafter reaches with its target."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
from torch import nn

from pipeline.data import DataError, DataStats, read_conversations
from pipeline.data.config import DEFAULT_MAX_LINE_BYTES
from pipeline.data.template import prompt_ids
from pipeline.eval.batched import RowDrafter, decode_many
from pipeline.eval.config import DecodeOptions, EvalConfig
from pipeline.eval.share import Pacer, evaluator_stream
from pipeline.eval.speculative import DrafterProposer, acceptance_length
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.target import TargetHead

log = logging.getLogger(__name__)


def heldout_prompts(path: str, tokenizer, limit: int, fmt: str = "auto",
                    enable_thinking: bool = True, on_bad_line: str = "error",
                    stats: Optional[DataStats] = None,
                    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> list[list[int]]:
    """Each conversation up to (not including) its first assistant turn, as prompt token ids.

    ``enable_thinking`` must be ``data.enable_thinking``: the prompts the drafter trained on.
    The file is read only until ``limit`` prompts are found; bad lines among those read stop
    the read (``on_bad_line="error"``) or are skipped, counted in ``stats`` and reported once.
    """
    stats = stats if stats is not None else DataStats()
    prompts = []
    for conv in read_conversations(path, fmt, on_bad_line, stats, max_line_bytes,
                                   warn_skipped=False):
        messages = conv.messages
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        try:
            ids = prompt_ids(tokenizer, messages[:first], enable_thinking=enable_thinking)
        except Exception as e:  # a template error, which names no line
            bad = DataError(path, conv.line_index + 1, f"the chat template fails on the prompt "
                            f"({type(e).__name__}: {e})", "template")
            if on_bad_line == "error":
                raise bad from None
            stats.record_bad(str(bad), bad.kind)
            continue
        prompts.append(ids)
        stats.conversations += 1
        if len(prompts) >= limit:
            break
    for line in stats.skipped_report(path):
        log.warning("%s", line)
    if stats.skipped_bad:
        log.warning("%s: %d held-out prompt(s) from the first %d line(s): skipped_bad=%d "
                    "blank=%d; bad: %s", path, len(prompts), stats.lines, stats.skipped_bad,
                    stats.blank, stats.kinds_summary())
    return prompts


def load_full_target(path: str, device: str, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


@torch.no_grad()
def evaluate_tau(target: nn.Module, drafter: DFlashDrafter, head: TargetHead,
                 prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 eos_token_id: Optional[int], decode: Optional[DecodeOptions] = None) -> float:
    """tau of ``drafter`` on ``prompts``; ``decode`` (default: train.eval's defaults) says how
    many prompts are decoded at once, with CUDA graphs or not, and how much GPU it takes."""
    decode = decode or EvalConfig().decode_options()
    was_training = drafter.training
    drafter.eval()
    dev = next(drafter.parameters()).device
    # The head in its own dtype (TargetHead.argmax casts slices of it): a target's head shared
    # by the evaluator stays where and as it is, uncopied.
    proposer = RowDrafter(DrafterProposer(drafter, head.to(dev)))
    try:
        with evaluator_stream(dev, decode):
            results = decode_many(target, proposer, prompts, drafter.spec.target_layer_ids,
                                  max_new_tokens, eos_token_id, decode.batch_size,
                                  graphs=decode.graphs_on(dev.type),
                                  pace=Pacer(dev, decode.gpu_duty))
    finally:
        drafter.train(was_training)
    return acceptance_length(results)
