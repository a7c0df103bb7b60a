"""A drafter's weights as they cross Ray (to the tau evaluator): parameter name -> CPU tensor."""

from __future__ import annotations

import torch

Weights = dict[str, torch.Tensor]


def weights_of(model: torch.nn.Module) -> Weights:
    """A CPU copy of ``model``'s state dict, safe to put in the object store while the model
    keeps training."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
