"""bench/quality_sweep.py: every variant is a config the trainers accept, the bench's own
overrides plus the variant's, with nothing demo_sweep sets itself given twice."""

from pathlib import Path

import pytest

from bench.quality.scale import TINY
from bench.quality_sweep import VARIANTS, variant_command
from pipeline.driver.compose import compose_job


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_composes_with_its_knob_last(name, tmp_path):
    cmd = variant_command(TINY, Path("/work"), name, "4,8")
    overrides = cmd[cmd.index(name) + 1:]
    assert tuple(overrides[len(overrides) - len(VARIANTS[name]):]) == VARIANTS[name]
    assert not [o for o in overrides if o.startswith(("train.eval.every=", "train.out_dir="))]
    job = compose_job(overrides + ["train.eval.every=-1", f"train.out_dir={tmp_path}"])
    for override in VARIANTS[name]:
        key, value = override.split("=")
        section, field = key.rsplit(".", 1)
        node = job
        for part in section.split("."):
            node = getattr(node, part)
        got = getattr(node, field)
        assert (got == float(value)) if isinstance(got, float) else str(got) == value
