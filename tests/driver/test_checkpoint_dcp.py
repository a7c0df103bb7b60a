"""drafter.parallel=fsdp and checkpoints through torch.distributed.checkpoint, against the
single-process reference: 2 fsdp ranks train (and evaluate through their every-rank gather)
and save; resumed at 3 fsdp ranks and at 1 replicated rank (resharding). Saved replicated,
resumed sharded; a corrupted newest checkpoint falls back to the one before; a checkpoint in
the format before DCP (one drafter.pt) still resumes.

Every step sums the same 6 micro-batches of one sample (2 ranks x 3, 3 x 2, 1 x 6), so every
job's losses, gradient norms and final weights are the reference's (1 process x 6). One chain
of jobs serves the module: each resume starts from a copy of the folder before it.
"""

import json
import logging
import shutil
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import load_file

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint import sharded
from pipeline.checkpoint.files import load_state, save_state
from pipeline.checkpoint.writer import TRAINER_FILE
from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver
from pipeline.job.resolve import resolve_job
from pipeline.training.drafter_trainer import build_drafter
from pipeline.training.optim import build_optimizer
from pipeline.reference.trainer import SingleProcessTrainer

STEPS = 4
BASE = ["cluster.cpus_per_actor=0.5", "train.eval.every=-1", "train.export_dtype=float32",
        "train.optim.lr=1e-3", "train.optim.warmup_ratio=0.0", "data.micro_batch_size=1",
        f"train.plan.max_steps={STEPS}"]
FSDP_2 = ["drafter.parallel=fsdp", "cluster.drafters_per_node=2", "train.plan.grad_accum=3"]


def _logged(out_dir, key):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def _resume(out_dir, copy_of, data, *extra):
    shutil.copytree(copy_of, out_dir)
    (out_dir / "metrics.jsonl").unlink()  # only the resumed steps' rows
    return Driver(compose_job(BASE + data + list(extra) + [
        f"train.out_dir={out_dir}", "train.checkpoint.resume=auto"])).run()


@pytest.fixture(scope="module")
def chain(ray_cluster, small_train_file, tmp_path_factory):
    """The reference, 2 fsdp ranks stopped at step 2 (folder a), and a copy of a resumed by 1
    replicated rank saving every step (folder c: step 2 sharded, 3 and 4 replicated)."""
    root = tmp_path_factory.mktemp("dcp")
    data = [f"data.train_path={small_train_file}"]
    ref_job = compose_job(BASE + data + ["cluster.drafters_per_node=1",
                                         "train.plan.grad_accum=6", f"train.out_dir={root / 'r'}"])
    history = SingleProcessTrainer(ref_job).train()
    # The evaluator takes its weights through the every-rank gather (FSDP_POLICY).
    first = Driver(compose_job(BASE + data + FSDP_2 + [
        "train.plan.stop_at_step=2", "train.eval.every=2", "train.eval.prompts=2",
        "train.eval.max_new_tokens=8", f"train.out_dir={root / 'a'}"])).run()
    one = _resume(root / "c", root / "a", data, "drafter.parallel=replicate",
                  "cluster.drafters_per_node=1", "train.plan.grad_accum=6",
                  "train.checkpoint.every=1")
    return dict(root=root, data=data, ref_job=ref_job, history=history, first=first, one=one)


def _check_losses(chain, *folders):
    """Losses and gradient norms of the steps ``folders`` logged, each the reference's."""
    for key, ref_key, rel in (("train/loss", "train/loss", 1e-5),
                              ("train/grad_norm", "grad_norm", 1e-4)):
        # AdamW hides a wrong gradient scale from the weights; the norm (before clipping)
        # shows whether every rank's gradients were summed and divided by the global
        # denominator.
        got = {}
        for folder in folders:
            got.update(_logged(folder, key))
        want = {i + 1: row[ref_key] for i, row in enumerate(chain["history"])}
        assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
        for step in want:
            assert got[step] == pytest.approx(want[step], rel=rel), (key, step)


