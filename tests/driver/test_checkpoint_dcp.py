"""Checkpoints through torch.distributed.checkpoint: saved by 2 fsdp ranks, resumed at 3 and
replicated, and saved replicated, resumed sharded (resharding); a corrupted newest checkpoint
falls back to the one before; a checkpoint in the format before DCP (one drafter.pt) still
resumes. Each resume's losses continue the uninterrupted run's."""

import json
import logging
import shutil
from dataclasses import asdict

import pytest

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint import sharded
from pipeline.checkpoint.files import load_state, save_state
from pipeline.checkpoint.writer import TRAINER_FILE
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.resolve import resolve_job
from pipeline.training.drafter_trainer import build_drafter
from pipeline.training.optim import build_optimizer
from pipeline.training.single import SingleProcessTrainer

BASE = ["cluster.cpus_per_actor=0.5", "train.eval.every=-1", "train.export_dtype=float32",
        "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0", "data.micro_batch_size=1"]


def _losses(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _resume(out_dir, copy_of, steps, *extra):
    shutil.copytree(copy_of, out_dir)
    (out_dir / "metrics.jsonl").unlink()  # only the resumed steps' rows
    return Driver(compose_job(BASE + list(extra) + [
        f"train.out_dir={out_dir}", f"train.plan.max_steps={steps}",
        "train.checkpoint.resume=auto"])).run()


def test_saved_by_two_fsdp_ranks_resumes_at_three_and_replicated(ray_cluster, small_train_file,
                                                                 tmp_path):
    """Every step sums the same 6 micro-batches of one sample (2 ranks x 3, 3 x 2, 1 x 6), so
    each resume's losses are the single-process reference's (1 process x 6)."""
    data = [f"data.train_path={small_train_file}"]
    ref = compose_job(BASE + data + ["cluster.drafters_per_node=1", "train.plan.grad_accum=6",
                                     "train.plan.max_steps=3", f"train.out_dir={tmp_path / 'r'}"])
    want = {i + 1: row["train/loss"] for i, row in enumerate(SingleProcessTrainer(ref).train())}
    first = Driver(compose_job(BASE + data + [
        "drafter.parallel=fsdp", "cluster.drafters_per_node=2", "train.plan.grad_accum=3",
        "train.plan.max_steps=3", "train.plan.stop_at_step=2", f"train.out_dir={tmp_path / 'a'}"])
    ).run()
    assert first.steps == 2
    saved = ckpt.latest(tmp_path / "a")
    files = {f["name"] for f in ckpt.read_state(saved)["files"]}
    # Each rank wrote its own shards (nothing gathered), plus the owner's trainer.pt.
    assert {"drafter/__0_0.distcp", "drafter/__1_0.distcp", "drafter/.metadata",
            TRAINER_FILE} <= files and sharded.LEGACY_FILE not in files
    got = _losses(tmp_path / "a")
    three = _resume(tmp_path / "b", tmp_path / "a", 3, *data, "drafter.parallel=fsdp",
                    "cluster.drafters_per_node=3", "train.plan.grad_accum=2")
    assert (three.first_step, three.end_step) == (2, 3)
    got3 = {**got, **_losses(tmp_path / "b")}
    one = _resume(tmp_path / "c", tmp_path / "a", 3, *data, "drafter.parallel=replicate",
                  "cluster.drafters_per_node=1", "train.plan.grad_accum=6")
    got1 = {**got, **_losses(tmp_path / "c")}
    assert sorted(got3) == sorted(got1) == sorted(want) == [1, 2, 3]
    for step in want:
        assert got3[step] == pytest.approx(want[step], rel=1e-5), step
        assert got1[step] == pytest.approx(want[step], rel=1e-5), step


def _legacy(folder, job):
    """``folder`` rewritten in the format before DCP: the whole trainer state in drafter.pt
    (fp32 weights, AdamW state with integer ids, scheduler, steps done, RNG)."""
    r = resolve_job(job)
    model = build_drafter(r.spec, job.train.seed, "cpu")
    optim = build_optimizer(model, job.train.optim)
    sharded.load(model, optim, folder, group=None)
    state = {"model": model.state_dict(), "optimizer": optim.state_dict(),
             **load_state(folder / TRAINER_FILE)}
    shutil.rmtree(folder / sharded.DRAFTER_DIR)
    (folder / TRAINER_FILE).unlink()
    record = save_state(state, folder / sharded.LEGACY_FILE)
    meta = ckpt.read_state(folder)
    meta["files"] = [asdict(record)]
    (folder / "state.json").write_text(json.dumps(meta))
    assert ckpt.problem(folder) is None


def test_corrupt_newest_falls_back_and_the_old_format_resumes(ray_cluster, small_train_file,
                                                             tmp_path, caplog):
    run = BASE + [f"data.train_path={small_train_file}", "train.plan.max_steps=3"]
    full = tmp_path / "full"
    Driver(compose_job(run + ["cluster.drafters_per_node=1", "train.plan.grad_accum=2",
                              "train.checkpoint.every=1", f"train.out_dir={full}"])).run()
    want = _losses(full)
    assert [ckpt.read_point(p).step for p in ckpt.step_folders(full)] == [1, 2, 3]

    # A flipped byte in the newest checkpoint's shard file: its digest no longer matches.
    shard = ckpt.checkpoint_root(full) / "step_00000003" / "drafter" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):  # saved replicated, resumed sharded (2 x 1)
        again = _resume(tmp_path / "again", full, 3, f"data.train_path={small_train_file}",
                        "drafter.parallel=fsdp", "cluster.drafters_per_node=2",
                        "train.plan.grad_accum=1")
    assert "skipping checkpoint" in caplog.text and "step_00000003" in caplog.text
    assert "drafter/__0_0.distcp does not match its recorded sha256" in caplog.text
    assert (again.first_step, again.end_step) == (2, 3)
    assert _losses(tmp_path / "again")[3] == pytest.approx(want[3], rel=1e-5)

    # The format before DCP, resumed by 2 fsdp ranks (the same 2 micro-batches per step).
    old = tmp_path / "old"
    shutil.copytree(full, old)
    for folder in ckpt.step_folders(old)[1:]:
        shutil.rmtree(folder)
    (step_1,) = ckpt.step_folders(old)
    _legacy(step_1, compose_job(run + [f"train.out_dir={old}"]))
    resumed = _resume(tmp_path / "old-resumed", old, 3, f"data.train_path={small_train_file}",
                      "drafter.parallel=fsdp", "cluster.drafters_per_node=2",
                      "train.plan.grad_accum=1")
    assert (resumed.first_step, resumed.end_step) == (1, 3)
    got = _losses(tmp_path / "old-resumed")
    for step in (2, 3):
        assert got[step] == pytest.approx(want[step], rel=1e-5), step
    # Its own checkpoints are in the new format.
    newest = ckpt.latest(tmp_path / "old-resumed")
    assert ckpt.read_point(newest).step == 3
    assert (newest / sharded.DRAFTER_DIR / ".metadata").is_file()
    assert not (newest / sharded.LEGACY_FILE).exists()
