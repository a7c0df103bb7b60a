"""Ray start-up, and the one place ``ray.remote`` is applied.

The driver and regeneration both start here, so it sits below both. Placement (CPUs, GPUs, a
placement-group bundle) is kept apart from construction: :func:`start_actor` takes a
:class:`Placement` and passes the worker's own arguments by keyword only.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import pipeline
from pipeline.runtime import actor_pool, kept_actor, startup_gc

# Environment every actor must see: our package on the path, and the GPU machine's NCCL
# safety settings (NVLink multicast off) also where Ray starts workers with a fresh env.
_PASS_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
             "NCCL_DEBUG", "WANDB_MODE", "HF_HUB_DISABLE_PROGRESS_BARS")


# Compiled graphs and kernels are cached on disk and reused by every later process: a
# restarted drafter or a resumed job skips Inductor's code generation and Triton's autotuning
# (minutes at the 8B shape). The folder outlives /tmp cleaners and reboots; set
# TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR to put it elsewhere (e.g. a node-local disk).
_COMPILE_CACHE = Path("~/.cache/dflash-pipeline/torch-compile").expanduser()
_CACHE_ENV = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


# Pinned host memory (a drafter's checkpoint buffers: 12.6 GB at the 8B recipe) through torch's
# host-register allocator: each tensor's pages are written on 8 threads outside any driver
# call, then registered, so the process's GPU work goes on meanwhile. The default
# (cudaHostAlloc) held every other CUDA call of the process for as long as it took: 5.1 s for
# 12.6 GB against 1.9 s with a GPU loop stepping on (measured on an H200; docs/BENCHMARKS.md, "Findings of probes no longer in the tree").
HOST_REGISTER_CONF = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"


def alloc_conf_env() -> dict[str, str]:
    """The allocator settings every actor starts with: the caller's own (both names torch
    reads), with :data:`HOST_REGISTER_CONF` added to ``PYTORCH_CUDA_ALLOC_CONF`` unless the
    caller chose a pinned-memory setting there already."""
    env = {k: os.environ[k] for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
           if k in os.environ}
    own = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "pinned_" not in own:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(p for p in (own, HOST_REGISTER_CONF) if p)
    return env


# A new local cluster starts no idle Python workers ahead of use: Ray prestarts one per CPU,
# however few actors come, each a Python start-up (about a CPU-second).
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


def compile_cache_env() -> dict[str, str]:
    """Where every actor keeps its compile caches (the caller's own settings win)."""
    env = dict(_CACHE_ENV)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(_COMPILE_CACHE / "inductor")
    env["TRITON_CACHE_DIR"] = str(_COMPILE_CACHE / "triton")
    env.update({k: os.environ[k] for k in (*env, "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
                if k in os.environ})
    return env


def actor_env() -> dict[str, str]:
    root = str(Path(pipeline.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    # Ray forwards an actor's output line by line, so a progress bar (transformers' "Loading
    # weights" on every target and evaluator load) reaches the user as a garbled line of
    # carriage returns. Set it to 0 to see the bars.
    env = {"PYTHONPATH": path, "HF_HUB_DISABLE_PROGRESS_BARS": "1", **compile_cache_env(),
           **alloc_conf_env(), startup_gc.ENV_VAR: "1"}
    env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
    return env


def init_ray(address: Optional[str], cpus_needed: float) -> bool:
    """Join ``address`` (or $RAY_ADDRESS), else (or when it is "local") start a private local
    cluster.

    A local cluster gets logical CPUs enough for every actor, even on a 2-core laptop.
    Returns True when this call initialised Ray (the caller may shut it down).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        ray.init(address=address)
    else:
        # A cluster of our own, also for "local" (what the quality bench's subprocesses set):
        # through init_local, so its actors start without a runtime_env. Without it
        # ray.init() joins any Ray it finds running on the machine (another user's, another
        # test's).
        _private_cluster_auth()
        init_local(num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)),
                   include_dashboard=False, _system_config=LOCAL_SYSTEM_CONFIG)
    return True


# The local cluster this process started with actor_env() in its processes' environment
# (init_local): (its GCS address, that environment). Its workers inherit the environment, so
# an actor started there needs no runtime_env, which would cost each actor process a second
# Python start-up (Ray's setup_worker, about half a CPU-second) to set the same variables.
_inherited: Optional[tuple[str, dict[str, str]]] = None


def init_local(**kwargs: Any) -> None:
    """``ray.init(address="local", **kwargs)``: a new local cluster whose raylet, and so every
    worker it starts, gets actor_env() from its environment (this process's own environment
    is left as it was)."""
    global _inherited
    env = actor_env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ray.init(address="local", **kwargs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    _inherited = (ray.get_runtime_context().gcs_address, env)


def _runtime_env() -> Optional[dict[str, Any]]:
    """What an actor is started with: nothing where its worker inherits actor_env() already
    (a cluster init_local started, the environment unchanged since), else the variables."""
    env = actor_env()
    if _inherited is not None and _inherited[1] == env \
            and ray.get_runtime_context().gcs_address == _inherited[0]:
        return None
    return {"env_vars": env}


def _private_cluster_auth() -> None:
    """Token authentication for the local cluster we start, chosen explicitly.

    Ray (2.5x) turns it on by default for a new local cluster, and then warns that it did, a
    line the user can do nothing about. Choosing it ourselves the way Ray does (the
    environment variable, which the raylet and workers inherit, and this process's config
    read again) starts the same cluster without the warning. A RAY_AUTH_MODE the user set is
    kept; a Ray without token authentication is left as it is.
    """
    try:
        from ray._private.authentication import authentication_token_setup as auth
    except ImportError:
        return
    if auth.AUTH_MODE_ENV_VAR in os.environ or not hasattr(auth, "enable_token_auth_by_default"):
        return
    auth._enable_token_auth()


@contextlib.contextmanager
def ray_session(address: Optional[str], cpus_needed: float) -> Iterator[None]:
    """Ray for the length of a ``with`` block; shut down after only if this block started it."""
    started = init_ray(address, cpus_needed)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class Placement:
    """Where an actor runs and what Ray reserves for it; nothing about what it computes."""

    cpus: float
    gpus: float = 0.0          # 0 on CPU; a fraction shares a GPU between actors
    group: Any = None          # a PlacementGroup, or None: anywhere with room
    bundle: int = -1           # the bundle of ``group`` to run in


def start_actor(cls: type, placement: Placement, **kwargs: Any) -> Any:
    """``cls`` as a plain Ray actor, built from keyword arguments only.

    No concurrency options: the actor runs its methods one at a time on its main thread,
    where torch.compile's CUDA-graph state lives.
    """
    pool = actor_pool.live()
    runtime_env = _runtime_env()
    key = actor_pool.Key(cls, placement.group.id.hex() if placement.group is not None else None,
                         placement.bundle, placement.cpus, placement.gpus,
                         json.dumps(runtime_env, sort_keys=True))
    handle = actor_pool.take_idle(pool, key) if pool is not None else None
    if handle is not None:
        try:
            # Waited for: a constructor that fails here is run again in a new actor below,
            # where it fails as any actor's does (the caller's error handling unchanged).
            ray.get(handle.__rebuild__.remote(**kwargs))
            actor_pool.born(pool, handle, key)
            return handle
        except Exception:
            ray.kill(handle)
    if pool is not None and placement.group is not None:
        actor_pool.clear_bundle(pool, key)
    options: dict[str, Any] = {"num_cpus": placement.cpus}
    if runtime_env is not None:
        options["runtime_env"] = runtime_env
    if placement.gpus > 0:
        options["num_gpus"] = placement.gpus
    if placement.group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement.group, placement_group_bundle_index=placement.bundle)
    if pool is not None:
        kwargs["_kept"] = True
    handle = ray.remote(_actor_class(cls)).options(**options).remote(**kwargs)
    if pool is not None:
        actor_pool.born(pool, handle, key)
    return handle


@functools.cache
def _actor_class(cls: type) -> type:
    """``cls`` with one thing done first in the actor's process, :func:`exit_on_swallowed_sigterm`
    as its ``sys.unraisablehook``, and one after its constructor: full garbage collections,
    deferred while the actor imported and built (:mod:`pipeline.runtime.startup_gc`), come back. The
    subclass keeps ``cls``'s name (Ray's ``ray::<name>`` process title) and pickles by value,
    so workers need nothing new to import it."""

    def __init__(self: Any, _kept: bool = False, **kwargs: Any) -> None:
        sys.unraisablehook = exit_on_swallowed_sigterm
        if _kept:
            kept_actor.mark()
        cls.__init__(self, **kwargs)
        startup_gc.started()

    def __rebuild__(self: Any, **kwargs: Any) -> None:
        """The same process as a new actor of ``cls`` (a kept actor,
        :func:`pipeline.runtime.actor_pool.keep_actors`): the old object's state dropped, the
        constructor run again."""
        self.__dict__.clear()
        gc.collect()
        cls.__init__(self, **kwargs)

    actor = type(cls.__name__, (cls,), {"__init__": __init__, "__rebuild__": __rebuild__,
                                        "__doc__": cls.__doc__, "__module__": cls.__module__})
    actor.__qualname__ = cls.__qualname__
    return actor


def exit_on_swallowed_sigterm(unraisable: Any) -> None:
    """An actor's ``sys.unraisablehook``. Ray's SIGTERM handler in a worker raises SystemExit
    (a stopped job's ``ray.shutdown`` sends it to actors still closing). When the signal lands
    while a weakref callback or finalizer runs, Python cannot raise there: it prints "Exception
    ignored ... Traceback" into the job's output and the actor lives on until Ray's SIGKILL.
    Here the actor exits as the handler meant, without the traceback; anything else goes to
    the hook that was there before."""
    if isinstance(unraisable.exc_value, SystemExit):
        code = unraisable.exc_value.code
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # the signal may have come inside a write to it
                pass
        os._exit(code if isinstance(code, int) else 1)
    _unraisablehook_before(unraisable)


_unraisablehook_before = sys.unraisablehook


def run_task(fn: Callable[..., Any], *args: Any) -> Any:
    """ObjectRef of ``fn(*args)``, run as a Ray task that takes no CPU: a small join of
    results (refs among ``args`` are resolved first; a failed one fails the task)."""
    runtime_env = _runtime_env()
    task = _as_task(fn)
    return (task.options(num_cpus=0) if runtime_env is None else
            task.options(num_cpus=0, runtime_env=runtime_env)).remote(*args)


@functools.cache
def _as_task(fn: Callable[..., Any]) -> Any:
    return ray.remote(fn)


def kill_actors(handles: list[Any]) -> None:
    """Kill ``handles`` now; none of them is kept for a next job."""
    actor_pool.forget(handles)
    for handle in handles:
        ray.kill(handle)
