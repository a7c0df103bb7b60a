"""Every actor gets persistent compile caches and pins host memory through the host-register
allocator, and the user's own settings win; an actor sees actor_env() whether its worker
inherited it or got it as a runtime_env."""

from pathlib import Path

import pytest

from pipeline.runtime.ray_start import HOST_REGISTER_CONF, actor_env


def test_actors_share_a_persistent_compile_cache(monkeypatch):
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE"):
        monkeypatch.delenv(key, raising=False)
    env = actor_env()
    # Under the user's home (which outlives /tmp cleaners and reboots), wherever that is: not
    # torch's default in the temporary directory.
    cache = Path.home() / ".cache" / "dflash-pipeline" / "torch-compile"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(cache / "triton")
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/fast/disk/inductor")
    assert actor_env()["TORCHINDUCTOR_CACHE_DIR"] == "/fast/disk/inductor"


def test_actors_show_no_progress_bars_unless_asked(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert actor_env()["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert actor_env()["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_actors_pin_through_host_register_added_to_the_users_allocator_settings(monkeypatch):
    for key in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(key, raising=False)
    assert actor_env()["PYTORCH_CUDA_ALLOC_CONF"] == HOST_REGISTER_CONF
    assert "PYTORCH_ALLOC_CONF" not in actor_env()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert actor_env()["PYTORCH_CUDA_ALLOC_CONF"] == \
        f"expandable_segments:True,{HOST_REGISTER_CONF}"
    # A pinned-memory setting of the user's own is theirs to keep.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "pinned_use_cuda_host_register:False")
    assert actor_env()["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_use_cuda_host_register:False"
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert actor_env()["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


class _Env:
    def get(self, keys):
        import os
        return {k: os.environ.get(k) for k in keys}

    def unraisablehook(self):
        import sys
        return sys.unraisablehook.__qualname__, type(self).__name__


def test_actors_see_actor_env_with_or_without_a_runtime_env(ray_session, monkeypatch):
    """On the suite's cluster (started by init_local, as the driver starts its own) an actor
    inherits actor_env() and needs no runtime_env; a variable changed since is passed."""
    import ray

    from pipeline.runtime import ray_start, startup_gc

    assert ray_start._runtime_env() is None
    # (all but the start-up's garbage-collection request, which the actor consumes:
    # tests/test_startup_gc.py)
    keys = sorted(k for k in actor_env() if k != startup_gc.ENV_VAR)
    first = ray_start.start_actor(_Env, ray_start.Placement(cpus=0.1))
    monkeypatch.setenv("WANDB_MODE", "offline-from-the-test")
    assert ray_start._runtime_env() == {"env_vars": actor_env()}
    second = ray_start.start_actor(_Env, ray_start.Placement(cpus=0.1))
    try:
        assert ray.get(first.get.remote(keys)) == {k: actor_env()[k] for k in keys}
        assert ray.get(second.get.remote(["WANDB_MODE"])) == {"WANDB_MODE":
                                                              "offline-from-the-test"}
        assert ray.get(first.unraisablehook.remote()) == ("exit_on_swallowed_sigterm", "_Env")
    finally:
        ray_start.kill_actors([first, second])


def test_ray_address_local_starts_the_private_cluster_through_init_local(monkeypatch):
    """RAY_ADDRESS=local (the quality bench's subprocesses) is a cluster of our own, started as
    with no address at all: through init_local, so that its actors need no runtime_env."""
    import ray

    from pipeline.runtime import ray_start

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(("ray.init", kw)))
    monkeypatch.setattr(ray_start, "init_local", lambda **kw: calls.append(("init_local", kw)))
    monkeypatch.setattr(ray_start, "_private_cluster_auth", lambda: None)
    for address in (None, "local"):
        monkeypatch.setenv("RAY_ADDRESS", address or "")
        assert ray_start.init_ray(None, 3) is True
    assert ray_start.init_ray("local", 3) is True
    assert [name for name, _ in calls] == ["init_local"] * 3
    assert all(kw["_system_config"] == ray_start.LOCAL_SYSTEM_CONFIG for _, kw in calls)
    calls.clear()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray_start.init_ray(None, 3)
    assert calls == [("ray.init", {"address": "10.0.0.1:6379"})]


def test_a_sigterm_swallowed_in_a_finalizer_exits_the_actor_without_a_traceback(monkeypatch):
    """Ray's SIGTERM handler raises SystemExit; raised inside a weakref callback it would be
    printed as "Exception ignored ... Traceback" and the actor would live on. The actors'
    hook exits with the handler's code instead; any other unraisable exception is reported
    as before."""
    from types import SimpleNamespace

    from pipeline.runtime import ray_start

    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    reported = []
    monkeypatch.setattr(ray_start.os, "_exit", fake_exit)
    monkeypatch.setattr(ray_start, "_unraisablehook_before", reported.append)
    with pytest.raises(Exited) as exited:
        ray_start.exit_on_swallowed_sigterm(SimpleNamespace(exc_value=SystemExit(1)))
    assert exited.value.args == (1,)
    other = SimpleNamespace(exc_value=ValueError("in a __del__"))
    ray_start.exit_on_swallowed_sigterm(other)
    assert reported == [other]
