"""tau evaluation off the critical path: its own actor, fed weights behind a step.

Three promises: the evaluator computes the same tau as the old path (drafter rank 0 evaluating
its own model) for the same weights; the step loop trains on while an evaluation runs; and a
killed evaluator costs an evaluation, not the training job. The second is shown without
timing: the evaluation is held by a file gate that only the last step's report opens, so a
loop that waited for it would never get there.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Optional

import ray
import torch

from pipeline.driver.compose import compose_job
from pipeline.driver.drafter_group import DrafterGroup
from pipeline.driver.evaluator import TauEvaluator
from pipeline.driver.job import Driver
from pipeline.driver.scheduler import StepLoop, StepReport, Topology
from pipeline.runtime.ray_start import Placement, kill_actors, start_actor
from pipeline.job.resolve import resolve_job
from pipeline.transport.messages import ProduceMeta, SlotAck, SlotReady
from pipeline.workers.eval_worker import EvalResult, EvalWorker
from pipeline.workers.messages import MicroBatch, MicroBatchMeta, MicroResult, StepResult

# -- 1. same tau as the old path -----------------------------------------------------------


def test_evaluator_matches_drafter_rank0_evaluation(tiny_assets, tmp_path):
    from transformers import AutoTokenizer

    from pipeline.eval.tau import evaluate_tau, heldout_prompts, load_full_target
    from pipeline.workers.drafter_worker import DrafterWorker

    job = compose_job(["cluster.device=cpu", f"train.out_dir={tmp_path}"])
    r = resolve_job(job)
    tok = AutoTokenizer.from_pretrained(r.target_path)
    prompts = heldout_prompts(r.heldout_path, tok, 3, enable_thinking=job.data.enable_thinking)
    drafter = DrafterWorker(rank=0, world_size=1, spec=r.spec, options=job.drafter,
                            optim=job.train.optim, seed=3, target_path=r.target_path,
                            device="cpu", autocast_dtype=None, feature_dtype=torch.float32,
                            feature_numel=8, total_steps=1)
    with torch.no_grad():  # weights no fresh drafter has: the evaluator must use the sent ones
        for p in drafter.trainer.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    # The old path: rank 0 evaluated its own model with a full target it kept resident.
    old = evaluate_tau(load_full_target(r.target_path, "cpu", torch.float32),
                       drafter.trainer.model, drafter.trainer.head, prompts, 12, r.eos_token_id)

    worker = EvalWorker(spec=r.spec, target_path=r.target_path, device="cpu",
                        target_dtype=torch.float32, prompts=prompts, max_new_tokens=12,
                        eos_token_id=r.eos_token_id)
    result = worker.evaluate(drafter.weights(), step=7)
    assert result == EvalResult(step=7, tau=old, num_prompts=3, seconds=result.seconds,
                                weights_by="object store")
    assert worker.holds_target()
    # A failed evaluation is reported, not raised: it must not end the training job.
    failed = worker.evaluate({"not_a_weight": torch.zeros(1)}, step=8)
    assert failed.step == 8 and failed.tau != failed.tau  # nan
    assert failed.error.startswith("RuntimeError: Error(s) in loading state_dict")
    # one line that says where it was raised (the driver shows it once, without a traceback)
    assert "\n" not in failed.error and failed.error.endswith("in load_state_dict)")
    worker.close()  # frees what it loaded
    assert not worker.holds_target() and worker.drafter is None


def test_evaluator_scores_with_the_targets_own_head_as_with_a_full_copy(tiny_assets, tmp_path,
                                                                         monkeypatch):
    # A bf16 target beside an fp32 drafter: the evaluator scores the drafter's output with the
    # target's own bf16 head (TargetHead.argmax casts it a slice at a time), where it used to
    # take an fp32 copy of the head (5 GB at the 8B shape) every evaluation; tau is the same.
    from transformers import AutoTokenizer

    from pipeline.eval.tau import evaluate_tau, heldout_prompts, load_full_target
    from pipeline.model.drafter import DFlashDrafter
    from pipeline.model.target import load_target_head
    from pipeline.workers import eval_worker

    job = compose_job(["cluster.device=cpu", f"train.out_dir={tmp_path}"])
    r = resolve_job(job)
    tok = AutoTokenizer.from_pretrained(r.target_path)
    prompts = heldout_prompts(r.heldout_path, tok, 3, enable_thinking=job.data.enable_thinking)
    torch.manual_seed(4)
    drafter = DFlashDrafter(r.spec)
    target = load_full_target(r.target_path, "cpu", torch.bfloat16)
    copy = load_target_head(r.target_path).to("cpu", torch.float32)
    old = evaluate_tau(target, drafter, copy, prompts, 12, r.eos_token_id)
    worker = EvalWorker(spec=r.spec, target_path=r.target_path, device="cpu",
                        target_dtype=torch.bfloat16, prompts=prompts, max_new_tokens=12,
                        eos_token_id=r.eos_token_id)
    heads = []

    def spy(target, drafter, head, *args):  # the real evaluation, its head kept for a look
        heads.append(head)
        return evaluate_tau(target, drafter, head, *args)

    monkeypatch.setattr(eval_worker, "evaluate_tau", spy)
    result = worker.evaluate(drafter.state_dict(), step=1)
    assert result.error is None and result.tau == old
    # The target's own tensors, in its dtype: nothing copied.
    (head,) = heads
    assert head.lm_head.data_ptr() == worker._target.get_output_embeddings().weight.data_ptr()
    assert head.embed.data_ptr() == worker._target.get_input_embeddings().weight.data_ptr()
    assert head.lm_head.dtype == torch.bfloat16
    worker.close()


# -- 2. the step loop does not wait for it -------------------------------------------------

class Prefetcher:
    def __init__(self, *, num_steps: int) -> None:
        self.left = [(s, i) for s in range(num_steps) for i in range(2)]

    def next_micro_batch(self):
        if not self.left:
            return None, None
        step, index = self.left.pop(0)
        meta = MicroBatchMeta(step=step, epoch=0, index=index, num_in_step=2,
                              sample_ids=(2 * step + index,), shape=(1, 1))
        ones = torch.ones(1, 1, dtype=torch.long)
        return meta, MicroBatch(meta, ones, ones)


class Target:
    """Hands out slots without data: the loop's messages are all this test needs."""

    def produce(self, slot: int, batch: MicroBatch) -> SlotReady:
        meta = ProduceMeta(step=batch.meta.step, index=batch.meta.index, start_s=0.0,
                           busy_s=0.0, on_main_thread=True)
        return SlotReady(0, slot, (1, 1), batch.meta.sample_ids, meta)


