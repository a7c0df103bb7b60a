"""The evaluator's weights through drafter rank 0's snapshot ring (pipeline/workers/weights.py).

The ring is the slot ring of the hidden states (CPU shared memory here, CUDA IPC on a GPU:
tests/gpu/test_eval_batched_gpu.py); what is checked here is what it carries: every tensor of
the state dict, bit for bit, whatever its dtype, the evaluator's tau equal to the object-store
path's, the slot reused across evaluations, and the fallbacks.
"""

from __future__ import annotations

import logging

import pytest
import torch

from pipeline.driver.compose import compose_job
from pipeline.job.resolve import resolve_job
from pipeline.transport.ring import RingReader
from pipeline.workers import drafter_worker, weights
from pipeline.workers.eval_worker import EvalWorker
from pipeline.workers.weights import SnapshotRing, WeightsSnapshot, layout_of, unpack


def test_a_snapshot_carries_every_tensor_exactly_whatever_its_dtype():
    state = {"w": torch.randn(3, 5), "half": torch.randn(7).to(torch.bfloat16),
             "count": torch.tensor([3, 1, 4], dtype=torch.int64), "flag": torch.tensor(True),
             "empty": torch.zeros(0, 4)}
    layout, nbytes = layout_of(state)
    assert all(e.offset % 64 == 0 for e in layout)  # any dtype can view its byte range
    assert nbytes >= sum(e.nbytes for e in layout)
    ring = SnapshotRing(torch.device("cpu"))
    try:
        snapshot = ring.put(state)
        reader = RingReader("cpu")
        reader.attach(snapshot.ring)
        got = unpack(reader.view(snapshot.ready), snapshot.layout)
        assert list(got) == list(state)
        for name, t in state.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
        # The same slot next time, holding the new values.
        state["w"].add_(1.0)
        again = ring.put(state)
        assert again.ring.ring_id == snapshot.ring.ring_id
        reader.attach(again.ring)  # a no-op: the same ring
        assert torch.equal(unpack(reader.view(again.ready), again.layout)["w"], state["w"])
        reader.close()
    finally:
        ring.close()


def _drafter_and_evaluator(tmp_path, prompts: int = 3):
    from transformers import AutoTokenizer

    from pipeline.eval.tau import heldout_prompts

    job = compose_job(["cluster.device=cpu", f"train.out_dir={tmp_path}"])
    r = resolve_job(job)
    tok = AutoTokenizer.from_pretrained(r.target_path)
    held = heldout_prompts(r.heldout_path, tok, prompts, enable_thinking=job.data.enable_thinking)
    drafter = drafter_worker.DrafterWorker(
        rank=0, world_size=1, spec=r.spec, options=job.drafter, optim=job.train.optim, seed=3,
        target_path=r.target_path, device="cpu", autocast_dtype=None,
        feature_dtype=torch.float32, feature_numel=8, total_steps=1)
    evaluator = EvalWorker(spec=r.spec, target_path=r.target_path, device="cpu",
                           target_dtype=torch.float32, prompts=held, max_new_tokens=12,
                           eos_token_id=r.eos_token_id)
    return drafter, evaluator


def _nudge(model: torch.nn.Module, seed: int) -> None:
    """Weights no fresh drafter has: the evaluator must use the ones it was handed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))


def test_the_evaluator_gets_through_the_ring_what_the_object_store_gives(tiny_assets, tmp_path):
    drafter, evaluator = _drafter_and_evaluator(tmp_path)
    try:
        for step, seed in ((1, 11), (2, 12)):  # the slot written twice, read twice
            _nudge(drafter.trainer.model, seed)
            by_store = evaluator.evaluate(drafter.weights(), step=step)
            store_state = {k: v.clone() for k, v in evaluator.drafter.state_dict().items()}
            snapshot = drafter.weights(ring=True)
            assert isinstance(snapshot, WeightsSnapshot)
            by_ring = evaluator.evaluate(snapshot, step=step)
            assert by_store.weights_by == "object store" and by_ring.weights_by == "ring"
            assert by_ring.error is None and by_ring.tau == by_store.tau
            ring_state = evaluator.drafter.state_dict()
            assert all(torch.equal(ring_state[k], store_state[k]) for k in store_state)
            own = drafter.trainer.model.state_dict()
            assert all(torch.equal(ring_state[k], own[k]) for k in own)
    finally:
        evaluator.close()
        drafter.close()
    assert drafter.snapshots.ring is None  # closed with the drafter


def test_null_takes_the_ring_on_the_evaluators_node_and_the_object_store_elsewhere(
        tiny_assets, tmp_path, monkeypatch):
    drafter, evaluator = _drafter_and_evaluator(tmp_path, prompts=1)
    try:
        monkeypatch.setattr(drafter_worker, "current_node_id", lambda: "node-a")
        assert isinstance(drafter.weights(ring=None, reader_node="node-a"), WeightsSnapshot)
        assert isinstance(drafter.weights(ring=None, reader_node="node-b"), dict)
        assert isinstance(drafter.weights(ring=False, reader_node="node-a"), dict)
        with pytest.raises(ValueError, match="train.eval.weights_ring=true, but the tau "
                                             "evaluator runs on node node-b"):
            drafter.weights(ring=True, reader_node="node-b")
    finally:
        evaluator.close()
        drafter.close()


def test_a_snapshot_that_does_not_fit_falls_back_to_the_object_store_with_one_warning(
        tiny_assets, tmp_path, monkeypatch, caplog):
    drafter, evaluator = _drafter_and_evaluator(tmp_path, prompts=1)

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(weights, "SlotRing", no_room)
    try:
        with caplog.at_level(logging.WARNING, logger=weights.__name__):
            first, second = drafter.weights(ring=True), drafter.weights(ring=None)
        assert isinstance(first, dict) and isinstance(second, dict)
        assert caplog.text.count("does not fit") == 1
        own = drafter.trainer.model.state_dict()
        assert all(torch.equal(first[k], own[k]) for k in own)
    finally:
        evaluator.close()
        drafter.close()
