"""SlotRing and RingReader in one process: shapes, capacity, and the producer's own checks."""

import pytest
import torch

from pipeline.transport.messages import ProduceMeta, SlotAck
from pipeline.transport.ring import RingReader, SlotRing


def _ring(rank: int = 0, num_slots: int = 3, slot_numel: int = 24) -> SlotRing:
    return SlotRing(rank, num_slots, slot_numel, torch.float32, "cpu", node_id="node-a")


def test_handle_describes_the_ring():
    handle = _ring(rank=2).handle()
    assert (handle.target_rank, handle.node_id) == (2, "node-a")
    assert (handle.num_slots, handle.slot_numel) == (3, 24)
    assert (handle.dtype, handle.device_kind) == (torch.float32, "cpu")


@pytest.mark.parametrize("shape", [(24,), (2, 12), (4, 3, 2), (1, 5, 3), (0, 7)])
def test_shapes_vary_per_message_up_to_capacity(shape):
    ring, reader = _ring(), RingReader("cpu")
    reader.attach(ring.handle())
    data = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape) + 100
    ring.slot(2, shape).copy_(data)
    meta = ProduceMeta(step=4, index=0, start_s=0.0, busy_s=0.0, on_main_thread=True)
    ready = ring.publish(2, shape, range(shape[0]), meta=meta)
    assert (ready.slot, ready.shape, ready.meta) == (2, shape, meta)
    assert torch.equal(reader.view(ready), data)
    out = torch.zeros(30)
    assert reader.copy_out(ready, out) == SlotAck(0, 2)
    assert torch.equal(out[:data.numel()].view(shape), data) and not out[data.numel():].any()


def test_slots_do_not_overlap():
    ring = _ring()
    for index in range(3):
        ring.slot(index, (24,)).fill_(index)
    assert ring.buffer.view(3, 24).eq(torch.arange(3.0).view(3, 1)).all()


def test_a_shape_over_capacity_names_the_sizes():
    message = r"shape \(2, 3, 5\) needs 30 elements, more than the slot capacity of 24"
    with pytest.raises(ValueError, match=message):
        _ring().slot(0, (2, 3, 5))


def test_publish_refuses_a_slot_it_was_not_given():
    ring = _ring()
    with pytest.raises(AssertionError, match="slot 1, which was not given"):
        ring.publish(1, (4,), [0])
    ring.slot(1, (4,))
    ring.publish(1, (4,), [0])
    with pytest.raises(AssertionError, match="not given"):  # published twice
        ring.publish(1, (4,), [0])


def test_publish_checks_the_shape_and_meta():
    ring = _ring()
    ring.slot(0, (2, 4))
    with pytest.raises(AssertionError, match=r"given for shape \(2, 4\), published as \(4, 2\)"):
        ring.publish(0, (4, 2), [0, 1])
    with pytest.raises(ValueError, match="meta must be a ProduceMeta or None, not Tensor"):
        ring.publish(0, (2, 4), [0, 1], meta=torch.zeros(1))


def test_a_slot_is_written_by_one_writer_at_a_time():
    ring = _ring()
    ring.slot(0, (4,))
    with pytest.raises(AssertionError, match="slot 0 is already being written"):
        ring.slot(0, (4,))


def test_copy_out_checks_the_destination():
    ring, reader = _ring(), RingReader("cpu")
    reader.attach(ring.handle())
    ring.slot(0, (2, 6))
    ready = ring.publish(0, (2, 6), [0, 1])
    with pytest.raises(ValueError, match=r"out holds 11 elements, slot shape \(2, 6\) needs 12"):
        reader.copy_out(ready, torch.zeros(11))
    with pytest.raises(ValueError, match="contiguous torch.float32"):
        reader.copy_out(ready, torch.zeros(12, dtype=torch.float64))


def test_attach_is_once_per_ring():
    ring, reader = _ring(rank=0), RingReader("cpu")
    reader.attach(ring.handle())
    opened = reader._rings[0][1]
    reader.attach(ring.handle())  # no-op: the same ring is not opened twice
    assert reader._rings[0][1] is opened
    ring.slot(0, (3,)).fill_(7.0)
    assert reader.view(ring.publish(0, (3,), [0])).eq(7.0).all()


def test_reader_refuses_unknown_rings_and_other_devices():
    ring, reader = _ring(rank=5), RingReader("cpu")
    ring.slot(0, (1,))
    with pytest.raises(ValueError, match=r"ring of target 5 is not attached \(attached: \[\]\)"):
        reader.view(ring.publish(0, (1,), [0]))
    with pytest.raises(ValueError, match="lives on 'cpu'"):
        RingReader("cuda").attach(ring.handle())


def test_reader_refuses_a_ring_of_another_node():
    ring = SlotRing(3, 2, 4, torch.float32, "cpu", node_id="node-a")
    with pytest.raises(ValueError, match="ring of target 3 lives on node node-a, this reader "
                                         "runs on node node-b: slot rings cannot be opened "
                                         "across nodes"):
        RingReader("cpu", node_id="node-b").attach(ring.handle())
    RingReader("cpu", node_id="node-a").attach(ring.handle())  # its own node
    RingReader("cpu").attach(ring.handle())  # outside Ray no node is known: nothing to check


@pytest.mark.parametrize("num_slots, slot_numel", [(0, 4), (2, 0)])
def test_ring_size_must_be_positive(num_slots, slot_numel):
    with pytest.raises(ValueError, match="expected >= 1"):
        SlotRing(0, num_slots, slot_numel, torch.float32, "cpu")


def test_a_new_ring_of_the_same_target_replaces_the_old_one():
    """A restarted target makes a new ring: a reader must read the new memory, never the
    dead producer's; the same handle attached again changes nothing."""
    old, new = _ring(rank=0), _ring(rank=0)
    reader = RingReader("cpu")
    reader.attach(old.handle())
    old.slot(0, (24,)).fill_(1.0)
    ready = old.publish(0, (24,), [0])
    assert reader.view(ready).eq(1.0).all()
    new.slot(0, (24,)).fill_(2.0)
    ready = new.publish(0, (24,), [0])
    reader.attach(new.handle())
    assert reader.view(ready).eq(2.0).all()
    reader.attach(new.handle())
    assert reader.view(ready).eq(2.0).all()
    assert old.handle().ring_id != new.handle().ring_id
