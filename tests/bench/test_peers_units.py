"""bench/peers.py's parts without a trainer: the runs registry, the checkpoint that stands for a
mark, throughput from step records, the lossless check."""

from pathlib import Path

import pytest

from bench.peers_steps.common import Checkpoint, Point, pick, steady_rates
from bench.peers_steps.runs import TRAINERS, runs, select
from bench.peers_steps.scale import SCALES


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_every_trainer_runs_twice_or_more_and_names_are_unique(scale):
    rows = runs(SCALES[scale])
    assert len({r.name for r in rows}) == len(rows)
    for trainer in TRAINERS:
        assert sum(r.trainer == trainer for r in rows) >= 2, trainer
    ours = {r.name: r.overrides for r in rows if r.trainer == "ours"}
    # Each of our variants is a plain list of Hydra overrides; D-PACE replaces the decay.
    assert ours["ours_ce_decay"] == ()
    assert "drafter.gamma=null" in ours["ours_dpace"]
    assert all("=" in o for o in sum(ours.values(), ()))


def test_unknown_runs_are_refused_naming_the_known_ones():
    rows = runs(SCALES["gpu"])
    assert [r.name for r in select(rows, ["speculators_recipe", "ours_dpace"])] == \
        ["ours_dpace", "speculators_recipe"]  # the registry's order
    with pytest.raises(ValueError, match="--runs nope: unknown; choose from"):
        select(rows, ["nope"])


def test_our_shape_reaches_each_peer():
    rows = {r.name: r.overrides for r in runs(SCALES["gpu"])}
    mo = rows["modelopt_our_shape"]
    assert "dflash.dflash_block_size=16" in mo and "dflash.dflash_num_anchors=256" in mo
    assert "dflash.dflash_architecture_config.target_layer_ids=[1,8,14,20,27]" in mo
    sp = rows["speculators_our_shape"]
    # speculators reads hidden_states[i], z-lab (and the pipeline) hidden_states[i + 1]
    i = sp.index("--target-layer-ids")
    assert list(sp[i + 1:i + 6]) == ["2", "9", "15", "21", "28"]
    assert "--block-size=16" in sp and "--lr=0.0015" in sp


def test_a_mark_takes_the_newest_checkpoint_by_then_else_the_first_after():
    ck = [Checkpoint(s, 100.0 + t, Path(f"s{s}")) for s, t in ((10, 5), (20, 12), (30, 21))]
    assert pick(ck, 100.0, 10.0).step == 10
    assert pick(ck, 100.0, 11.5).step == 20  # within the tolerance of 1 s
    assert pick(ck, 100.0, 60.0).step == 30
    assert pick(ck, 100.0, 2.0).step == 10  # none by then: the first one after
    assert pick([], 100.0, 5.0) is None


def test_steady_rates_leave_the_first_quarter_out():
    pts = [Point(1, 0.0, 4, 400)] + [Point(i, 10.0 + i, 4 * i, 400 * i) for i in range(2, 10)]
    r = steady_rates(pts)
    a = pts[len(pts) // 4]
    assert r["samples_per_s"] == pytest.approx((36 - a.samples) / (19 - a.time), abs=0.01)
    assert r["steady_steps"] == 9 - a.step
    assert steady_rates(pts[:2])["samples_per_s"] is None


def test_lossless_compares_over_the_targets_length():
    from bench.peers_steps.decode import lossless
    from bench.quality.reference_decode import Decoded

    plain = [[1, 2, 3], [4, 5, 6]]
    # a last round may accept past max_new_tokens: not a difference
    same = [Decoded(tokens=[1, 2, 3, 9]), Decoded(tokens=[4, 5, 6])]
    assert lossless(same, plain, 3) == {"prompts": 2, "equal": 2, "lossless": True,
                                         "first_divergence_at_token": None}
    off = [Decoded(tokens=[1, 2, 3]), Decoded(tokens=[4, 7, 6])]
    assert lossless(off, plain, 3)["first_divergence_at_token"] == 1


def test_out_is_required_except_for_the_install_alone(capsys, monkeypatch):
    from bench import peers
    from bench.peers_steps import env

    with pytest.raises(SystemExit) as stop:
        peers.main(["--scale", "tiny"])
    assert stop.value.code == 2 and "required: --out" in capsys.readouterr().err
    monkeypatch.setattr(env, "peers_env", lambda allow_install: ({}, None))
    assert peers.main(["--install-peers"]) == 0
    assert capsys.readouterr().out.strip() == "the peers import"


@pytest.mark.parametrize("argv", [["--scale", "gpu"], ["--scale", "tiny", "--device", "cuda"]])
def test_cuda_without_a_cuda_device_is_refused_in_one_line_before_any_stage(argv, tmp_path,
                                                                            capsys, monkeypatch):
    from bench import peers

    monkeypatch.setattr(peers, "_has_cuda", lambda: False)
    with pytest.raises(SystemExit) as stop:
        peers.main([*argv, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert "runs on CUDA, and this machine has no CUDA device" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
