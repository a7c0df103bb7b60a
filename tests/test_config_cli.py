"""A config mistake on an entry point's command line: one line, rc 2, before Hydra and Ray."""

import enum
import subprocess
import sys
from pathlib import Path
from typing import Literal, Optional

import pytest

from pipeline.job.config import check_command_line, check_overrides
from pipeline.checks.config_keys import expected

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module,override,line", [
    ("pipeline.train", "train.optim.lrr=1e-3",
     "error: train.optim.lrr is not a config key; did you mean train.optim.lr?"),
    ("pipeline.train", "train.plan.max_steps=abc",
     "error: train.plan.max_steps=abc: expected an int"),
    ("pipeline.train", "cluster=nope",
     "error: cluster=nope: config group cluster has no option 'nope'; available: local, "
     "node8, one_gpu"),
    ("pipeline.train_single", "train.checkpoint.final=maybe",
     "error: train.checkpoint.final=maybe: expected true or false"),
])
def test_the_cli_refuses_a_config_mistake_in_one_line(tmp_path, module, override, line):
    # Hydra said this in 7-8 lines with rc 1 (and suggested '+key', which was then refused).
    proc = subprocess.run([sys.executable, "-m", module, override, f"train.out_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 2, out
    assert len(out) == 1 and out[0].startswith(line), out
    # Refused before Hydra ran the job: no launch folder (Hydra's run dir), so no Ray either.
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides,match", [
    (["train.optim.lrr=1e-3"], r"^train.optim.lrr is not a config key; did you mean "
                               r"train.optim.lr\? \(train.optim has betas, "),
    (["+train.optim.lrr=1e-3"], r"^train.optim.lrr is not a config key; did you mean"),
    (["clustr=node8"], r"^clustr is not a config key; did you mean cluster\?"),
    (["train.plan.max_steps=abc"], r"^train.plan.max_steps=abc: expected an int or null$"),
    (["train.optim.lr=fast"], r"^train.optim.lr=fast: expected a float$"),
    (["train.checkpoint.read_ahead=maybe"],
     r"^train.checkpoint.read_ahead=maybe: expected true, false or null$"),
    (["train.optim.betas=[a,b]"], r"^train.optim.betas=\[a,b\]: expected a list of float$"),
    (["train.plan=5"], r"^train.plan=5: train.plan is a section: set its keys one by one"),
    (["cluster=nope"], r"^cluster=nope: .*available: local, node8, one_gpu$"),
    (["train=nope"], r"^train=nope: .*available: demo, qwen3_8b, smollm2_135m$"),
    (["hydra/job_logging=nope"], r"^hydra/job_logging=nope: .*available: default, disabled"),
    (["hydra.run.dirr=x"], r"^hydra.run.dirr is not a config key; did you mean hydra.run.dir\?"),
    (["+train.seed=3"], r"^\+train.seed=3: train.seed is a config key already: set it without"),
    (["train.optim.lr=[1"], r"^'train.optim.lr=\[1' is not a valid override"),
    (["train.seed=${oops}"], r"^train.seed=\$\{oops\}: Interpolation key 'oops' not found$"),
    (["train.lr=1"], r"^train.lr has moved: use train.optim.lr"),
])
def test_each_mistake_is_one_line_naming_key_value_and_what_is_allowed(overrides, match):
    with pytest.raises(ValueError, match=match) as caught:
        check_overrides(overrides)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("argv", [
    ["--config-name", "qwen3_8b", "train.optim.lrr=1"],
    ["-cn", "qwen3_8b", "train.optim.lrr=1"],
    ["--cfg", "job", "train.optim.lrr=1"],
])
def test_hydra_flags_are_read_and_the_overrides_still_checked(argv):
    with pytest.raises(ValueError, match="did you mean train.optim.lr"):
        check_command_line(argv)


def test_an_unknown_config_name_names_the_available_ones():
    with pytest.raises(ValueError, match=r"--config-name nope: .*available: config, qwen3_8b"):
        check_command_line(["--config-name", "nope"])


@pytest.mark.parametrize("argv", [
    [],
    ["--cfg", "job", "--config-name", "qwen3_8b", "drafter.num_layers=3"],
    ["+logger.wandb_init.tags=[8b,ablation]", "++logger.wandb_init.group=sweep1"],
    ["hydra.run.dir=/tmp/x", "hydra.job.chdir=false", "hydra/job_logging=disabled"],
    ["logger=wandb", "cluster=node8", "++train.seed=3", "train.plan.max_steps=null"],
    ["--help"], ["--multirun", "train.seed=1,2"],  # left to Hydra
])
def test_good_command_lines_pass(argv):
    check_command_line(argv)


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@pytest.mark.parametrize("hint,words", [
    (int, "an int"), (Optional[int], "an int or null"), (bool, "true or false"),
    (tuple[int, ...], "a list of int"), (Literal["sdpa", "flex"], "one of ['sdpa', 'flex']"),
    (Color, "one of ['RED', 'BLUE']"), (Optional[Literal["a"]], "one of ['a'] or null"),
])
def test_expected_names_closed_choices_and_types(hint, words):
    assert expected(hint) == words
