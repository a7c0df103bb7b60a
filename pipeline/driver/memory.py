"""Before any actor starts: does each target stage fit its GPU share? (``target.stages``)

A stage's need is estimated as

    weights      its layers' tensors (stage 0: and the embedding) at the target dtype, read
                 from the safetensors headers (nothing after the deepest tap loads, except
                 where the drafter distils: then every layer)
    slot rings   the last stage: the tap ring (num_slots x the largest micro-batch's features);
                 the others: their activation ring (num_slots x tokens x hidden)
    activations  one forward of the largest micro-batch: about tokens x (6 hidden +
                 3 intermediate) elements live inside a layer, plus the taps it captures

against ``gpus_per_actor`` of one GPU's memory less ``CONTEXT_BYTES`` (CUDA context, allocator
slack). A job whose largest stage does not fit is refused in one line naming what the stage
needs and the fewest stages that would fit. The GPU's memory is ``cluster.gpu_memory_gb``, else
the driver's own GPU, else the nodes' accelerator type; when none says, the check is skipped
with a warning. On CPU only the layer count is checked (host memory is not planned here).
The tau evaluator loads the whole target on one GPU, unstaged: with eval on, a target larger
than a GPU is refused (``train.eval.every=-1`` turns eval off).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

from pipeline.job.assembly import batch_shapes
from pipeline.job.config import JobConfig
from pipeline.model.stages import split_layers, stage_weight_bytes, tensor_numels
from pipeline.job.resolve import ResolvedJob

log = logging.getLogger(__name__)

GB = 1e9
CONTEXT_BYTES = int(1.5 * GB)
BUSY_BYTES = int(2 * GB)  # held by others on the driver's GPU beyond which busy_line warns
# GPU memory by the accelerator type Ray reports ("accelerator_type:H100"); marketing GB.
GPU_MEMORY_GB = {"H200": 141.0, "H100": 80.0, "H20": 96.0, "B200": 180.0, "L40S": 48.0}


@dataclass(frozen=True)
class StageNeed:
    weights: int
    rings: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.rings + self.activations

    def text(self) -> str:
        return (f"{self.total / GB:.1f} GB (weights {self.weights / GB:.1f}, slot rings "
                f"{self.rings / GB:.1f}, activations {self.activations / GB:.1f})")


def stage_needs(weights: Sequence[int], taps_per_stage: Sequence[int], num_taps: int,
                tokens: int, hidden: int, intermediate: int, num_slots: int,
                dtype_bytes: int) -> list[StageNeed]:
    """Each stage's estimated need (pure): see the module docstring."""
    k = len(weights)
    out = []
    for s in range(k):
        per_slot = tokens * hidden * (num_taps if s == k - 1 else 1)
        work = tokens * (6 * hidden + 3 * intermediate + taps_per_stage[s] * hidden)
        out.append(StageNeed(weights[s], num_slots * per_slot * dtype_bytes,
                             work * dtype_bytes))
    return out


def gpu_memory_bytes(gpu_memory_gb: Optional[float],
                     nodes: Sequence[Mapping[str, float]]) -> Optional[int]:
    """One GPU's memory: the config's figure, the driver's GPU, or the nodes' accelerator."""
    if gpu_memory_gb is not None:
        return int(gpu_memory_gb * GB)
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    for node in nodes:
        for key in node:
            if key.startswith("accelerator_type:"):
                name = key.split(":", 1)[1].upper().removeprefix("NVIDIA_")
                if name in GPU_MEMORY_GB:
                    return int(GPU_MEMORY_GB[name] * GB)
    return None


def _needs(job: JobConfig, r: ResolvedJob, stages: int) -> list[StageNeed]:
    taps = list(r.spec.target_layer_ids)
    hf = r.spec.hf_config
    # A distilling target runs every layer and hands over its final hidden state as one more
    # column block of each slot (one stage only: a staged target cannot distil).
    deepest = [int(hf["num_target_layers"]) - 1] if job.drafter.distills else []
    dtype_bytes = torch.empty(0, dtype=r.target_dtype).element_size()
    weights = stage_weight_bytes(r.target_path, taps + deepest, stages, dtype_bytes)
    bounds = split_layers(max(taps + deepest) + 1, stages)
    per_stage = [sum(a <= i < b for i in taps) for a, b in bounds]
    hidden = int(hf["hidden_size"])
    tokens = batch_shapes(job).max_tokens(job.data.max_length)
    return stage_needs(weights, per_stage, len(taps) + len(deepest), tokens, hidden,
                       int(hf.get("intermediate_size") or 4 * hidden), job.cluster.num_slots,
                       dtype_bytes)


