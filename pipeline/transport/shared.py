"""Share one preallocated tensor between processes of one node, opened once by each consumer.

``export_buffer`` runs in the owner and returns a small picklable ``BufferPayload``;
``open_buffer`` runs in a consumer and returns a tensor over the *same* memory. Both device
kinds follow one recipe: the owner turns its storage into a handle plus tensor metadata, the
consumer adapts the handle to itself and calls a rebuild function. Only the two steps marked
"device-specific" differ.

CUDA: torch's own IPC reduction (``reduce_tensor``), i.e. a ``cudaIpcMemHandle`` of the whole
cudaMalloc block plus the storage's offset in it. Ray gives every actor only its own GPU, so
owner and consumer both call it "cuda:0"; the consumer rebuilds with *its own* device index so
the handle is opened in its own context and read over peer access (ray-and-ipc.md).

CPU: POSIX shared memory by name, torch's "file_system" sharing (``_share_filename_cpu_``).
torch's default "file_descriptor" sharing does not work here: the descriptor is handed over by
``multiprocessing.resource_sharer``, which authenticates with the process's ``authkey``; Ray
workers are unrelated processes with different keys, so the consumer is refused
(``AuthenticationError: digest sent was rejected``). A named segment can be opened by any
process of the node. torch's ``torch_shm_manager`` daemon tracks the segments and unlinks them
once every process using them is gone, so a crashed actor does not leak ``/dev/shm``. We call the
storage methods directly instead of switching the process-wide sharing strategy and using
``reduce_storage``, whose incref/decref pairing assumes one receiver per pickle.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from pipeline.transport.messages import DeviceKind

_DEVICE_KINDS = ("cuda", "cpu")


@dataclass(frozen=True)
class BufferPayload:
    """Everything a consumer needs to map an exported buffer: a rebuild function and its args.

    ``rebuild`` is a module-level function, so it pickles by reference; ``args`` hold only
    handles (bytes, ints) and tensor metadata, never the data.
    """

    device_kind: DeviceKind
    dtype: torch.dtype
    shape: tuple[int, ...]
    rebuild: Callable[..., torch.Tensor]
    args: tuple[Any, ...]


def export_buffer(t: torch.Tensor) -> BufferPayload:
    """Make ``t``'s memory openable by other processes of this node; call once per buffer.

    On CPU this moves ``t``'s storage into shared memory in place (views of ``t`` follow).
    """
    kind = t.device.type
    if kind not in _DEVICE_KINDS:
        raise ValueError(f"export_buffer: device {t.device} is not supported; "
                         f"expected one of {_DEVICE_KINDS}")
    if not t.is_contiguous() or t.numel() == 0:
        raise ValueError(f"export_buffer: expected a non-empty contiguous tensor, got shape "
                         f"{tuple(t.shape)} with strides {t.stride()}")
    if t.requires_grad:
        raise ValueError("export_buffer: the buffer must not require grad "
                         "(it is raw transport memory)")
    # Device-specific step 1: turn the storage into a handle.
    rebuild, args = reduce_tensor(t) if kind == "cuda" else _reduce_cpu(t)
    return BufferPayload(device_kind=kind, dtype=t.dtype, shape=tuple(t.shape), rebuild=rebuild,
                         args=tuple(args))


def open_buffer(payload: BufferPayload, device: torch.device | str) -> torch.Tensor:
    """Map the buffer described by ``payload`` into this process; keep the result and reuse it.

    Opening costs a syscall (CPU) or an IPC open of the whole block (CUDA); doing it per
    message is slow and leaks easily, so callers open once (``RingReader.attach``).
    """
    device = torch.device(device)
    if device.type != payload.device_kind:
        raise ValueError(f"open_buffer: the buffer lives on {payload.device_kind!r} "
                         f"but device={device} was asked for")
    # Device-specific step 2: adapt the handle to this process.
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        # The rebuilt storage takes the *current* device as its own, so make it the one asked for.
        with torch.cuda.device(index):
            t = payload.rebuild(*_with_device_index(payload.args, index))
    else:
        t = payload.rebuild(*payload.args)
    assert t.dtype == payload.dtype and tuple(t.shape) == payload.shape, (
        f"rebuilt buffer is {t.dtype}{tuple(t.shape)}, exported as {payload.dtype}{payload.shape}")
    return t


def _with_device_index(args: tuple[Any, ...], index: int) -> tuple[Any, ...]:
    """Return ``reduce_tensor``'s args with the storage device replaced by ``index``.

    The position is looked up by name, not hard-coded as 6, so a torch release that reorders
    ``rebuild_cuda_tensor``'s parameters fails loudly here instead of opening the wrong device.
    """
    pos = list(inspect.signature(rebuild_cuda_tensor).parameters).index("storage_device")
    assert isinstance(args[pos], int), f"expected a device index at args[{pos}], got {args[pos]!r}"
    return args[:pos] + (index,) + args[pos + 1:]


def _reduce_cpu(t: torch.Tensor) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
    """CPU counterpart of ``reduce_tensor``: a named shared-memory segment plus tensor metadata."""
    storage = t.untyped_storage()
    # Moves the bytes into a fresh named segment unless they already live in one.
    manager, name, nbytes = storage._share_filename_cpu_()
    metadata = (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
    return _rebuild_cpu, (manager, name, nbytes, *metadata)


def _rebuild_cpu(manager: bytes, name: bytes, nbytes: int, dtype: torch.dtype,
                 shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """Map the named segment (registering with the owner's shm manager) and view it as a tensor."""
    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, name, nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