class Drafter:
    """Its "weights" count the steps it took, so the evaluator shows which step it got."""

    def __init__(self, *, rank: int) -> None:
        self.rank, self.steps_done = rank, 0

    def load(self, ready: SlotReady) -> SlotAck:
        return SlotAck(ready.target_rank, ready.slot)

    def forward_backward(self, batch: MicroBatch) -> MicroResult:
        return MicroResult(drafter=self.rank, step=batch.meta.step, epoch=0,
                           sample_ids=batch.meta.sample_ids, numerator=1.0, denominator=1.0,
                           correct=(), total=(), tokens=0, start_s=0.0, busy_s=0.0,
                           on_main_thread=True)

    def step(self, step: int) -> StepResult:
        self.steps_done += 1
        return StepResult(drafter=self.rank, step=step, denominator=1.0, grad_norm=0.0,
                          skipped=False, lr=0.0, start_s=0.0, busy_s=0.0, reduce_start_s=0.0, reduce_s=0.0,
                          max_memory_bytes=0, param_checksum=0.0, on_main_thread=True,
                          cudagraph_skips=0)

    def weights(self, ring=False, reader_node=None) -> dict[str, torch.Tensor]:
        return {"steps_done": torch.tensor(self.steps_done)}


class GatedEvaluator:
    """Evaluates only once the gate file exists (or gives up, so a broken loop fails)."""

    def __init__(self, *, gate: str) -> None:
        self.gate = Path(gate)

    def evaluate(self, weights: dict[str, torch.Tensor], step: int) -> Optional[EvalResult]:
        deadline = time.monotonic() + 120
        while not self.gate.exists():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return EvalResult(step=step, tau=float(weights["steps_done"]), num_prompts=0,
                          seconds=0.0)

    def close(self) -> None:
        pass


