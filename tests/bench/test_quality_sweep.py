"""bench/quality_sweep.py: every variant is a config the trainers accept, the bench's own
overrides plus the variant's, with nothing demo_sweep sets itself given twice."""

from pathlib import Path

import pytest

from bench.quality.scale import GPU
from bench.quality_sweep import VARIANTS, variant_command
from pipeline.driver.compose import compose_job


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_composes_with_its_knob_last(name, tmp_path):
    cmd = variant_command(GPU, Path("/work"), name, "4,8")
    args = cmd[cmd.index(name) + 1:]
    assert tuple(args[len(args) - len(VARIANTS[name]):]) == VARIANTS[name]
    overrides = [a for a in args if not a.startswith("--")]  # demo_sweep's own flags
    assert not [o for o in overrides if o.startswith(("train.eval.every=", "train.out_dir="))]
    job = compose_job(overrides + ["train.eval.every=-1", f"train.out_dir={tmp_path}"])
    base_job = compose_job(overrides[:len(overrides) - len(VARIANTS[name])]
                           + ["train.eval.every=-1", f"train.out_dir={tmp_path}"])
    for override in (v for v in VARIANTS[name] if not v.startswith("--")):
        key, value = override.split("=")
        got, before = _field(job, key), _field(base_job, key)
        assert (got == float(value)) if isinstance(got, float) else str(got) == value
        # A knob equal to the bench's own setting would measure nothing (init_target_layers
        # did, while the bench inherited that init from the demo's preset).
        assert got != before, f"{name}: {key} is already {before} in the bench's recipe"


def _field(job, key: str):
    node = job
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_wsd_holds_the_peak_then_decays_to_the_floor():
    from bench.demo_sweep import wsd_factor

    factors = [wsd_factor(s, 100, 0.05, 0.1) for s in range(100)]
    assert factors[0] == pytest.approx(0.2) and factors[4] == 1.0  # 5 warmup steps
    assert set(factors[5:81]) == {1.0}  # stable until the last 20 steps
    assert all(a > b for a, b in zip(factors[80:], factors[81:]))
    assert wsd_factor(100, 100, 0.05, 0.1) == pytest.approx(0.1)


def test_use_wsd_drives_the_trainers_lr(tmp_path):
    from bench.demo_sweep import use_wsd
    from pipeline.reference.trainer import SingleProcessTrainer

    job = compose_job(["train.plan.max_steps=20", "train.eval.every=-1",
                       f"train.out_dir={tmp_path}"])
    trainer = SingleProcessTrainer(job)
    use_wsd(trainer, trainer.drafter.total_steps)
    for plan in trainer.plans[:6]:
        trainer.run_step(plan)
    # Cosine would be past its peak by now; warmup-stable-decay holds it until step 16.
    assert trainer.drafter.optimizer.param_groups[0]["lr"] == job.train.optim.lr
