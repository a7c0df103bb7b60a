"""Config groups and presets compose; mistakes stop the job before any actor starts."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from pipeline.job.config import reads_ahead, weights_ring
from pipeline.driver.compose import CONF_DIR, compose_job
from pipeline.driver.job import Driver
from pipeline.driver.launcher import check_gpu_layout

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF_DIR.glob("*.yaml")))
def test_every_preset_composes(name):
    job = compose_job(config_name=name)
    assert job.train.optim.lr > 0 and job.cluster.num_drafters >= 1


def test_qwen3_8b_preset_is_the_published_recipe():
    job = compose_job(config_name="qwen3_8b")
    d = job.drafter
    assert d.target_layer_ids == [1, 9, 17, 25, 33] and d.block_size == 16
    assert d.num_layers == 5 and d.num_anchors == 512 and d.resolved_gamma() == 7.0
    assert job.train.optim.lr == 6e-4 and job.data.max_length == 3072
    assert job.train.checkpoint.resume == "auto" and job.train.eval.prompts == 64


def test_the_8b_preset_takes_another_max_length_alone():
    """The preset's buckets follow data.max_length: a shorter length is one override (the
    e2e benchmark's 800-token run was refused when the preset listed buckets up to 3072)."""
    job = compose_job(["data.max_length=800"], config_name="qwen3_8b")
    assert job.data.resolved_buckets()[-1] == 800
    bucketed = compose_job(["data.max_length=800", "data.batching=bucket"],
                           config_name="qwen3_8b")
    assert bucketed.data.resolved_buckets()[-1] == 800


def test_group_selection_and_overrides():
    job = compose_job(["logger=wandb", "cluster=node8", "drafter.gamma=5.5",
                       "+logger.wandb_init.tags=[a,b]"])
    assert job.logger.wandb_init == {"tags": ["a", "b"]}
    assert job.logger.kind == "wandb" and job.cluster.drafters_per_node == 5
    assert job.drafter.gamma == 5.5


@pytest.mark.parametrize("override,match", [
    (["train.learning_rate=1"], "train.learning_rate"),     # unknown key
    (["train.optim.lr=fast"], "train.optim.lr"),            # wrong type
])
def test_unknown_key_and_wrong_type_name_the_key(override, match):
    with pytest.raises(ConfigCompositionException, match=match):
        compose_job(override)


@pytest.mark.parametrize("override,match", [
    ("drafter.attention=xformers", r"drafter.attention='xformers'.*\['sdpa', 'flex'\]"),
    ("cluster.device=tpu", r"cluster.device='tpu'.*\['auto', 'cpu', 'cuda'\]"),
    ("train.optim.warmup_ratio=1.5", r"train.optim.warmup_ratio=1.5.*\[0, 1\)"),
    ("train.eval.every=-2", r"train.eval.every=-2.*>= -1"),
    ("data.on_bad_line=ignore", r"data.on_bad_line='ignore'.*\['error', 'skip'\]"),
    ("cluster.collective_timeout_s=0", r"cluster.collective_timeout_s=0.*> 0 seconds"),
    ("train.eval.gpus=1.5", r"train.eval.gpus=1.5.*in \(0, 1\]"),
    ("data.max_line_bytes=0", r"data.max_line_bytes=0.*an integer >= 2"),
    ("train.checkpoint.write_threads=0", r"train.checkpoint.write_threads=0.*1..64"),
])
def test_bad_values_name_the_key_and_allowed(override, match):
    with pytest.raises(ValueError, match=match):
        compose_job([override])


def test_read_ahead_is_refused_under_fsdp_and_taken_otherwise():
    with pytest.raises(ValueError, match=r"train.checkpoint.read_ahead=True .*false or null under "
                                         r"drafter.parallel=fsdp"):
        compose_job(["train.checkpoint.read_ahead=true", "drafter.parallel=fsdp"])
    assert compose_job(["train.checkpoint.read_ahead=true"]).train.checkpoint.read_ahead


@pytest.mark.parametrize("overrides, on", [
    ([], True),  # the default: wherever it applies
    (["drafter.parallel=fsdp"], False),  # ... which fsdp is not
    (["train.checkpoint.read_ahead=false"], False),
    (["train.checkpoint.read_ahead=true"], True),
    (["train.checkpoint.read_ahead=false", "drafter.parallel=fsdp"], False),
])
def test_read_ahead_defaults_to_on_where_it_applies(overrides, on):
    assert reads_ahead(compose_job(overrides)) is on


def test_read_ahead_takes_null_for_its_default():
    assert compose_job(["train.checkpoint.read_ahead=null"]).train.checkpoint.read_ahead is None


@pytest.mark.parametrize("overrides, ring", [
    ([], None),  # the default: the ring where the evaluator shares rank 0's node
    (["train.eval.weights_ring=true"], True),
    (["train.eval.weights_ring=false"], False),
    (["drafter.parallel=fsdp"], False),  # full weights are gathered to host memory there
    (["train.eval.weights_ring=false", "drafter.parallel=fsdp"], False),
])
def test_the_evaluators_weights_ring_where_it_applies(overrides, ring):
    assert weights_ring(compose_job(overrides)) is ring


def test_the_weights_ring_is_refused_under_fsdp():
    with pytest.raises(ValueError, match=r"train.eval.weights_ring=True .*false or null under "
                                         r"drafter.parallel=fsdp"):
        compose_job(["train.eval.weights_ring=true", "drafter.parallel=fsdp"])


