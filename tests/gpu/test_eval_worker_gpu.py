"""The evaluator actor's class on CUDA: between evaluations it holds its weights only, so a
drafter or target sharing its GPU can use what an evaluation's caches and graphs took (at the
8B shape on one 80 GB H100 the evaluator held about 7 GB beyond its weights after its first
evaluation, and the drafter beside it ran out of memory).

    pytest -q tests/gpu/test_eval_worker_gpu.py
"""

import torch

from pipeline.driver.compose import compose_job
from pipeline.eval.config import EvalConfig
from pipeline.model.drafter import DFlashDrafter
from pipeline.job.resolve import resolve_job
from pipeline.workers.eval_worker import EvalWorker


def test_the_evaluator_gives_back_what_an_evaluation_took(tiny_assets, tmp_path, device,
                                                          on_cuda):
    # The drafter's spec and the target's folder (the worker's device is its own argument).
    r = resolve_job(compose_job(["cluster.device=cpu", f"train.out_dir={tmp_path}"]))
    # Many long rows decoded at once: the evaluation's caches (tens of MB at the tiny target)
    # dwarf the allocator's slack around the weights it keeps.
    n, length = (256, 400) if on_cuda else (4, 24)
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(4, 1000, (n, length), generator=g).tolist()
    decode = EvalConfig(batch_size=n, gpu_duty=1.0).decode_options()  # no pacing sleeps
    worker = EvalWorker(spec=r.spec, target_path=r.target_path, device=device,
                        target_dtype=torch.float32, prompts=prompts, max_new_tokens=32,
                        eos_token_id=None, decode=decode)
    torch.manual_seed(0)
    weights = DFlashDrafter(r.spec).state_dict()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    for step in (1, 2):  # the second evaluation allocates again what the first gave back
        result = worker.evaluate(weights, step=step)
        assert result.error is None and result.tau >= 1.0
        if not on_cuda:
            continue
        # The worker runs in this process: torch's counters are its own.
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        took = torch.cuda.max_memory_allocated() - allocated
        assert took > 100 * 2**20, f"the evaluation took only {took / 2**20:.0f} MiB"
        slack = reserved - allocated
        assert slack < took / 4, (f"{slack / 2**20:.0f} MiB cached after an evaluation that "
                                  f"took {took / 2**20:.0f} MiB")
        torch.cuda.reset_peak_memory_stats()
    worker.close()
