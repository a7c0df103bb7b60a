"""A drafter worker: one drafter replica that trains on slots taken from its node's targets.

The driver calls, in this order per micro-batch, ``load`` (copy a ready slot into this
worker's own buffer; the returned ack frees the slot) and ``forward_backward``; and once per
optimizer step ``step``, which sums gradients and denominators over all replicas.
"""

from __future__ import annotations

import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from pipeline.dist.fsdp import full_weights
from pipeline.dist.reduce import FlatReducer
from pipeline.dist.rendezvous import (MasterAddress, backend_for, destroy_group, init_group,
                                      pick_master)
from pipeline.checkpoint.files import load_state, out_of_memory
from pipeline.checkpoint.host_copy import HostPool
from pipeline.checkpoint.writer import (TRAINER_FILE, AsyncSaver, SaveDone,
                                        checkpoint_group)
from pipeline.model.config import DrafterConfig, DrafterSpec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.serving_format import save_drafter
from pipeline.model.target import load_target_head
from pipeline.model.target_init import target_init_of
from pipeline.objective.packing import Packing
from pipeline.training.config import OptimConfig
from pipeline.training.drafter_trainer import DrafterTrainer
from pipeline.transport.messages import RingHandle, SlotAck, SlotReady
from pipeline.transport.node import current_node_id
from pipeline.transport.ring import RingReader
from pipeline.transport.shared import release_manager_folder
from pipeline.workers.common import (StartupClock, actor_device, on_main_thread,
                                     peak_memory_bytes)
from pipeline.workers.messages import MicroBatch, MicroResult, StepResult
from pipeline.workers.weights import SnapshotRing, Weights, WeightsSnapshot, weights_of

if TYPE_CHECKING:
    from pipeline.checkpoint.read_ahead import ReadAhead

# pipeline.checkpoint.sharded (DCP, DTensor: most of a CPU-second to import) is imported where
# a checkpoint is saved, loaded or read ahead: a drafter of a job that never saves never pays.


