"""The objective's config keys: accepted values reach the Objective, bad ones stop the job in
one line naming the key and what is allowed, before anything starts."""

import pytest

from pipeline.driver.compose import compose_job
from pipeline.model.config import DrafterConfig, build_drafter_spec, qwen3_8b_config
from pipeline.objective.linear_ce import Distill
from pipeline.objective.step import Objective

# The demo preset (conf/drafter/tiny.yaml) sets gamma 1.0, which D-PACE has no use for.
DPACE = ["drafter.position_weights=dpace", "drafter.gamma=null"]


@pytest.mark.parametrize("overrides,match", [
    (["drafter.position_weights=acceptance"],
     r"^drafter.position_weights='acceptance' is not allowed: expected one of "
     r"\['decay', 'dpace'\]$"),
    (DPACE + ["drafter.dpace_alpha=0"], r"^drafter.dpace_alpha=0.0 .*in \(0, 1\]$"),
    (DPACE + ["drafter.dpace_alpha=1.5"], r"^drafter.dpace_alpha=1.5 .*in \(0, 1\]$"),
    (["drafter.dpace_alpha=0.3"],
     r"^drafter.dpace_alpha=0.3 .*0.5 \(unused\) unless drafter.position_weights=dpace$"),
    (["drafter.position_weights=dpace"],
     r"^drafter.gamma=1.0 .*null with drafter.position_weights=dpace"),
    (["drafter.distill_weight=-0.1"], r"^drafter.distill_weight=-0.1 .*in \[0, 1\]"),
    (["drafter.distill_weight=1.5"], r"^drafter.distill_weight=1.5 .*in \[0, 1\]"),
    (["drafter.distill_weight=0.5", "drafter.distill_temperature=0"],
     r"^drafter.distill_temperature=0.0 .*> 0$"),
    (["drafter.distill_temperature=2"],
     r"^drafter.distill_temperature=2.0 .*1.0 \(unused\) unless drafter.distill_weight > 0$"),
    (["drafter.distill_weight=0.5", "target.stages=2"],
     r"^drafter.distill_weight=0.5 .*0 with target.stages > 1"),
])
def test_bad_values_are_refused_in_one_line(overrides, match):
    with pytest.raises(ValueError, match=match) as err:
        compose_job(overrides)
    assert "\n" not in str(err.value)


def test_accepted_values_reach_the_objective():
    spec = build_drafter_spec(qwen3_8b_config(), DrafterConfig(mask_token_id=151669))
    plain = Objective.from_config(spec, compose_job([]).drafter)
    assert plain.gamma == 1.0 and plain.dpace_alpha is None and plain.distill is None
    job = compose_job(DPACE + ["drafter.dpace_alpha=0.3", "drafter.distill_weight=0.25",
                               "drafter.distill_temperature=2"])
    objective = Objective.from_config(spec, job.drafter)
    assert objective.gamma is None and objective.dpace_alpha == 0.3
    assert objective.distill == Distill(0.25, 2.0)
    assert DrafterConfig().position_weights == "decay" and DrafterConfig().dpace_alpha == 0.5
    assert DrafterConfig().distill_weight == 0.0 and DrafterConfig().distill_temperature == 1.0
