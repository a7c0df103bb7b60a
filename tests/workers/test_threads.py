"""Compute runs on the actor's main thread; a raw thread lacks the CUDA-graph-tree state."""

import threading

import ray
import torch

from pipeline.workers.common import on_main_thread


class Probe:
    """A plain class, wrapped by ray.remote below, as ray_start.start_actor does for workers."""

    def where(self) -> bool:
        return on_main_thread()

    def graph_state_in_raw_thread(self) -> dict:
        from torch._inductor import cudagraph_trees  # imported here, on the main thread

        out = {"main_has_state": hasattr(cudagraph_trees.local, "tree_manager_containers")}

        def body():
            out["thread_has_state"] = hasattr(cudagraph_trees.local, "tree_manager_containers")
            try:
                containers = cudagraph_trees.get_obj(cudagraph_trees.local,
                                                     "tree_manager_containers")
                out["outcome"] = "lazy per-thread state"
                out["distinct"] = containers is not main_containers
            except AssertionError:
                out["outcome"] = "AssertionError"

        main_containers = cudagraph_trees.get_obj(cudagraph_trees.local,
                                                  "tree_manager_containers")
        t = threading.Thread(target=body)
        t.start()
        t.join()
        return out


def test_plain_actor_methods_run_on_the_main_thread(ray_session):
    plain = ray.remote(Probe).options(num_cpus=0.1).remote()
    assert ray.get([plain.where.remote() for _ in range(4)]) == [True] * 4
    # The check can fail: a threaded actor (max_concurrency > 1) runs methods elsewhere.
    threaded = ray.remote(Probe).options(num_cpus=0.1, max_concurrency=2).remote()
    assert ray.get(threaded.where.remote()) is False
    ray.kill(plain)
    ray.kill(threaded)


def test_raw_thread_lacks_cuda_graph_tree_state(ray_session):
    actor = ray.remote(Probe).options(num_cpus=0.1).remote()
    out = ray.get(actor.graph_state_in_raw_thread.remote())
    ray.kill(actor)
    assert out["main_has_state"] and not out["thread_has_state"]
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) <= (2, 12):
        # The replaced trainer's crash (pytorch issue 123177), reproduced on 2.11 in docs/.
        assert out["outcome"] == "AssertionError"
    else:
        # torch 2.13+ builds the state lazily per thread: the thread gets its own, not ours.
        assert out["outcome"] == "lazy per-thread state" and out["distinct"]
    print(f"torch {torch.__version__}: raw thread -> {out['outcome']}")
