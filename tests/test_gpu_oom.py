"""A GPU out of memory in an actor: the job ends with one line naming the actor, what it asked
for, what the card held, the settings that shrink that actor (with this job's values) and the
checkpoint kept; rc 1, no traceback. The error comes through a real Ray actor; its message is
torch's own, as the 8B job on an H100 printed it on 2026-12-05 (no GPU here to run out of)."""

import logging

import pytest
import ray
import torch
from hydra import compose, initialize_config_dir

from pipeline import train
from pipeline.job.config import register_configs
from pipeline.driver.compose import CONF_DIR, compose_job
from pipeline.job.gpu_oom import gpu_oom_headline

MESSAGE = ("CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of "
           "79.18 GiB of which 937.38 MiB is free. Process 4745 has 610.00 MiB memory in use. "
           "Process 5184 has 26.30 GiB memory in use. Process 5287 has 15.32 GiB memory in "
           "use. Including non-PyTorch memory, this process has 35.99 GiB memory in use. Of "
           "the allocated memory 34.09 GiB is allocated by PyTorch, and 1.17 GiB is reserved "
           "by PyTorch but unallocated.")


class DrafterWorker:  # named as the pipeline's: the headline reads the actor's class name
    def forward_backward(self):
        raise torch.OutOfMemoryError(MESSAGE)


class TargetWorker:
    def forward(self):
        raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported "
                           "asynchronously")


def _from_actor(cls, method):
    actor = ray.remote(cls).remote()
    try:
        with pytest.raises(Exception) as info:
            ray.get(getattr(actor, method).remote())
        return info.value
    finally:
        ray.kill(actor)


@pytest.fixture(scope="module")
def errors(ray_session):
    return (_from_actor(DrafterWorker, "forward_backward"), _from_actor(TargetWorker, "forward"))


def test_a_drafter_out_of_memory_is_one_line_with_what_shrinks_it(errors):
    drafter_oom, _ = errors
    job = compose_job(["data.micro_batch_size=4", "drafter.num_anchors=256",
                       "train.eval.every=100"])
    line = gpu_oom_headline(drafter_oom, job, "/run/checkpoints/step_00000100")
    assert line.startswith("out of GPU memory in DrafterWorker.forward_backward (pid ")
    assert ("): it asked for 1.16 GiB; GPU 0 (79.18 GiB) had 937.38 MiB free; held: pid 4745 "
            "610.00 MiB, pid 5184 26.30 GiB, pid 5287 15.32 GiB, this one 35.99 GiB. Settings "
            "that shrink it: data.micro_batch_size=4, data.max_length=") in line
    assert "drafter.num_anchors=256, train.eval.every=-1 (no tau evaluator" in line
    assert line.endswith("; kept: checkpoint /run/checkpoints/step_00000100, rerun with "
                         "train.checkpoint.resume=auto to go on from it")
    assert "\n" not in line


def test_the_settings_follow_the_actor_and_the_batching(errors):
    _, target_oom = errors
    job = compose_job(["data.batching=bucket", "data.tokens_per_micro_batch=4096",
                       "train.eval.every=-1"])
    line = gpu_oom_headline(target_oom, job, None)
    assert line.startswith("out of GPU memory in TargetWorker.forward (pid ")
    # No figures in this message: its own text instead.
    assert "): CUDA error: out of memory CUDA kernel errors" in line
    assert ("Settings that shrink it: data.tokens_per_micro_batch=4096, "
            "data.anchors_per_micro_batch=None, target.stages=1") in line
    assert "train.eval.every=-1" not in line  # eval is off already
    assert line.endswith("; no checkpoint of this run was written before it")


def test_other_errors_are_not_taken_for_one():
    job = compose_job()
    assert gpu_oom_headline(RuntimeError("CUDA error: device-side assert triggered"), job,
                            None) is None
    assert gpu_oom_headline(ValueError("out of memory"), job, None) is None
    # An out of memory behind another error (raised while handling it) is still found.
    try:
        try:
            raise torch.OutOfMemoryError(MESSAGE)
        except torch.OutOfMemoryError:
            raise RuntimeError("closing the actors failed")
    except RuntimeError as later:
        assert gpu_oom_headline(later, job, None).startswith(
            "out of GPU memory in a process of this job: it asked for 1.16 GiB")


def test_the_job_ends_with_the_line_and_rc_1(errors, monkeypatch, caplog, tmp_path):
    """pipeline.train's own handler: the driver's run raising what Ray raised."""
    drafter_oom, _ = errors

    class Failing:
        saves = type("Saves", (), {"last": None})()

        def run(self):
            raise drafter_oom

    monkeypatch.setattr(train, "_driver", lambda job: Failing())
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"train.out_dir={tmp_path}"])
    with caplog.at_level(logging.ERROR, logger="pipeline.train"), \
            pytest.raises(SystemExit) as info:
        train.main(cfg)
    assert info.value.code == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.train"]
    assert len(lines) == 1 and lines[0].startswith("out of GPU memory in DrafterWorker.")


def test_a_regeneration_out_of_memory_is_one_line_with_its_engine_settings(
        errors, monkeypatch, tmp_path, capsys):
    """pipeline.regenerate's own handler: its generators raising what Ray raised."""
    import json

    from pipeline import regenerate
    from pipeline.assets.family_targets import ensure_family_target

    drafter_oom, _ = errors
    src = tmp_path / "prompts.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")

    def failing(plan):
        raise drafter_oom

    monkeypatch.setattr(regenerate, "execute", failing)
    code = regenerate.main(["--input", str(src), "--output", str(tmp_path / "out.jsonl"),
                            "--target", ensure_family_target("qwen3"), "--static-rows", "2048"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("regenerate: out of GPU memory in DrafterWorker.forward_backward")
    assert ("Settings that shrink it: --static-rows 2048, --max-new-tokens 256 (the cache's "
            f"columns); the answers written so far stay in {tmp_path / 'out.jsonl'}; the same "
            "command goes on from them") in err[0]
