"""Every actor gets persistent compile caches, and the user's own cache settings win."""

from pipeline.ray_start import actor_env


def test_actors_share_a_persistent_compile_cache(monkeypatch):
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE"):
        monkeypatch.delenv(key, raising=False)
    env = actor_env()
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("dflash-pipeline/torch-compile/inductor")
    assert not env["TORCHINDUCTOR_CACHE_DIR"].startswith("/tmp")
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/fast/disk/inductor")
    assert actor_env()["TORCHINDUCTOR_CACHE_DIR"] == "/fast/disk/inductor"
