"""export_buffer/open_buffer: one buffer, mapped by an unrelated process, no data in the payload."""

import os
import pickle
import subprocess
import sys
import time

import pytest
import ray
import torch

from pipeline.transport.shared import (BufferPayload, export_buffer, open_buffer,
                                       release_manager_folder, remove_dead_manager_folders)

NUMEL = 1 << 20  # 4 MiB of float32: far larger than any payload may be


class BufferOwner:
    """Allocates and exports a buffer, then writes into it and reads it back."""

    def __init__(self, device: str) -> None:
        self.buffer = torch.zeros(NUMEL, device=device)

    def export(self) -> BufferPayload:
        return export_buffer(self.buffer)

    def fill(self, value: float) -> None:
        self.buffer.fill_(value)
        if self.buffer.is_cuda:
            torch.cuda.synchronize()

    def values(self) -> tuple[float, float]:
        return self.buffer.min().item(), self.buffer.max().item()

    def close(self) -> None:
        del self.buffer


class BufferUser(BufferOwner):
    """Maps another actor's buffer instead of allocating one."""

    def __init__(self, device: str) -> None:
        self.device = device

    def open(self, payload: BufferPayload) -> str:
        self.buffer = open_buffer(payload, self.device)
        return str(self.buffer.device)


def _check_shared_between_actors(device: str, options: dict) -> None:
    owner = ray.remote(BufferOwner).options(**options).remote(device)
    user = ray.remote(BufferUser).options(**options).remote(device)
    try:
        payload = ray.get(owner.export.remote())
        assert len(pickle.dumps(payload)) < 4096  # handles only: the 4 MiB stayed behind
        assert ray.get(user.open.remote(payload)).startswith(device)
        ray.get(owner.fill.remote(3.0))
        assert ray.get(user.values.remote()) == (3.0, 3.0)  # the owner's write is seen...
        ray.get(user.fill.remote(-1.5))
        assert ray.get(owner.values.remote()) == (-1.5, -1.5)  # ...and so is the user's
        ray.get([owner.close.remote(), user.close.remote()])
        if device == "cpu":  # the segment is unlinked once both have closed it
            assert not os.path.exists("/dev/shm" + payload.args[1].decode())
    finally:
        ray.kill(owner)
        ray.kill(user)


def test_cpu_buffer_is_shared_between_ray_actors(ray_session):
    _check_shared_between_actors("cpu", {})


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_cuda_buffer_is_shared_between_actors_on_two_gpus(gpus_free):
    _check_shared_between_actors("cuda", {"num_gpus": 1})


def test_open_in_the_same_process_maps_the_same_memory():
    t = torch.zeros(8)
    view = open_buffer(export_buffer(t), "cpu")
    t[3] = 5.0
    assert view[3].item() == 5.0


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(4, 6).t(),  # not contiguous
    lambda: torch.zeros(0),
    lambda: torch.zeros(4, requires_grad=True),
    lambda: torch.zeros(4, device="meta"),
], ids=["strided", "empty", "requires-grad", "meta"])
def test_export_refuses_what_it_cannot_share(make):
    with pytest.raises(ValueError, match="export_buffer"):
        export_buffer(make())


def test_open_on_another_device_kind_is_refused():
    with pytest.raises(ValueError, match="lives on 'cpu'"):
        open_buffer(export_buffer(torch.zeros(4)), "cuda")


class RingOwner:
    """Owns a CPU slot ring in its own process, as a target actor does."""

    def __init__(self) -> None:
        from pipeline.transport.ring import SlotRing

        self.ring = SlotRing(0, 2, 8, torch.float32, "cpu")

    def payload(self) -> BufferPayload:
        return self.ring.handle().payload

    def close(self) -> None:  # as TargetWorker.close
        self.ring.close()
        release_manager_folder()

    def reopen(self) -> BufferPayload:
        """A new ring after the first one closed, as the scheduler tests' fake target does."""
        from pipeline.transport.ring import SlotRing

        self.ring.close()
        self.ring = SlotRing(0, 2, 8, torch.float32, "cpu")
        return self.payload()


