"""Pad mode with drafter.static_shapes: an epoch's last, smaller micro-batch is padded with
empty rows to micro_batch_size, so no micro-batch is a new shape to compile. An empty row must
change nothing: the target's and the drafter's attention stay free of NaN, the row adds
exactly zero to the loss numerator, denominator and gradients, and it is no sample."""

import torch

from pipeline.data.batching import BatchShapes, collate
from pipeline.data.config import DataConfig
from pipeline.data.dataset import Sample
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.target import load_target, load_target_head
from pipeline.training.config import OptimConfig
from pipeline.training.drafter_trainer import DrafterTrainer

MAX_LEN, PAD = 24, 0


def _samples(n: int) -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        length = 12 + (5 * i) % 12
        ids = torch.randint(1, 90, (length,), generator=g)
        mask = torch.zeros(length, dtype=torch.long)
        mask[length // 3:] = 1  # a prompt, then a supervised answer
        out.append(Sample(100 + i, ids, mask))
    return out


def test_every_static_pad_micro_batch_of_an_epoch_has_one_shape():
    samples = _samples(7)
    data = DataConfig(max_length=MAX_LEN, micro_batch_size=3)
    shapes = BatchShapes.from_config(data, static_shapes=True, num_anchors=6)
    by_id = {s.sample_id: s for s in samples}
    mbs = shapes.micro_batches([s.sample_id for s in samples], {}, 0, 0)
    assert [len(mb) for mb in mbs] == [3, 3, 1]  # the epoch's tail: one sample...
    batches = [shapes.collate([by_id[i] for i in mb], PAD) for mb in mbs]
    assert {tuple(b.input_ids.shape) for b in batches} == {(3, MAX_LEN)}  # ...in the one shape
    tail = batches[-1]
    assert tail.sample_ids == [mbs[-1][0]]  # padding rows are not samples
    assert tail.lengths.tolist()[1:] == [0, 0] and not tail.loss_mask[1:].any()
    assert (tail.input_ids[1:] == PAD).all()
    # Without static shapes the tail keeps its own size (nothing is compiled for it).
    dynamic = BatchShapes.from_config(data, static_shapes=False, num_anchors=6)
    assert dynamic.collate([by_id[i] for i in mbs[-1]], PAD).input_ids.shape[0] == 1


def _trainer(target_dir, target_config, static: bool) -> DrafterTrainer:
    options = DrafterConfig(num_layers=2, block_size=4, num_taps=3, mask_token_id=95,
                            num_anchors=6, loss_chunk_size=7, static_shapes=static)
    return DrafterTrainer(build_drafter_spec(target_config, options), options, OptimConfig(),
                          0, load_target_head(target_dir), "cpu", None, total_steps=4)


def test_an_empty_row_adds_nothing_to_loss_gradients_or_samples(random_target_dir,
                                                                target_config):
    samples = _samples(2)
    ids = [s.sample_id for s in samples]
    for static in (True, False):
        plain = _trainer(random_target_dir, target_config, static)
        padded = _trainer(random_target_dir, target_config, static)
        spec = plain.spec
        target = load_target(random_target_dir, spec.target_layer_ids, "cpu", torch.float32)
        hidden = []
        padded.model.register_forward_hook(lambda m, args, out: hidden.append(out))
        results = []
        for trainer, rows in ((plain, None), (padded, 4)):
            batch = collate(samples, PAD, MAX_LEN, rows)
            with torch.no_grad():
                features = target(batch.input_ids)
            assert torch.isfinite(features).all()  # the target's attention over an empty row
            if rows:
                assert features.shape[0] == 4
            parts = trainer.forward_backward(features, batch.input_ids, batch.loss_mask, ids, 0)
            results.append((parts, features, trainer.take_totals()))
        (p0, f0, t0), (p1, f1, t1) = results
        assert torch.isfinite(hidden[0]).all()  # the drafter's attention, empty rows included
        torch.testing.assert_close(f1[:2], f0)  # a row never sees another
        assert float(p1.denominator) == float(p0.denominator) > 0
        torch.testing.assert_close(p1.numerator.detach(), p0.numerator.detach())
        for a, b in zip(plain.model.parameters(), padded.model.parameters()):
            torch.testing.assert_close(b.grad, a.grad)
        assert t1.samples == t0.samples == 2  # padding rows are no samples
