"""How closely a resumed CUDA run must repeat the uninterrupted one (test_driver_gpu.py,
test_fsdp_gpu.py): the tolerances and the comparisons of losses and exported weights.

CUDA's attention and reduction kernels are not bit-reproducible from one run to the next
(atomics in the backward of attention and of the fused loss, cuBLAS split-K choices). Seen on
the H200: the first resumed step 6.413394078710355 vs 6.413393033718491 uninterrupted
(1.6e-7 relative, 2026-12-02) and 5.4005893 vs 5.4005888 (9e-8, 2026-12-01); later steps
within 1e-7. Deterministic algorithms would make the run bit-exact but are not what jobs run
(and flex attention has no deterministic backward), so the contract is a tolerance:

* FIRST_STEP: the step right after the resume agrees to 2e-6 relative, about 10x the noise
  seen. A lost RNG state, AdamW moment or scheduler position moves that step by as much as a
  training step moves the loss (1e-2 relative and more here; asserted, so the bound stays
  meaningful).
* DRIFT: later steps' losses and the final weights, where the noise compounds.
* WEIGHT_ATOL: the final weights' per-element bound (with DRIFT relative), which a few
  elements may exceed: NOISY_SHARE. Another summation order moves a gradient by noise of the
  size of its terms, not of their sum, and AdamW's update is about lr x the gradient's sign
  whatever its size, so an element whose terms cancel can end as much as lr per step apart.
  On the H200, one element of 12288 ended 2.66e-6 apart in both resume tests (2026-12-04),
  and on 2026-12-05 both failed (the replicated resume read ahead, the fsdp one from the
  files) on layers.0.self_attn.v_proj.weight against 1e-5 for every element (how far and
  how many went unreported). ``python -m
  bench.resume_noise`` shows the mechanism on CPU: additive gradient noise of 1e-6 of each
  tensor's RMS put 10 of 111,040 weights beyond the bound (up to 9.7e-5 apart; at 1e-5: 81,
  at most 19 in one tensor, up to 1.1e-3), while a resume that lost AdamW's state put 99.6%
  beyond it. So each tensor may have max(1, NOISY_SHARE of its elements) beyond the bound:
  noise passes, a tensor whose optimizer state, step count or learning rate was lost does not
  (tests/bench/test_resume_noise.py checks both on CPU).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

FIRST_STEP = 2e-6
DRIFT = 1e-5
WEIGHT_ATOL = 1e-5
NOISY_SHARE = 1e-2


def losses(out_dir) -> dict[int, list[float]]:
    """step -> every loss logged for it (a step trained again after a restart has two)."""
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    out: dict[int, list[float]] = {}
    for r in rows:
        if "train/loss" in r:
            out.setdefault(r["step"], []).append(r["train/loss"])
    return out


def same_step(got: float, want: float, previous: float) -> None:
    """``got`` repeats ``want`` within FIRST_STEP, a bound far below one step's change."""
    assert abs(want - previous) > 100 * FIRST_STEP * abs(want), (want, previous)
    assert got == pytest.approx(want, rel=FIRST_STEP), (got, want)


def apart(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, float]:
    """(elements of ``b`` beyond WEIGHT_ATOL + DRIFT x |a|, elements, the largest difference)."""
    d = (b.float() - a.float()).abs()
    over = int((d > WEIGHT_ATOL + DRIFT * a.float().abs()).sum())
    return over, d.numel(), float(d.max()) if d.numel() else 0.0


def beyond_bound(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """Per tensor of ``a``: :func:`apart`, for the tensors where the count beyond the bound
    exceeds max(1, NOISY_SHARE of its elements)."""
    assert sorted(a) == sorted(b)
    out = {}
    for name in a:
        over, numel, largest = apart(a[name], b[name])
        if over > max(1, NOISY_SHARE * numel):
            out[name] = (over, numel, largest)
    return out


def close_exports(a_dir, b_dir) -> None:
    """The two runs' exported weights: the same tensors, each within DRIFT and WEIGHT_ATOL but
    for a share of elements that noise amplified by AdamW can reach (NOISY_SHARE)."""
    a = load_file(str(a_dir / "export" / "model.safetensors"))
    b = load_file(str(b_dir / "export" / "model.safetensors"))
    apart = beyond_bound(a, b)
    assert not apart, "tensor: (elements beyond the bound, elements, largest difference): " + \
        ", ".join(f"{name}: {v}" for name, v in apart.items())