def test_step_loop_trains_on_while_an_evaluation_runs(ray_session, tmp_path):
    where = Placement(cpus=0.1)
    gate = tmp_path / "gate"
    drafters = [start_actor(Drafter, where, rank=d) for d in range(2)]
    prefetcher = start_actor(Prefetcher, where, num_steps=6)
    target = start_actor(Target, where)
    topo = Topology(prefetcher, [target], drafters, [0], [0, 0], num_slots=2)
    job = compose_job(["train.eval.every=2"])
    evaluator = TauEvaluator(job, resolved=None, prompts=list)
    evaluator.actor = start_actor(GatedEvaluator, where, gate=str(gate))
    events: list[tuple[str, int]] = []

    def on_step(report: StepReport) -> None:
        events.append(("step", report.step + 1))
        if report.step + 1 == 6:
            gate.touch()  # only now may the evaluation after step 2 finish

    def on_eval(result: Optional[EvalResult]) -> None:
        assert result is not None, "the step loop waited for the evaluation"
        events.append(("eval", result.step))
        assert result.tau == result.step, "the evaluator got weights of another step"

    def after_step(step: int):
        return [evaluator.behind_step(DrafterGroup(drafters), step + 1, on_eval)] if step + 1 == 2 else []

    try:
        StepLoop(topo, end_step=6, on_step=on_step, after_step=after_step).run()
    finally:
        evaluator.close()
        kill_actors([prefetcher, target, *drafters])
    assert events == [("step", s) for s in range(1, 7)] + [("eval", 2)]


# -- 3. a dead evaluator costs a figure, never the training job -----------------------------

def _wait_dead(actor, timeout_s: float = 30.0) -> None:
    """ray.kill is asynchronous: wait until the actor really answers no more."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed evaluator still answers")


def test_a_killed_evaluator_is_restarted_and_training_goes_on(ray_cluster, small_train_file,
                                                              tmp_path, caplog):
    """The evaluator is killed after step 1 with an evaluation due every 2 steps. Whichever
    evaluation meets the dead actor first (one behind a step, or tau after training) reports
    it; the evaluator is started again, and tau after training is still measured."""
    out = tmp_path / "run"
    driver = Driver(compose_job([
        "cluster.cpus_per_actor=0.5", "cluster.drafters_per_node=1",
        "train.export_dtype=float32", "data.micro_batch_size=2", "train.plan.max_steps=6",
        "train.log_every=100",
        "train.eval.every=2", "train.eval.prompts=2", "train.eval.max_new_tokens=8",
        f"data.train_path={small_train_file}", f"train.out_dir={out}"]))
    killed = []

    def kill_evaluator(done: int) -> None:
        if done == 1 and not killed:
            killed.append(driver.evaluator.actor)
            ray.kill(killed[0])
            _wait_dead(killed[0])
    driver.step_listeners.append(kill_evaluator)
    with caplog.at_level(logging.INFO):
        summary = driver.run()

    assert killed and summary.restarts == [], "the evaluator's death restarted training"
    assert len(summary.losses) == summary.steps
    assert all(math.isfinite(loss) for loss in summary.losses)
    assert summary.end_step == 6
    assert "the tau evaluator died" in caplog.text and "starting a new one" in caplog.text
    assert driver.evaluator.restarts == 1
    # before training, after steps 2 and 4, after training: those that met the dead evaluator
    # (which ones depends on timing) failed and are counted; tau after training did not
    evals = summary.evals
    assert evals.total == 4 and evals.failed >= 1 and not evals.all_failed
    assert "the tau evaluator died" in evals.first_error
    assert summary.tau_after is not None and math.isfinite(summary.tau_after)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    taus = [(r["step"], r["eval/tau"]) for r in rows if "eval/tau" in r]
    logging.getLogger(__name__).warning("tau rows (step, tau) around the kill: %s", taus)
    assert taus[-1] == (summary.end_step, summary.tau_after)
