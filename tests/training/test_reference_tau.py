"""The reference trainer evaluates tau when and only when train.eval says so, as the pipeline does."""

import json

from pipeline.driver.compose import compose_job
from pipeline.reference.trainer import SingleProcessTrainer
from tests.training.test_golden_losses import CHAT, SETUP, golden_target_dir  # noqa: F401

BASE = [s for s in SETUP if not s.startswith("train.eval.every=")]


def _job(target, tmp_path, *over):
    return compose_job(BASE + [f"target.path={target}", f"data.train_path={CHAT}",
                               f"train.out_dir={tmp_path / 'out'}", *over])


def test_tau_every_n_steps_lands_in_metrics_between_steps(golden_target_dir, tmp_path):
    job = _job(golden_target_dir, tmp_path, "train.eval.every=2", "train.eval.prompts=2",
               "train.eval.max_new_tokens=4", f"data.heldout_path={CHAT}")
    trainer = SingleProcessTrainer(job)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    taus = [r for r in rows if "eval/tau" in r]
    # Steps 2 and 4 of 5; the last step's tau is the caller's (train_single's closing line).
    assert [r["step"] for r in taus] == [2, 4] and all(r["eval/tau"] >= 1.0 for r in taus)
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4, 5]


def test_tau_off_reads_no_heldout_line_and_evaluates_nothing(golden_target_dir, tmp_path):
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("{cut\n")  # refused if read (file and line), as it is when tau is on
    job = _job(golden_target_dir, tmp_path, "train.eval.every=-1", f"data.heldout_path={heldout}")
    trainer = SingleProcessTrainer(job)
    assert trainer.tau_off == "train.eval.every=-1" and trainer.prompts is None
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    assert len(rows) == 5 and not any("eval/tau" in r for r in rows)
