"""Actors start with torch's host-register allocator for pinned memory
(pipeline.runtime.ray_start.HOST_REGISTER_CONF): a save pool filled in an actor on the GPU comes out
pinned, one buffer per state tensor, and takes non-blocking copies from the device intact.
How much the allocator spares GPU work beside it was measured once (docs/BENCHMARKS.md, "Findings"), not a test's."""

import ray
import torch

from pipeline.runtime import ray_start

SPECS = [((257, 1031), torch.float32), ((4099,), torch.bfloat16), ((3, 5, 7), torch.float32)]


class _SavePool:
    """What a writing drafter's pool does after a load: fill in the background, then take a
    snapshot of device tensors."""

    def __init__(self, device: str) -> None:
        self.device = device

    def snapshot(self, seed: int) -> dict:
        import os

        from pipeline.checkpoint.host_copy import HostPool, snapshot

        on_cuda = self.device == "cuda"
        pool = HostPool(list(SPECS), pin=on_cuda)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        state = {f"t{i}": torch.randn(shape, generator=gen, device=self.device).to(dtype)
                 for i, (shape, dtype) in enumerate(SPECS)}
        copy, taken = snapshot(state, pool)
        return {"conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "pinned": [t.is_pinned() for t in taken],
                "intact": all(torch.equal(copy[k], v.cpu()) for k, v in state.items())}


def test_an_actor_pins_its_save_pool_through_the_host_register_allocator(ray_session, device,
                                                                         on_cuda):
    placement = ray_start.Placement(cpus=0.5, gpus=0.5 if on_cuda else 0.0)
    actor = ray_start.start_actor(_SavePool, placement, device=device)
    try:
        got = ray.get(actor.snapshot.remote(seed=3))
    finally:
        ray_start.kill_actors([actor])
    assert ray_start.HOST_REGISTER_CONF in got["conf"]
    assert got["pinned"] == [on_cuda] * len(SPECS)
    assert got["intact"]
