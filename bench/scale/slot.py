"""The slot copy: a drafter process copying ready slots out of a target process's ring.

The producer owns a SlotRing (one CUDA IPC handle for all slots); the consumer opens it once
and copies each slot into its own buffer with RingReader.copy_out, which includes the stream
synchronisation before the ack. The raw figure copies the same bytes between two buffers of
the consumer in the same way. Both processes share the GPU here (co-located); with two GPUs
the consumer sits on the other one.
"""

from __future__ import annotations

import time

import torch
import torch.multiprocessing as mp

from pipeline.transport.ring import RingReader, SlotRing

FEATURES = 5 * 4096
SLOTS = 4


def _producer(handles, stop, shape, device_index):
    torch.cuda.set_device(device_index)
    numel = shape[0] * shape[1] * shape[2]
    ring = SlotRing(0, SLOTS, numel, torch.bfloat16, "cuda")
    readies = []
    for i in range(SLOTS):
        ring.slot(i, shape).normal_()
        readies.append(ring.publish(i, shape, list(range(shape[0]))))
    handles.put((ring.handle(), readies))
    stop.get()
    ring.close()


def run_slot_copy(n: int, seq_len: int, repeats: int = 50) -> dict:
    ctx = mp.get_context("spawn")
    handles, stop = ctx.Queue(), ctx.Queue()
    shape = (n, seq_len, FEATURES)
    consumer_gpu = 1 if torch.cuda.device_count() > 1 else 0
    proc = ctx.Process(target=_producer, args=(handles, stop, shape, 0))
    proc.start()
    try:
        handle, readies = handles.get(timeout=300)
        torch.cuda.set_device(consumer_gpu)
        reader = RingReader(torch.device("cuda", consumer_gpu))
        reader.attach(handle)
        out = torch.empty(n * seq_len * FEATURES, dtype=torch.bfloat16, device="cuda")
        src = torch.empty_like(out).normal_()
        nbytes = out.numel() * out.element_size()

        def timed(fn) -> float:
            for i in range(3):
                fn(i)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(repeats):
                fn(i)
            torch.cuda.synchronize()
            return nbytes * repeats / (time.perf_counter() - t0) / 1e9

        ring_gbps = timed(lambda i: reader.copy_out(readies[i % SLOTS], out))

        def raw(_i):
            out.copy_(src)
            torch.cuda.current_stream().synchronize()  # as copy_out does before its ack

        raw_gbps = timed(raw)
        reader.close()
    finally:
        stop.put(None)
        proc.join(timeout=60)
    return {"bytes_per_slot": nbytes, "slot_copy_gbps": ring_gbps, "raw_copy_gbps": raw_gbps,
            "same_gpu": consumer_gpu == 0}
