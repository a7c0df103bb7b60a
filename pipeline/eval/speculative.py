"""Greedy DFlash speculative decoding with target verification, and acceptance length tau.

Each round the proposer drafts B-1 tokens after the current anchor token; the target verifies
the whole block in one forward; the longest prefix matching the target's greedy tokens is
accepted and the target's next token is the bonus (the next anchor). tau is the mean over
rounds of (accepted + 1): the bonus counts, the maximum is B.

Rejected drafts leave the target's cache as its family says (pipeline/model/families.py):
cropped off a key/value cache, or, where a layer keeps state that cannot be cut back to a
prefix (Qwen3.5's linear attention), by re-reading the accepted text without a cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import torch
from torch import nn

from pipeline.model.cache_keyword import cache_keyword
from pipeline.model.drafter import DFlashDrafter, embed_tokens
from pipeline.model.families import rollback_of
from pipeline.model.target import TargetHead


class Proposer(Protocol):
    block_size: int

    def propose(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """tokens [a+1] end with the anchor at position a; features [1, a, F] cover 0..a-1.
        Returns the B-1 drafted tokens for positions a+1 .. a+B-1."""


class DrafterProposer:
    """Drafts with a DFlash drafter: context features, then the block alone (no other blocks)."""

    def __init__(self, drafter: DFlashDrafter, head: TargetHead) -> None:
        self.drafter = drafter
        self.head = head
        self.block_size = drafter.spec.block_size
        self.mask_token_id = drafter.spec.mask_token_id

    @torch.no_grad()
    def block_hidden(self, features: torch.Tensor, anchor_token: int,
                     anchor_pos: int) -> torch.Tensor:
        """The drafter's output [B-1, H] at block positions 1..B-1 of the block anchored at
        ``anchor_pos`` (what the target's head scores)."""
        dev = features.device
        ids = torch.full((1, self.block_size), self.mask_token_id, device=dev)
        ids[0, 0] = anchor_token
        block_pos = torch.arange(anchor_pos, anchor_pos + self.block_size, device=dev)[None]
        ctx_pos = torch.arange(features.shape[1], device=dev)[None]
        embeds = embed_tokens(self.head.embed, ids, self.drafter.fc.weight.dtype,
                              self.head.embed_scale)
        return self.drafter(features, embeds, ctx_pos, block_pos, None)[0, 1:]

    def propose(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        a = tokens.numel() - 1
        return self.head.argmax(self.block_hidden(features[:, :a], int(tokens[-1]), a))


@dataclass
class DecodeResult:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # accepted drafts per round

    @property
    def acceptance_lengths(self) -> list[int]:
        return [n + 1 for n in self.accepted]


def _taps(hidden_states: Sequence[torch.Tensor], tap_ids: Sequence[int]) -> torch.Tensor:
    return torch.cat([hidden_states[i + 1] for i in tap_ids], dim=-1)


class _CroppedCache:
    """The target with a DynamicCache whose rejected tail is cropped off each round."""

    def __init__(self, target: nn.Module) -> None:
        from transformers import DynamicCache

        self.target = target
        self.cache = DynamicCache()
        self.cache_keyword = cache_keyword(target)

    def run(self, ids: torch.Tensor, start: int):
        """Outputs for ``ids`` (the tokens from position ``start`` on; earlier ones cached)."""
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
        return self.target(ids, **{self.cache_keyword: self.cache}, use_cache=True,
                           output_hidden_states=True, position_ids=positions)

    def keep(self, length: int) -> None:
        # A negative argument means "drop this many", the one form every transformers
        # version takes.
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)


class _Recompute:
    """The target re-reads all accepted text every round, without a cache: for caches whose
    state cannot be cut back to a prefix (a linear-attention layer's recurrent state)."""

    def __init__(self, target: nn.Module) -> None:
        self.target = target
        self.tokens: Optional[torch.Tensor] = None  # [1, L] the accepted text so far

    def run(self, ids: torch.Tensor, start: int):
        seq = ids if start == 0 else torch.cat([self.tokens[:, :start], ids], dim=1)
        self.tokens = seq
        out = self.target(seq, use_cache=False, output_hidden_states=True)
        out.logits = out.logits[:, start:]
        out.hidden_states = tuple(h[:, start:] for h in out.hidden_states)
        return out

    def keep(self, length: int) -> None:
        self.tokens = self.tokens[:, :length]


ROLLBACK = {"crop": _CroppedCache, "recompute": _Recompute}


@torch.no_grad()
def speculative_generate(target: nn.Module, proposer: Proposer, prompt: Sequence[int],
                         tap_ids: Sequence[int], max_new_tokens: int,
                         eos_token_id: Optional[int] = None,
                         rollback: Optional[str] = None) -> DecodeResult:
    """Greedy speculative decoding of one prompt. ``rollback`` (default: the target family's,
    pipeline/model/families.py) says how rejected tokens leave the target's cache."""
    rollback = rollback or rollback_of(getattr(target.config, "model_type", None))
    dev = next(target.parameters()).device
    ids = torch.tensor(list(prompt), device=dev)[None]
    runner = ROLLBACK[rollback](target)
    out = runner.run(ids, 0)
    features = _taps(out.hidden_states, tap_ids)
    tokens = torch.cat([ids[0], out.logits[0, -1].argmax().view(1)])
    result = DecodeResult(tokens=[])
    while tokens.numel() - len(prompt) < max_new_tokens and int(tokens[-1]) != eos_token_id:
        a = tokens.numel() - 1
        draft = proposer.propose(tokens, features)
        block = torch.cat([tokens[-1:], draft])[None]
        out = runner.run(block, a)
        posterior = out.logits[0].argmax(-1)
        n = int((draft == posterior[:-1]).long().cumprod(0).sum())
        result.accepted.append(n)
        features = torch.cat([features, _taps(out.hidden_states, tap_ids)[:, : n + 1]], dim=1)
        tokens = torch.cat([tokens, draft[:n], posterior[n:n + 1]])
        runner.keep(a + n + 1)
        if eos_token_id is not None and bool((tokens[a + 1:] == eos_token_id).any()):
            break
    new = tokens[len(prompt):].tolist()
    if eos_token_id in new:
        new = new[: new.index(eos_token_id) + 1]
    result.tokens = new
    return result


def acceptance_length(results: Sequence[DecodeResult]) -> float:
    """tau: mean over all rounds of all prompts of (accepted + 1)."""
    lengths = [x for r in results for x in r.acceptance_lengths]
    if not lengths:
        raise ValueError("no speculative rounds ran: every prompt ended before its first round")
    return sum(lengths) / len(lengths)
