"""drafter.parallel=fsdp: the drafter's weights and AdamW state sharded with FSDP2.

The step loop hands micro-batches to whichever drafter of a node is least busy, so two ranks
may run different numbers of forward/backward calls in one step. A collective inside a
micro-batch (FSDP's per-layer all-gather or reduce-scatter) would then wait forever. So every
collective here runs at the step boundary, which every rank enters once:

- after sharding, and after each update, the parameters are gathered (``unshard``) and stay
  gathered through the step's micro-batches (no resharding after forward or backward, no
  gradient sync), which then run without any collective;
- at the step, the summed gradients and denominators are all-reduced in one flat buffer (the
  replicated path's :class:`~pipeline.dist.reduce.FlatReducer`, so no divide-by-world-size is
  ever applied), the model is resharded, and each sharded parameter takes its slice of the
  sum as its gradient; clipping and AdamW then run on the shards.

What this saves today is the optimizer state (and the update's work), not the parameters or
gradients during the micro-batches; per-micro-batch sharding needs a fixed micro-batch count
per rank and step first.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from pipeline.dist.reduce import FlatReducer

# FSDP2, DTensor and DCP's state-dict helpers are imported inside the functions that use
# them: together most of a CPU-second (sympy among them) in every process that imports this
# module, and every drafter actor does, while only drafter.parallel=fsdp and the checkpoint
# code ever call them.


def shard(model: nn.Module, device: torch.device) -> None:
    """Shard each decoder layer and the root over the default process group. The module's
    parameters are the shards (DTensors) until :func:`gather`: build the optimizer on them
    first."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, device.type)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)


def _fsdp_modules(model: nn.Module) -> list:
    """The model's FSDP-sharded modules; none where FSDP was never imported (nothing can have
    been sharded then)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return []
    return [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]


def gather(model: nn.Module) -> None:
    """All-gather every parameter (a collective: every rank, at a step boundary)."""
    for m in _fsdp_modules(model):
        m.unshard()


def scatter(model: nn.Module) -> None:
    """Back to the shards (no communication); module parameters become DTensors again."""
    for m in _fsdp_modules(model):
        m.reshard()


class ShardedReducer:
    """Sums the step's gathered gradients and denominators over ranks; leaves the model
    resharded with each shard's slice of the summed gradient as its ``.grad``."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        numel = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the whole
        self.flat = FlatReducer(numel, device)
        self.start = self.seconds = 0.0  # the last all-reduce: wall clock start, duration

    def __call__(self, denominator: float) -> float:
        if self.device.type == "cuda":  # time the collective, not the backward still queued
            torch.cuda.synchronize(self.device)
        self.start, t0 = time.time(), time.perf_counter()
        named = list(self.model.named_parameters())
        grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in named}
        total = self.flat(list(grads.values()), denominator)
        self.seconds = time.perf_counter() - t0
        for _, p in named:
            p.grad = None
        scatter(self.model)
        from torch.distributed.tensor import distribute_tensor

        for name, p in self.model.named_parameters():
            # Each rank holds the whole sum already: it keeps its own slice, no communication.
            p.grad = distribute_tensor(grads[name], p.device_mesh, p.placements,
                                       src_data_rank=None)
        return total


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict,
                    optim: dict) -> None:
    """Load a whole state in the format before DCP (drafter.pt) that every rank has read."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    scatter(model)
    fqn_of = {id(p): n for n, p in model.named_parameters()}
    fqns = [fqn_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    by_fqn = {
        "state": {fqns[i]: s for i, s in optim["state"].items()},
        "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]}
                         for g in optim["param_groups"]]}
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, by_fqn, options=options)
    gather(model)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on CPU: a collective every rank enters; rank 0 gets them, the
    others an empty dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    scatter(model)
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                   cpu_offload=True))
    gather(model)
    return weights
