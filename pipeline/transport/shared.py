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

The manager is a child process of the first process that exports, listening on a socket in a
folder of its own (``/tmp/torch-shm-dir-*``), which it removes when it exits once every client
is gone. Ray kills an actor's children with SIGKILL when the actor exits, so the manager of a
Ray actor never gets there and its folder stays behind, one per actor and run. A ring owner in
a Ray actor therefore removes its own manager's folder (the ``torch_shm_manager`` child of this
process listening on the handle, never one a forked parent started or another process's) at
the end of its life (``release_manager_folder``, from the workers' ``close``), once every
buffer it exported is closed: nothing opens it after that, and the connected clients keep
working. Not on closing a ring: a process that later shares a new one goes on through the same
manager, whose socket must still be there. Outside an actor the manager is left to clean up after itself (removing its
folder under it would make it fail at exit).
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from pipeline.runtime import kept_actor
from pipeline.transport.messages import DeviceKind

_DEVICE_KINDS = ("cuda", "cpu")
_MANAGER_PREFIX = "torch-shm-dir-"
# How long a manager folder may be without its socket: the manager is starting.
_STARTING_S = 60.0
# This process's exported CPU buffers not yet closed, and its own manager's folder (with the
# pid that found it: a forked child inherits this module's state, never the parent's manager).
_open_exports = 0
_own_manager: Optional[tuple[int, str]] = None
log = logging.getLogger(__name__)


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
    _remember_manager_folder(manager)
    global _open_exports
    _open_exports += 1
    metadata = (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
    return _rebuild_cpu, (manager, name, nbytes, *metadata)


def _rebuild_cpu(manager: bytes, name: bytes, nbytes: int, dtype: torch.dtype,
                 shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """Map the named segment (registering with the owner's shm manager) and view it as a tensor."""
    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, name, nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def close_export(payload: BufferPayload) -> None:
    """Note that the owner dropped a buffer ``export_buffer`` gave ``payload`` for."""
    global _open_exports
    if payload.device_kind == "cpu":
        _open_exports = max(0, _open_exports - 1)


def release_manager_folder() -> Optional[str]:
    """At the end of a Ray actor that shared CPU buffers: remove its manager's folder once
    every buffer it exported is closed (see the module's docstring); the folder removed, or
    None (buffers still open, not in an actor, or no manager of its own)."""
    if _open_exports == 0 and _in_ray_actor() and not kept_actor.kept():
        return remove_own_manager_folder()
    return None


def remove_own_manager_folder() -> Optional[str]:
    """Remove the socket folder of this process's torch_shm_manager, if it started one; the
    folder removed, or None. Only for a process whose manager is killed with it: a manager
    that exits on its own removes the folder itself, and fails when it is gone."""
    global _own_manager
    if _own_manager is None or _own_manager[0] != os.getpid():
        return None
    folder, _own_manager = _own_manager[1], None
    try:
        os.unlink(os.path.join(folder, "manager.sock"))
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError as e:  # e.g. a file someone else put there: leave the folder
        log.warning("shm manager folder %s not removed: %s", folder, e)
        return None
    return folder


def _in_ray_actor() -> bool:
    import ray  # only asked on close; the transport otherwise runs without Ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _remember_manager_folder(handle: bytes) -> None:
    """Note ``handle``'s folder when this process's own manager listens on it."""
    global _own_manager
    if _own_manager is not None and _own_manager[0] == os.getpid():
        return
    folder = _own_manager_folder(handle.decode())
    if folder is not None:
        _own_manager = (os.getpid(), folder)


def remove_dead_manager_folders(tmp: Optional[str] = None) -> list[str]:
    """Remove this user's manager folders under ``tmp`` (the temp dir) whose manager is gone:
    no socket bound at ``manager.sock`` (/proc/net/unix lists every bound one), so no process
    can use the folder again. A killed actor leaves one behind (its manager is killed with it,
    before its ``close``); the driver sweeps them when it closes its actors. A folder
    without a socket yet is a manager starting, left alone for a minute. Linux only (/proc);
    elsewhere nothing is removed. Returns the folders removed."""
    root = tmp or tempfile.gettempdir()
    # The folders and their sockets first, the bound sockets after: bind() makes the socket's
    # file, so a socket seen here and alive is in the list read next. Read the other way
    # round, a manager that binds in between (another test worker's, starting) looks dead.
    candidates = []
    try:
        for name in os.listdir(root):
            if not name.startswith(_MANAGER_PREFIX):
                continue
            folder = os.path.join(root, name)
            sock = os.path.join(folder, "manager.sock")
            try:
                st = os.lstat(folder)
            except OSError:
                continue
            has_sock = os.path.lexists(sock)
            if st.st_uid == os.getuid() and \
                    (has_sock or time.time() - st.st_mtime >= _STARTING_S):
                candidates.append((folder, sock, has_sock))
        bound = {path for _, path in _unix_sockets()}
    except OSError:
        return []
    removed = []
    for folder, sock, has_sock in candidates:
        if sock in bound:
            continue
        try:
            if has_sock:
                os.unlink(sock)
            os.rmdir(folder)  # anything else in it: not a manager's folder, left alone
        except OSError:
            continue
        removed.append(folder)
    return removed


def _own_manager_folder(socket_path: str) -> Optional[str]:
    """The folder of ``socket_path`` when a torch_shm_manager child of this process listens
    on it; None otherwise (a manager that a forked parent started, or another process's).
    Linux only (/proc); elsewhere nothing is removed."""
    folder = os.path.dirname(socket_path)
    if not os.path.basename(folder).startswith(_MANAGER_PREFIX):
        return None
    try:
        inodes = _socket_inodes(socket_path)
        for pid in _child_managers():
            if inodes & _socket_fd_inodes(pid):
                return folder
    except OSError:  # no /proc, or the manager is gone already
        return None
    return None


def _socket_inodes(socket_path: str) -> set[str]:
    return {inode for inode, path in _unix_sockets() if path == socket_path}


def _unix_sockets() -> list[tuple[str, str]]:
    """(inode, path) of every bound Unix socket of this network namespace (/proc/net/unix)."""
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [(row[6], row[7]) for row in rows if len(row) > 7]


def _child_managers() -> list[int]:
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        # The kernel keeps a command's first 15 characters ("torch_shm_manag").
        if comm == "torch_shm_manager"[:15] and int(rest.split()[1]) == me:
            found.append(int(entry))
    return found


def _socket_fd_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    return inodes
