"""How far AdamW carries a reduction-order-sized gradient noise into the final weights of the
GPU resume tests' job (tests/gpu/resume_match.py sets its tolerances from this).

    python -m bench.resume_noise --noise 1e-6 1e-5

Trains the job of tests/gpu/test_driver_gpu.py (6 steps, lr 2e-3, fp32, the demo's first 24
conversations) on CPU with the single-process reference trainer, once as is and once per
``--noise`` with each gradient tensor given additive noise of that fraction of its RMS before
every optimizer step (what another summation order of the same terms does: noise relative to
the terms' size, not to their sum, so an element whose terms cancel gets its sign flipped).
AdamW's update is about lr x sign for such an element, whatever its gradient's size, so a few
elements end far apart while the rest stay within the noise. Prints one JSON line per noise
level: the weights, how many differ by more than the tests' per-element bound, the largest
difference and the tensors it is in; then the same for a run whose AdamW state is dropped
after ``--lose-state-at`` steps (what a resume that lost its moments and step count does),
which the tests' bound must tell from noise.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from pipeline.assets.cache import ensure_tiny_assets
from pipeline.driver.compose import compose_job
from pipeline.reference.trainer import SingleProcessTrainer

JOB = ["cluster.drafters_per_node=1", "data.micro_batch_size=2", "train.optim.lr=2e-3",
       "train.export_dtype=float32", "train.log_every=100", "train.precision=fp32",
       "train.eval.every=-1", "train.plan.max_steps=6", "cluster.device=cpu"]


def train(work: Path, data: Path, noise: float, lose_state_at: int = 0,
          seed: int = 1) -> dict[str, torch.Tensor]:
    """The job's exported weights, each gradient given ``noise`` x its RMS of additive noise
    before every optimizer step (0: none), AdamW's state dropped before step
    ``lose_state_at`` + 1 (0: never)."""
    out = work / f"noise_{noise:g}_lost_{lose_state_at}"
    steps = [0]
    trainer = SingleProcessTrainer(compose_job(JOB + [f"data.train_path={data}",
                                                      f"train.out_dir={out}"]))
    draws = torch.Generator().manual_seed(seed)

    def perturb(optimizer, args, kwargs) -> None:
        steps[0] += 1
        if steps[0] == lose_state_at + 1 and lose_state_at:
            optimizer.state.clear()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None and noise:
                    rms = p.grad.pow(2).mean().sqrt()
                    p.grad.add_(noise * rms * torch.randn(p.grad.shape, generator=draws))

    trainer.drafter.optimizer.register_step_pre_hook(perturb)
    trainer.train()
    return load_file(str(out / "export" / "model.safetensors"))


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    """How many of ``b``'s weights are farther from ``a``'s than the GPU resume tests' bound,
    and which tensors their rule (resume_match.beyond_bound) refuses."""
    from tests.gpu.resume_match import apart, beyond_bound

    over, total, largest = 0, 0, {}
    for name in sorted(a):
        n, numel, most = apart(a[name], b[name])
        over, total = over + n, total + numel
        if n:
            largest[name] = most
    return {"weights": total, "beyond_bound": over, "share": over / total,
            "largest": max(largest.values(), default=0.0),
            "tensors": dict(sorted(largest.items(), key=lambda kv: -kv[1])[:5]),
            "refused_tensors": len(beyond_bound(a, b))}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noise", type=float, nargs="+", default=[1e-6, 1e-5])
    p.add_argument("--lose-state-at", type=int, default=3, help="0: no such run")
    args = p.parse_args(argv)
    lines = Path(ensure_tiny_assets().train_path).read_text().splitlines()[:24]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "small.jsonl"
        data.write_text("\n".join(lines) + "\n")
        clean = train(work, data, 0.0)
        rows = []
        for noise in args.noise:
            row = {"noise": noise, **compare(clean, train(work, data, noise))}
            print(json.dumps(row), flush=True)
            rows.append(row)
        if args.lose_state_at:
            lost = train(work, data, 0.0, args.lose_state_at)
            row = {"lost_state_at": args.lose_state_at,
                   **compare(clean, lost)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