def _check_weights(chain, folder):
    """The weights' distance from a seeded random drafter, by norm over all parameters (per
    element, fp32 rounding of another summation order is a sizeable share of a 1e-3 step on a
    weight near zero)."""
    ref_job = chain["ref_job"]
    start = build_drafter(resolve_job(ref_job).spec, ref_job.train.seed, "cpu").state_dict()
    ref_w = load_file(str(chain["root"] / "r" / "export" / "model.safetensors"))
    got_w = load_file(str(folder / "export" / "model.safetensors"))
    assert got_w.keys() == ref_w.keys()
    ref_update = torch.cat([(ref_w[n] - start[n]).flatten() for n in sorted(ref_w)])
    got_update = torch.cat([(got_w[n] - start[n]).flatten() for n in sorted(ref_w)])
    assert ref_update.norm() > 1e-2, "the steps did not change the weights: vacuous comparison"
    rel = float((got_update - ref_update).norm() / ref_update.norm())
    assert rel < 1e-5, f"updates differ by {rel:.2e} relative"


def test_saved_by_two_fsdp_ranks_resumes_at_three_and_replicated(chain, tmp_path):
    root, first = chain["root"], chain["first"]
    assert first.steps == 2 and first.checksums_agree, "the gathered weights differ by rank"
    assert first.tau_before is not None and first.tau_after is not None
    assert first.tau_before >= 1 and first.tau_after >= 1
    saved = ckpt.latest(root / "a")
    assert ckpt.read_point(saved).step == 2
    files = {f["name"] for f in ckpt.read_state(saved)["files"]}
    # Each rank wrote its own shards (nothing gathered), plus the owner's trainer.pt.
    assert {"drafter/__0_0.distcp", "drafter/__1_0.distcp", "drafter/.metadata",
            TRAINER_FILE} <= files and sharded.LEGACY_FILE not in files
    three = _resume(tmp_path / "b", root / "a", chain["data"], "drafter.parallel=fsdp",
                    "cluster.drafters_per_node=3", "train.plan.grad_accum=2")
    assert (three.first_step, three.end_step) == (2, STEPS) and three.checksums_agree
    one = chain["one"]
    assert (one.first_step, one.end_step) == (2, STEPS)
    _check_losses(chain, root / "a", tmp_path / "b")
    _check_losses(chain, root / "a", root / "c")
    _check_weights(chain, tmp_path / "b")
    _check_weights(chain, root / "c")


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


def test_corrupt_newest_falls_back_and_the_old_format_resumes(chain, tmp_path, caplog):
    full, data = chain["root"] / "c", chain["data"]
    assert [ckpt.read_point(p).step for p in ckpt.step_folders(full)] == [2, 3, 4]
    want = {i + 1: row["train/loss"] for i, row in enumerate(chain["history"])}

    # A flipped byte in the newest checkpoint's shard file: its digest no longer matches.
    corrupt = tmp_path / "corrupt"
    shutil.copytree(full, corrupt)
    shard = ckpt.checkpoint_root(corrupt) / "step_00000004" / "drafter" / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):  # step 3 saved replicated, resumed sharded (2 x 3)
        again = _resume(tmp_path / "again", corrupt, data, *FSDP_2)
    assert "skipping checkpoint" in caplog.text and "step_00000004" in caplog.text
    assert "drafter/__0_0.distcp does not match its recorded sha256" in caplog.text
    assert (again.first_step, again.end_step) == (3, STEPS)
    assert _logged(tmp_path / "again", "train/loss")[4] == pytest.approx(want[4], rel=1e-5)

    # The format before DCP (step 3, saved replicated), resumed by 2 fsdp ranks.
    old = tmp_path / "old"
    shutil.copytree(full, old)
    for folder in ckpt.step_folders(old)[2:]:
        shutil.rmtree(folder)
    step_3 = ckpt.step_folders(old)[-1]
    assert ckpt.read_point(step_3).step == 3
    _legacy(step_3, compose_job(BASE + data + [f"train.out_dir={old}"]))
    resumed = _resume(tmp_path / "old-resumed", old, data, *FSDP_2)
    assert (resumed.first_step, resumed.end_step) == (3, STEPS)
    assert _logged(tmp_path / "old-resumed", "train/loss")[4] == \
        pytest.approx(want[4], rel=1e-5)
    # Its own checkpoints are in the new format.
    newest = ckpt.latest(tmp_path / "old-resumed")
    assert ckpt.read_point(newest).step == STEPS
    assert (newest / sharded.DRAFTER_DIR / ".metadata").is_file()
    assert not (newest / sharded.LEGACY_FILE).exists()