class DrafterWorker:
    def __init__(self, *, rank: int, world_size: int, spec: DrafterSpec,
                 options: DrafterConfig, optim: OptimConfig, seed: int, target_path: str,
                 device: str, autocast_dtype: Optional[torch.dtype], feature_dtype: torch.dtype,
                 feature_numel: int, total_steps: int,
                 packing: Optional[Packing] = None, checkpoint: Optional[str] = None) -> None:
        """Keyword-only: ``autocast_dtype`` (drafter compute) and ``feature_dtype`` (what the
        target hands over) are both bfloat16 on CUDA, so a swap by position would go unseen.
        ``checkpoint``: the folder :meth:`load_checkpoint` will be given, read into host
        memory while this drafter starts (pipeline/checkpoint/read_ahead.py)."""
        clock = StartupClock()
        self.rank = rank
        self.world_size = world_size
        # The target's embedding and head come from disk beside the drafter's build, which
        # needs them only at its end: in an 8B restart on the H200 (2026-12-05) their read
        # (2.5 GB, out of the page cache once checkpoints had been written) took 4.4 s before
        # a 14.4 s build.
        with ThreadPoolExecutor(1, thread_name_prefix="target-head") as pool:
            head = pool.submit(load_target_head, target_path)
            self.device = actor_device(device)
            torch.empty(1, device=self.device)  # the CUDA context is made here, not in the build
            clock.mark("device ready")
            self.read_ahead = self._read_ahead(checkpoint, options)
            self.trainer = DrafterTrainer(spec, options, optim, seed, head.result,
                                          self.device.type, autocast_dtype, total_steps,
                                          packing, init=target_init_of(options, spec,
                                                                       target_path))
        clock.mark("drafter built")
        clock.carve("drafter built", "waited for the target head", self.trainer.head_wait_s)
        # Its own part: at 8B on an H100 (2026-12-05) it took 6.5-9.2 s of every start, nearly
        # all dynamo's import (which the first AdamW pays too) and the compile wrapper, against
        # 0.5 s for drawing the weights (measured; docs/BENCHMARKS.md).
        clock.carve("drafter built", "optimizer and compile set up", self.trainer.setup_s)
        # Rings of another node are refused: neither CUDA IPC nor shared memory crosses nodes.
        self.reader = RingReader(self.device, node_id=current_node_id())
        self.features = torch.empty(feature_numel, dtype=feature_dtype, device=self.device)
        self.loaded: Optional[SlotReady] = None
        self.reducer: Optional[FlatReducer] = None
        self.saver: Optional[AsyncSaver] = None  # with the process group (init_group)
        self.snapshots = SnapshotRing(self.device)  # the evaluator's weights (weights.py)
        clock.mark("rest")
        self.startup = clock.parts
        self.load_parts: dict[str, float] = {}

    def _read_ahead(self, checkpoint: Optional[str],
                    options: DrafterConfig) -> Optional[ReadAhead]:
        """Not under fsdp (a rank reads only its shards, known once the group is formed).
        Into pageable memory: pinning 12.6 GB in a fresh process stalls whatever runs beside
        it. Read pinned, it held the drafter's build (8B on an H100, 2026-12-06: build 5-9.5 s
        against 0.7 s); read pageable, the save buffers are pinned after the load
        (:meth:`load_checkpoint`), through the host-register allocator every actor starts
        with (pipeline.runtime.ray_start.HOST_REGISTER_CONF): with cudaHostAlloc the pinning held
        that step ~5 s, and a probe found the host-register allocator holds a GPU
        loop beside it not at all (docs/BENCHMARKS.md, 2026-12-06)."""
        if checkpoint is None or options.parallel == "fsdp":
            return None
        from pipeline.checkpoint.read_ahead import ReadAhead  # imports DCP: see the top

        return ReadAhead.start(Path(checkpoint), pin=False)

    def startup_seconds(self) -> dict[str, float]:
        """The constructor's parts (:class:`~pipeline.workers.common.StartupClock`): a start's
        or a restart's log line says where the drafter's start-up went."""
        return dict(self.startup)

    # -- set-up ---------------------------------------------------------------------------
    def master_address(self) -> MasterAddress:
        return pick_master()

    def init_group(self, addr: str, port: int, timeout_s: float = 600.0,
                   write_threads: int = 1) -> None:
        """``timeout_s`` bounds every collective (cluster.collective_timeout_s);
        ``write_threads``: the checkpoint files this rank writes at once
        (train.checkpoint.write_threads)."""
        init_group(self.rank, self.world_size, addr, port, backend_for(self.device),
                   timeout_s=timeout_s)
        if self.trainer.options.parallel == "fsdp":
            self.trainer.shard(self.device)  # it reduces over the group itself
        else:
            numel = sum(p.numel() for p in self.trainer.model.parameters())
            self.reducer = FlatReducer(numel, self.device)
        self.saver = self._saver(checkpoint_group(timeout_s), write_threads)

    def _saver(self, group, write_threads: int) -> AsyncSaver:
        """Each fsdp rank writes its shards; of replicas, rank 0 writes (the others only plan).
        The writing ranks' host buffers are pinned in the background now, so the first save
        does not pay for them inside the step loop."""
        pool = None
        if self.trainer.sharded is not None or self.rank == 0:
            # A checkpoint being read ahead is loaded first, and the pool fills after it: on
            # the host the read tensors join it; on CUDA (read pageable) it pins its own.
            pool = HostPool(self._checkpoint_specs(), pin=self.device.type == "cuda",
                            fill=self.read_ahead is None)
        return AsyncSaver(pool, group, owner=self.rank == 0, threads=write_threads)

    def attach(self, handles: Sequence[RingHandle]) -> None:
        for handle in handles:
            self.reader.attach(handle)

    # -- per micro-batch ------------------------------------------------------------------
    def load(self, ready: SlotReady) -> SlotAck:
        """Copy a ready slot into this worker's buffer; the ack means the copy completed."""
        assert self.loaded is None, "load called twice without forward_backward"
        ack = self.reader.copy_out(ready, self.features)
        self.loaded = ready
        return ack

    def forward_backward(self, batch: MicroBatch) -> MicroResult:
        ready, self.loaded = self.loaded, None
        assert ready is not None and ready.sample_ids == batch.meta.sample_ids, (
            f"drafter {self.rank}: batch {batch.meta.sample_ids} does not match the loaded slot")
        start, t0 = time.time(), time.perf_counter()
        feats = self.features[:math.prod(ready.shape)].view(ready.shape)
        parts = self.trainer.forward_backward(feats, batch.input_ids, batch.loss_mask,
                                              list(batch.meta.sample_ids), batch.meta.epoch)
        self._sync()
        return MicroResult(
            drafter=self.rank, step=batch.meta.step, epoch=batch.meta.epoch,
            sample_ids=batch.meta.sample_ids, numerator=float(parts.numerator.detach()),
            denominator=float(parts.denominator), correct=tuple(parts.correct.tolist()),
            total=tuple(parts.total.tolist()), tokens=int(batch.loss_mask.sum()), start_s=start,
            busy_s=time.perf_counter() - t0, on_main_thread=on_main_thread())

    # -- per optimizer step ---------------------------------------------------------------
    def step(self, step: int) -> StepResult:
        """The step boundary: all-reduce gradients and denominators, clip, update."""
        assert self.reducer is not None or self.trainer.sharded is not None, \
            "init_group must run before step"
        start, t0 = time.time(), time.perf_counter()
        timed = _TimedReducer(self.reducer, self._sync)
        lr = self.trainer.lr
        outcome = self.trainer.step(timed)
        self.trainer.take_totals()
        reduced = timed if self.trainer.sharded is None else self.trainer.sharded
        with torch.no_grad():
            checksum = float(sum(p.double().sum() for p in self.trainer.model.parameters()))
        return StepResult(
            drafter=self.rank, step=step, denominator=outcome.denominator,
            grad_norm=outcome.grad_norm, skipped=outcome.skipped, lr=lr,
            start_s=start, busy_s=time.perf_counter() - t0, reduce_start_s=reduced.start,
            reduce_s=reduced.seconds, max_memory_bytes=peak_memory_bytes(self.device),
            param_checksum=checksum, on_main_thread=on_main_thread(),
            cudagraph_skips=cudagraph_skips(),
            saves=self.saver.done() if self.saver is not None else ())

    # -- outputs --------------------------------------------------------------------------
    def save_checkpoint(self, folder: str) -> float:
        """Snapshot this rank's part of the state to host memory and write it into ``folder``
        in the background (pipeline/checkpoint/writer.py); every rank, at a step boundary.
        Returns the seconds this held the step loop. The finished save (its records, or its
        error) comes back from the owner in a later :class:`StepResult` or from
        :meth:`wait_saves`; only then does the checkpoint count."""
        assert self.saver is not None, "init_group must run before save_checkpoint"
        from pipeline.checkpoint import sharded  # see the top

        with sharded.shards_in_place(self.trainer.model, self.trainer.sharded is not None):
            return self.saver.start(
                lambda: sharded.drafter_state(self.trainer.model, self.trainer.optimizer),
                self.trainer.rest_state, Path(folder), self.trainer.steps_done)

    def wait_saves(self) -> tuple[SaveDone, ...]:
        """Block until no checkpoint write is in flight; the ones not yet handed back."""
        return self.saver.wait() if self.saver is not None else ()

    def load_checkpoint(self, folder: str) -> int:
        """Load a checkpoint folder as this job shards the drafter (every rank): DCP's
        ``drafter/`` and ``trainer.pt``, or a ``drafter.pt`` written before DCP. Nothing is
        unpickled beyond tensors, plain containers and DCP's index (no code runs)."""
        from pipeline.checkpoint import sharded  # see the top

        path = Path(folder)
        t0 = time.perf_counter()
        host = self.read_ahead.take(path) if self.read_ahead is not None else None
        self.read_ahead = None
        waited = time.perf_counter() - t0
        try:
            if (path / sharded.LEGACY_FILE).is_file():
                self.trainer.load_state_dict(load_state(path / sharded.LEGACY_FILE))
            else:
                with sharded.shards_in_place(self.trainer.model,
                                             self.trainer.sharded is not None):
                    sharded.load(self.trainer.model, self.trainer.optimizer, path,
                                 self.saver.group if self.saver is not None else None, host)
                self.trainer.load_rest_state(load_state(path / TRAINER_FILE))
        except (RuntimeError, MemoryError) as exc:
            if not out_of_memory(exc):
                raise
            raise MemoryError(f"drafter {self.rank}: out of {self.device.type} memory while "
                              f"loading {path} (its files checked out): {exc}") from exc
        loaded = time.perf_counter() - t0 - waited
        self.load_parts = {"waited for the read-ahead": waited,
                           "copied from host memory": loaded} if host is not None else \
            {"read from the files": loaded}
        pool = self.saver.pool if self.saver is not None else None
        if pool is not None:
            if host is not None:  # what the load left unused becomes save buffers
                pool.release([t for t in host.spare(self.trainer.optimizer)
                              if t.is_pinned() == pool.pin])
            pool.fill()
        return self.trainer.steps_done

    def load_seconds(self) -> dict[str, float]:
        """The last load's parts: from a read-ahead (waited for, then copied into place) or
        from the files; the driver's "resumed from" line says them."""
        return dict(self.load_parts)

    def _checkpoint_specs(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """The big tensors of a snapshot: each weight and AdamW's two moments of it (the
        optimizer's parameters: under fsdp this rank's shards)."""
        params = [p for g in self.trainer.optimizer.param_groups for p in g["params"]]
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        return [(tuple(p.shape), p.dtype) for p in local for _ in range(3)]

    def export(self, out_dir: str, dtype: str) -> str:
        """Under fsdp every rank gathers the weights (a collective); the owner writes."""
        if self.trainer.sharded is None:
            return str(save_drafter(self.trainer.model, Path(out_dir), dtype))
        weights = full_weights(self.trainer.model)
        if self.rank != 0:
            return ""  # the owner's folder is the group's answer
        model = DFlashDrafter.for_loading(self.trainer.spec, "cpu")
        model.load_state_dict(weights)
        return str(save_drafter(model, Path(out_dir), dtype))

    def weights(self, ring: Optional[bool] = False,
                reader_node: Optional[str] = None) -> Weights | WeightsSnapshot:
        """This replica's weights for the tau evaluator (its own actor): queued right behind
        a step, they are exactly the weights after that step. ``ring`` (train.eval.weights_ring
        as pipeline.job.config.weights_ring resolves it): True or None, left in this rank's
        snapshot ring, with None only where ``reader_node`` (the evaluator's) is this node;
        False, or where the ring does not fit, a CPU copy for the object store. Under fsdp
        every rank gathers them (a collective); rank 0 gets them, the others an empty dict."""
        if self.trainer.sharded is not None:
            return full_weights(self.trainer.model)
        here = current_node_id()
        same_node = reader_node is None or here is None or reader_node == here
        if ring is True and not same_node:
            raise ValueError(f"train.eval.weights_ring=true, but the tau evaluator runs on node "
                             f"{reader_node} and drafter rank 0 on {here}: a ring is opened on "
                             f"its own node only; set it to null or false")
        if ring is not False and same_node:
            snapshot = self.snapshots.put(self.trainer.model.state_dict())
            if snapshot is not None:
                return snapshot
        return weights_of(self.trainer.model)

    def close(self) -> None:
        """Close the opened rings and leave the process group (before the targets close); a
        save still being written is finished first (its collectives need the group)."""
        if self.saver is not None:
            self.saver.wait()
        self.reader.close()
        self.snapshots.close()
        destroy_group()
        release_manager_folder()  # the snapshot ring's, on CPU: Ray kills its shm manager

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def cudagraph_skips() -> int:
    """Inductor's count of graphs it declined to capture; 0 without reading it where dynamo
    was never imported (nothing was compiled then): the import costs about a CPU-second,
    which an uncompiled drafter would otherwise pay at its first step."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["inductor"]["cudagraph_skips"])


class _TimedReducer:
    def __init__(self, reducer: FlatReducer, sync) -> None:
        self.reducer, self.sync, self.seconds, self.start = reducer, sync, 0.0, 0.0

    def __call__(self, grads, denominator):
        self.sync()
        self.start, t0 = time.time(), time.perf_counter()
        out = self.reducer(grads, denominator)
        self.seconds = time.perf_counter() - t0
        return out