def check_target_memory(job: JobConfig, r: ResolvedJob, device: str,
                        nodes: Sequence[Mapping[str, float]]) -> None:
    """Refuse, before any actor starts, a stage count the target's layers or GPUs can't hold."""
    k = job.target.stages
    layers = max(r.spec.target_layer_ids) + 1
    split_layers(layers, k)  # stages > layers: refused naming the allowed range
    if device != "cuda":
        return
    gpu = gpu_memory_bytes(job.cluster.gpu_memory_gb, nodes)
    if gpu is None:
        log.warning("target.stages=%d: GPU memory unknown (set cluster.gpu_memory_gb), so "
                    "whether each stage fits is not checked before the actors start", k)
        return
    if job.cluster.gpu_memory_gb is None and torch.cuda.is_available():
        held = _held_bytes()
        line = None if held is None else busy_line(held, gpu)
        if line:
            log.warning(line)
    _check_evaluator(job, r, gpu)
    share = job.cluster.gpus_per_actor
    budget = int(gpu * share) - CONTEXT_BYTES
    needs = _needs(job, r, k)
    worst = max(range(k), key=lambda s: needs[s].total)
    log.info("target.stages=%d: the largest stage needs %s of %.1f GB per actor", k,
             needs[worst].text(), budget / GB)
    if needs[worst].total <= budget:
        return
    fits = next((n for n in range(k + 1, layers + 1)
                 if max(x.total for x in _needs(job, r, n)) <= budget), None)
    allowed = (f"target.stages >= {fits}" if fits is not None else
               f"no stage count up to {layers} (one layer per stage) fits this share")
    raise ValueError(
        f"target.stages={k} is not allowed: stage {worst} of the target needs "
        f"{needs[worst].text()}, but an actor gets {max(budget, 0) / GB:.1f} GB "
        f"(cluster.gpus_per_actor={share:g} of a {gpu / GB:.0f} GB GPU, less "
        f"{CONTEXT_BYTES / GB:.1f} GB for the CUDA context); allowed: {allowed}, or a "
        f"larger cluster.gpus_per_actor")


def _held_bytes() -> Optional[int]:
    """GPU 0's memory in use by every process, as nvidia-smi reads it (NVML): unlike
    ``torch.cuda.mem_get_info`` it makes no CUDA context in the driver, which would hold about
    half a GB of the actors' GPU for the whole job. None where NVML cannot be read."""
    try:
        return int(torch.cuda.device_memory_used(0))
    except Exception as e:  # pynvml not installed, or NVML not loadable: the check is advisory
        log.debug("GPU memory in use not read (%s: %s)", type(e).__name__, e)
        return None


def busy_line(held: int, total: int) -> Optional[str]:
    """A warning when the driver's GPU is already largely in use before any actor starts
    (``held`` more than ``BUSY_BYTES`` beyond a context's worth): the plan counts the whole
    GPU, and its actors would run out of memory far from the cause. None otherwise."""
    if held <= CONTEXT_BYTES + BUSY_BYTES:
        return None
    return (f"GPU memory: {held / GB:.1f} GB of this GPU's {total / GB:.0f} GB are in use before "
            f"any actor starts (other processes: see nvidia-smi); the memory plan counts the "
            f"whole GPU, so its actors may run out of memory")


def _check_evaluator(job: JobConfig, r: ResolvedJob, gpu: int) -> None:
    """The tau evaluator holds the whole target (every layer and the LM head) on one GPU,
    unstaged: refuse a target that cannot fit a whole GPU while eval is on."""
    if job.train.eval.off is not None:
        return
    dtype_bytes = torch.empty(0, dtype=r.target_dtype).element_size()
    whole = sum(tensor_numels(Path(r.target_path)).values()) * dtype_bytes
    if whole + CONTEXT_BYTES <= gpu:
        return
    raise ValueError(
        f"train.eval.every={job.train.eval.every} is not allowed with this target: the tau "
        f"evaluator holds the whole target on one GPU ({whole / GB:.1f} GB of weights, the "
        f"GPU has {gpu / GB:.0f} GB) and is not staged; allowed: train.eval.every=-1 "
        f"(evaluate the exported drafter elsewhere)")
