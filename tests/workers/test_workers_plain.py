"""The workers as plain classes, without Ray: one target, one drafter, one step."""

import pytest
import torch

from pipeline.dist.rendezvous import destroy_group, pick_master
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.target import load_target_head
from pipeline.training.config import OptimConfig
from pipeline.training.drafter_trainer import DrafterTrainer
from pipeline.workers.drafter_worker import DrafterWorker
from pipeline.workers.messages import MicroBatch, MicroBatchMeta
from pipeline.workers.target_worker import TargetWorker

MASK_ID = 95  # the last row of the random target's vocabulary (tests/conftest.py)


def _micro_batch() -> MicroBatch:
    """Samples 5 and 9, 20 tokens each, supervised from position 6."""
    ids = torch.randint(0, 90, (2, 20))
    mask = torch.zeros_like(ids)
    mask[:, 6:] = 1
    meta = MicroBatchMeta(step=0, epoch=0, index=0, num_in_step=1, sample_ids=(5, 9),
                          shape=(2, 20))
    return MicroBatch(meta, ids, mask)


def test_target_to_drafter_through_the_ring(random_target_dir, target_config):
    options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=MASK_ID,
                            num_anchors=4)
    spec = build_drafter_spec(target_config, options)
    numel = 2 * 24 * spec.feature_size
    target = TargetWorker(rank=0, target_path=str(random_target_dir),
                          tap_ids=spec.target_layer_ids, device="cpu", dtype=torch.float32,
                          num_slots=2, slot_numel=numel)
    optim = OptimConfig(lr=1e-3, warmup_ratio=0.0)
    drafter = DrafterWorker(rank=0, world_size=1, spec=spec, options=options, optim=optim,
                            seed=0, target_path=str(random_target_dir), device="cpu",
                            autocast_dtype=None, feature_dtype=torch.float32,
                            feature_numel=numel, total_steps=1)
    startup = drafter.startup_seconds()  # the parts the driver's start-up line gives
    assert list(startup) == ["device ready", "drafter built", "waited for the target head",
                             "optimizer and compile set up", "rest"]
    assert all(v >= 0 for v in startup.values())
    master = pick_master()
    drafter.init_group(master.addr, master.port)
    try:
        drafter.attach([target.ring_handle()])
        batch = _micro_batch()
        ids, mask = batch.input_ids, batch.loss_mask
        ready = target.produce(1, batch)
        assert ready.slot == 1 and ready.shape == (2, 20, spec.feature_size)
        assert ready.meta.on_main_thread
        drafter.load(ready)
        result = drafter.forward_backward(batch)
        step = drafter.step(0)
        # The same micro-batch through a plain DrafterTrainer gives the same loss and update.
        ref = DrafterTrainer(spec, options, optim, 0, load_target_head(random_target_dir),
                             "cpu", None, total_steps=1)
        feats = target.target(ids)
        parts = ref.forward_backward(feats, ids, mask, [5, 9], 0)
        ref.step()
        assert result.numerator == float(parts.numerator.detach())
        assert step.denominator == float(parts.denominator)
        for a, b in zip(drafter.trainer.model.parameters(), ref.model.parameters()):
            torch.testing.assert_close(a, b)
    finally:
        drafter.close()
        target.close()
        destroy_group()


def test_the_target_head_is_read_beside_the_drafters_build(random_target_dir, target_config,
                                                           monkeypatch):
    """The read (2.5 GB at 8B, 4.4 s in a restart on the H200) runs in another thread while the
    drafter is built, which needs the head only at its end. Shown without timing: the read
    goes on only once the build has begun, which a read before the build would wait for in
    vain."""
    import threading

    from pipeline.training import drafter_trainer
    from pipeline.workers import drafter_worker

    building, seen = threading.Event(), {}
    real_build, real_read = drafter_trainer.build_drafter, drafter_worker.load_target_head

    def build(*args, **kwargs):
        building.set()
        return real_build(*args, **kwargs)

    def read(path):
        seen["during the build"] = building.wait(timeout=60)
        seen["on the main thread"] = threading.current_thread() is threading.main_thread()
        return real_read(path)

    monkeypatch.setattr(drafter_trainer, "build_drafter", build)
    monkeypatch.setattr(drafter_worker, "load_target_head", read)
    options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=MASK_ID,
                            num_anchors=4)
    spec = build_drafter_spec(target_config, options)
    drafter = DrafterWorker(rank=0, world_size=1, spec=spec, options=options,
                            optim=OptimConfig(), seed=0, target_path=str(random_target_dir),
                            device="cpu", autocast_dtype=None, feature_dtype=torch.float32,
                            feature_numel=8, total_steps=1)
    try:
        assert seen == {"during the build": True, "on the main thread": False}
        torch.testing.assert_close(drafter.trainer.head.lm_head,
                                   load_target_head(random_target_dir).lm_head)
    finally:
        drafter.close()


def test_a_distilling_drafter_gets_the_targets_final_normed_hidden(random_target_dir,
                                                                   target_config):
    """drafter.distill_weight > 0: the target worker writes its final normed hidden state after
    the taps ((n_taps + 1) * H wide); through the head it gives HF's logits, and the drafter
    worker trains on it as a drafter fed HF's own hidden states does."""
    from transformers import AutoModelForCausalLM

    from pipeline.model.config import feature_width

    options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=MASK_ID,
                            num_anchors=4, distill_weight=0.5, distill_temperature=2.0)
    spec = build_drafter_spec(target_config, options)
    width = feature_width(spec, options)
    assert width == 3 * spec.hidden_size
    numel = 2 * 24 * width
    target = TargetWorker(rank=0, target_path=str(random_target_dir),
                          tap_ids=spec.target_layer_ids, device="cpu", dtype=torch.float32,
                          num_slots=2, slot_numel=numel, final_hidden=True)
    optim = OptimConfig(lr=1e-3, warmup_ratio=0.0)
    drafter = DrafterWorker(rank=0, world_size=1, spec=spec, options=options, optim=optim,
                            seed=0, target_path=str(random_target_dir), device="cpu",
                            autocast_dtype=None, feature_dtype=torch.float32,
                            feature_numel=numel, total_steps=1)
    master = pick_master()
    drafter.init_group(master.addr, master.port)
    try:
        drafter.attach([target.ring_handle()])
        batch = _micro_batch()
        ids, mask = batch.input_ids, batch.loss_mask
        ready = target.produce(0, batch)
        assert ready.shape == (2, 20, width)
        with torch.no_grad():
            out = AutoModelForCausalLM.from_pretrained(random_target_dir)(
                ids, output_hidden_states=True)
        slot = target.ring.slot(0, ready.shape)
        head = load_target_head(random_target_dir)
        torch.testing.assert_close(slot[..., -spec.hidden_size:] @ head.lm_head.t(), out.logits,
                                   rtol=1e-5, atol=1e-5)
        drafter.load(ready)
        result = drafter.forward_backward(batch)
        hf = torch.cat([out.hidden_states[i + 1] for i in spec.target_layer_ids]
                       + [out.hidden_states[-1]], -1)
        ref = DrafterTrainer(spec, options, optim, 0, head, "cpu", None, total_steps=1)
        parts = ref.forward_backward(hf, ids, mask, [5, 9], 0)
        assert result.numerator == pytest.approx(float(parts.numerator.detach()), rel=1e-5)
        assert result.denominator == float(parts.denominator)
    finally:
        drafter.close()
        target.close()
        destroy_group()