@pytest.mark.parametrize("old,new", [
    ("train.lr=1e-3", "train.optim.lr"),
    ("train.max_steps=5", "train.plan.max_steps"),
    ("+train.eval_every=2", "train.eval.every"),
    ("train.resume=auto", "train.checkpoint.resume"),
])
def test_a_moved_key_names_its_new_place(old, new):
    with pytest.raises(ValueError, match=f"has moved: use {new}"):
        compose_job([old])


def test_the_train_cli_names_the_new_key_for_a_moved_one():
    proc = subprocess.run([sys.executable, "-m", "pipeline.train", "train.lr=1e-3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "train.lr has moved: use train.optim.lr" in proc.stderr


@pytest.mark.parametrize("override,match", [
    ("drafter.target_layer_ids=[1,40]", r"target_layer_ids=\[1, 40\].*allowed 0..6"),
    # The demo vocabulary has 1024 ids (assets tiny-v3).
    ("drafter.mask_token_id=99999", r"drafter.mask_token_id=99999.*allowed 0..1023"),
])
def test_impossible_combinations_stop_before_ray(tiny_assets, tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        Driver(compose_job([override, f"train.out_dir={tmp_path}"]))  # resolved in the constructor: no Ray, no actor


def test_more_nodes_than_the_cluster_has(ray_cluster, tiny_assets, tmp_path):
    # check_cluster runs before the first actor is started (Driver.run). A fresh out_dir: the
    # default one may hold a finished demo run, whose rerun ends before any check.
    with pytest.raises(ValueError, match=r"cluster.num_nodes=3 .* 1 live node"):
        Driver(compose_job(["cluster.num_nodes=3", f"train.out_dir={tmp_path}"])).run()


@pytest.mark.slow
def test_cfg_job_prints_the_resolved_config():
    out = subprocess.run([sys.executable, "-m", "pipeline.train", "--cfg", "job",
                          "drafter.num_layers=3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "num_layers: 3" in out and "drafters_per_node: 2" in out


# The GPUs per node each cluster preset is meant for (local: CPU, or a GPU per actor plus one
# for the evaluator).
PRESET_GPUS = {"local": [4], "node8": [8], "one_gpu": [1]}


def test_every_cluster_preset_says_which_gpus_it_is_meant_for():
    assert set(PRESET_GPUS) == {p.stem for p in (CONF_DIR / "cluster").glob("*.yaml")}


@pytest.mark.parametrize("config_name", ["config", "qwen3_8b"])
@pytest.mark.parametrize("cluster", sorted(PRESET_GPUS))
def test_cluster_presets_pack_onto_the_gpus_they_are_meant_for(config_name, cluster):
    job = compose_job([f"cluster={cluster}"], config_name=config_name)
    check_gpu_layout(job.cluster, job.train.eval, PRESET_GPUS[cluster])  # eval on in both


def test_one_gpu_with_two_drafters_is_refused_before_any_actor():
    job = compose_job(["cluster=one_gpu", "cluster.drafters_per_node=2"])
    with pytest.raises(ValueError, match=r"cluster.drafters_per_node=2 .*cluster.gpus_per_"
                                         r"actor=0.45"):
        check_gpu_layout(job.cluster, job.train.eval, [1])


@pytest.mark.parametrize("override,match", [
    ("+train.optim.weight_decy=0.1", r"train.optim.weight_decy is not a config key.*did you mean "
                                     r"train.optim.weight_decay\?"),
    ("+drafter.num_layer=3", r"drafter.num_layer is not a config key.*drafter.num_layers"),
    ("+seed=1", r"seed is not a config key.*the top level has"),
    ("+cluster.rates.target_rate=2", r"cluster.rates.target_rate is not a config key"),
])
def test_a_key_added_with_plus_must_exist(override, match):
    with pytest.raises(ValueError, match=match):
        compose_job([override])


def test_free_form_sections_still_take_added_keys():
    job = compose_job(["+logger.wandb_init.group=sweep1", "+logger.wandb_init.notes=x"])
    assert job.logger.wandb_init == {"group": "sweep1", "notes": "x"}


@pytest.mark.parametrize("overrides,match", [
    (["drafter.block_size=8", "data.max_length=15"],
     r"data.max_length=15 .*>= 2 \* drafter.block_size \(16\)"),
    (["drafter.block_size=16", "data.max_length=31"], r"data.max_length=31 .*\(32\)"),
    (["drafter.block_size=8", "data.batching=bucket", "data.buckets=[8,64,256]"],
     r"data.buckets=\[8, 64, 256\] .*an? 8-token bucket can never hold"),
    (["data.batching=pack", "data.anchors_per_micro_batch=8", "drafter.num_anchors=64"],
     r"data.anchors_per_micro_batch=8 .*>= drafter.num_anchors \(64\)"),
])
def test_keys_of_different_sections_are_checked_together(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_job(overrides)


def test_the_train_cli_refuses_a_plus_typo_in_one_line_before_ray(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.train",
                           "+train.optim.weight_decy=0.1", f"train.out_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr  # Hydra's log goes to stdout
    assert proc.returncode == 2, out[-2000:]
    errors = [line for line in out.splitlines() if "weight_decy" in line]
    assert len(errors) == 1 and "did you mean train.optim.weight_decay?" in errors[0]
    assert "Traceback" not in out and "Ray" not in out
