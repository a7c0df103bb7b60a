"""Reproduce the seed trainer's failure: a compiled (reduce-overhead) drafter step in a raw thread.

    python bench/thread_repro.py --target /tmp/qwen3-mid     # on a GPU machine, with Ray

Runs the same DrafterTrainer step three ways, each in a fresh plain Ray actor on one GPU:
  main:         on the actor's main thread (how the pipeline runs it)
  thread:       in a raw threading.Thread, after the main thread imported torch._inductor's
                cudagraph_trees (how the replaced trainer ran it)
  fresh-thread: in a raw thread of an actor whose main thread never imported it
  main+thread:  main thread first, then the same compiled step from a raw thread
and prints, as JSON lines, what each saw (torch version, success or the exception).
"""

import argparse
import json
import threading
import traceback

import ray
import torch


class CompiledStep:
    """A plain class (Ray wraps it below): one drafter with torch.compile, random features."""

    def __init__(self, target_path: str, mode: str, attention: str) -> None:
        import torch._inductor.config as inductor_config

        # Fail loudly instead of silently running without graphs: the point is the capture.
        inductor_config.triton.cudagraph_or_error = True
        from transformers import AutoConfig, AutoTokenizer

        from pipeline.model.config import DrafterConfig, build_drafter_spec
        from pipeline.model.target import load_target_head
        from pipeline.training.config import OptimConfig
        from pipeline.training.drafter_trainer import DrafterTrainer

        tok = AutoTokenizer.from_pretrained(target_path)
        options = DrafterConfig(num_layers=2, block_size=16, num_taps=3, num_anchors=32,
                                compile=mode, static_shapes=True, attention=attention)
        spec = build_drafter_spec(AutoConfig.from_pretrained(target_path).to_dict(), options,
                                  tok.mask_token_id)
        self.trainer = DrafterTrainer(spec, options, OptimConfig(), 0,
                                      load_target_head(target_path),
                                      "cuda", torch.bfloat16, total_steps=10)
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, spec.hf_config["vocab_size"] - 8, (2, 256), generator=g)
        self.mask = torch.ones_like(self.ids)
        self.feats = torch.randn(2, 256, spec.feature_size, generator=g).to("cuda", torch.bfloat16)

    def one_step(self) -> float:
        parts = self.trainer.forward_backward(self.feats, self.ids, self.mask, [0, 1], 0)
        self.trainer.step()
        return float(parts.numerator.detach())

    def graph_state(self) -> dict:
        """Whether this thread has CUDA-graph-tree state, and whether graphs were recorded."""
        from torch._dynamo.utils import counters
        from torch._inductor import cudagraph_trees

        has_local = hasattr(cudagraph_trees.local, "tree_manager_containers")
        manager = None
        try:
            manager = cudagraph_trees.get_container(0).tree_manager
        except AssertionError as exc:
            return {"thread_state": has_local, "get_container": f"AssertionError: {exc}"}
        return {"thread_state": has_local, "tree_manager": manager is not None,
                "graphs_recorded": len(getattr(manager, "roots", {}) or {}) if manager else 0,
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}

    def run(self, where: str, steps: int = 3) -> dict:
        out = {"where": where, "torch": torch.__version__,
               "attention": self.trainer.options.attention}
        if where in ("main", "main+thread"):
            out["main_losses"] = [self.one_step() for _ in range(steps)]
            out["main_graphs"] = self.graph_state()
        if where == "thread":
            # The replaced trainer's layout: its main thread had imported torch._inductor
            # (cudagraph_trees builds its thread-local state in the importing thread only).
            from torch._inductor import cudagraph_trees  # noqa: F401
        if where in ("thread", "fresh-thread", "main+thread"):
            box: dict = {}

            def body():
                from torch._inductor import cudagraph_trees

                box["state_before"] = hasattr(cudagraph_trees.local, "tree_manager_containers")
                try:
                    box["losses"] = [self.one_step() for _ in range(steps)]
                    box["graphs"] = self.graph_state()
                except BaseException as exc:  # the point is to see what it raises
                    box["error"] = f"{type(exc).__name__}: {exc}"
                    box["where_raised"] = traceback.format_exc().strip().splitlines()[-3:]

            t = threading.Thread(target=body)
            t.start()
            t.join()
            out["thread"] = box
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--mode", default="reduce-overhead")
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--cases", default="main,thread,main+thread")
    args = p.parse_args()
    ray.init(include_dashboard=False)
    actor_cls = ray.remote(num_gpus=1)(CompiledStep)
    for where in args.cases.split(","):
        actor = actor_cls.remote(args.target, args.mode, args.attention)
        try:
            print(json.dumps(ray.get(actor.run.remote(where))), flush=True)
        except Exception as exc:  # report and go on: each case is independent
            print(json.dumps({"where": where, "attention": args.attention,
                              "error": str(exc)[-1500:]}), flush=True)
        ray.kill(actor)


if __name__ == "__main__":
    main()