def test_a_ray_ring_owner_leaves_no_shm_manager_folder(ray_session):
    """Ray kills an actor's torch_shm_manager with it, before the manager can remove its
    /tmp/torch-shm-dir-* folder: the owner removes it at its close, and a reader that
    opened the ring before keeps its mapping. Closing one ring and sharing the next keeps the
    folder: the new ring goes through the same manager."""
    owner = ray.remote(RingOwner).remote()
    reader = ray.remote(BufferUser).remote("cpu")
    try:
        payload = ray.get(owner.payload.remote())
        folder = os.path.dirname(payload.args[0].decode())  # the manager's socket's folder
        assert os.path.basename(folder).startswith("torch-shm-dir-") and os.path.isdir(folder)
        again = ray.get(owner.reopen.remote())
        assert os.path.isdir(folder)
        ray.get(reader.open.remote(again))  # through the same manager's socket
        ray.get(owner.close.remote())
        assert not os.path.exists(folder)
        ray.get(reader.fill.remote(2.5))  # the reader's mapping outlives the folder
        assert ray.get(reader.values.remote()) == (2.5, 2.5)
    finally:
        ray.kill(owner)
        ray.kill(reader)
    time.sleep(2)  # Ray kills the manager after the actor: nothing brings the folder back
    assert not os.path.exists(folder)


_CHILD = """
import os, sys, torch
from pipeline.transport import shared
payload = shared.export_buffer(torch.zeros(4))
folder = os.path.dirname(payload.args[0].decode())
pid = os.fork()
if pid == 0:  # a forked child shares through its parent's manager: never its folder to remove
    shared.export_buffer(torch.zeros(4))
    os._exit(0 if shared.remove_own_manager_folder() is None and os.path.isdir(folder) else 1)
assert os.waitpid(pid, 0)[1] == 0
assert shared.remove_own_manager_folder() == folder and not os.path.exists(folder)
assert shared.remove_own_manager_folder() is None  # once
print("ok")
"""


@pytest.mark.slow
def test_only_this_process_s_own_manager_folder_is_removed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_dead_managers_folders_are_swept_and_live_or_starting_ones_kept(tmp_path):
    """A folder goes when nothing is bound at its socket (its manager was killed); one whose
    socket is bound, or that has no socket yet (a manager starting), stays."""
    import socket

    def folder(name, age_s=0.0):
        path = tmp_path / f"torch-shm-dir-{name}"
        path.mkdir()
        if age_s:
            os.utime(path, (time.time() - age_s,) * 2)
        return path

    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(folder("dead") / "manager.sock"))
    dead.close()  # the file stays, nothing is bound at it: a killed manager's
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(folder("live") / "manager.sock"))
    live.listen()
    starting, abandoned = folder("starting"), folder("abandoned", age_s=300)
    other = folder("other", age_s=300)
    (other / "notes.txt").write_text("not a manager's")
    try:
        removed = remove_dead_manager_folders(str(tmp_path))
    finally:
        live.close()
    assert sorted(os.path.basename(p) for p in removed) == \
        ["torch-shm-dir-abandoned", "torch-shm-dir-dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["torch-shm-dir-live", "torch-shm-dir-other", "torch-shm-dir-starting"]


def test_a_manager_binding_during_the_sweep_is_not_taken_for_dead(tmp_path, monkeypatch):
    """A manager (another test worker's) starts while the sweep runs: its socket is bound just
    after the sweep read the bound sockets. Its folder must stay."""
    import socket

    from pipeline.transport import shared

    live = socket.socket(socket.AF_UNIX)
    read = shared._unix_sockets

    def bound_then_a_manager_starts():
        found = read()
        path = tmp_path / "torch-shm-dir-new"
        path.mkdir()
        live.bind(str(path / "manager.sock"))
        live.listen()
        return found

    monkeypatch.setattr(shared, "_unix_sockets", bound_then_a_manager_starts)
    try:
        assert remove_dead_manager_folders(str(tmp_path)) == []
        assert (tmp_path / "torch-shm-dir-new" / "manager.sock").exists()
    finally:
        live.close()
