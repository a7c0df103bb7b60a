"""A checkpoint read ahead into host memory loads exactly as the files do (weights, AdamW
state, settings, gradient buffers kept), refuses what a load refuses, gives nothing for
another folder or a failed read, and leaves its host tensors to the drafter's save buffers.
Non-tensor values of a DCP checkpoint are unpickled without running code on either path."""

import warnings

import pytest
import torch
from torch import nn

from pipeline.checkpoint import sharded
from pipeline.checkpoint.host_copy import HostPool
from pipeline.checkpoint.read_ahead import ReadAhead, read
from pipeline.checkpoint.writer import AsyncSaver
from pipeline.dist.rendezvous import destroy_group, pick_master
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.training.config import OptimConfig
from pipeline.workers.drafter_worker import DrafterWorker


class _Net(nn.Module):
    """Dotted parameter names, two parameter groups (weights decayed, norms not)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, width), nn.LayerNorm(width)),
                                     nn.Sequential(nn.Linear(width, 4))])

    def forward(self, x):
        return self.blocks[1](self.blocks[0](x))


def _optimizer(model):
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    rest = [p for n, p in model.named_parameters() if p.ndim != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=1e-2)


def _fresh(width=16):
    model = _Net(width)
    return model, _optimizer(model)


def _saved(folder, threads=2):
    """A model trained two steps, saved in ``threads`` files; the model and optimizer."""
    torch.manual_seed(0)
    model, optim = _fresh()
    for _ in range(2):
        model(torch.randn(3, 8)).sum().backward()
        optim.step()
    saver = AsyncSaver(HostPool([], pin=False), group=None, owner=True, threads=threads)
    saver.start(lambda: sharded.drafter_state(model, optim),
                lambda: {"steps_done": 2}, folder, 2)
    (done,) = saver.wait()
    assert done.error is None
    return model, optim


def _step(model, optim):
    torch.manual_seed(1)
    model(torch.randn(3, 8)).sum().backward()
    optim.step()


def test_read_ahead_loads_exactly_what_the_files_load(tmp_path):
    model, optim = _saved(tmp_path)
    from_files, files_optim = _fresh()
    sharded.load(from_files, files_optim, tmp_path, group=None)
    from_host, host_optim = _fresh()
    grads = [torch.zeros_like(p) for p in from_host.parameters()]
    for p, g in zip(from_host.parameters(), grads):
        p.grad = g  # the replicated trainer's own buffers: a load keeps them
    host = read(tmp_path, pin=False)
    sharded.load(from_host, host_optim, tmp_path, group=None, host=host)
    assert all(p.grad is g for p, g in zip(from_host.parameters(), grads))
    for got, want in ((from_host, model), (from_files, model)):
        for (name, a), b in zip(got.state_dict().items(), want.state_dict().values()):
            assert torch.equal(a, b), name
    a, b = host_optim.state_dict(), files_optim.state_dict()
    assert a["param_groups"] == b["param_groups"] == optim.state_dict()["param_groups"]
    for i, state in b["state"].items():
        for key, t in state.items():
            assert torch.equal(a["state"][i][key], t), (i, key)
    # Trained on from there, the two go on alike.
    for p in from_host.parameters():
        p.grad = None
    _step(from_host, host_optim)
    _step(from_files, files_optim)
    for a, b in zip(from_host.parameters(), from_files.parameters()):
        assert torch.equal(a, b)


def test_single_process_reads_say_nothing_the_user_cannot_act_on(tmp_path):
    """DCP warns on each call without a process group; an export and a read-ahead mean it."""
    _saved(tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        read(tmp_path, pin=False)
        sharded.load_weights(_Net(), tmp_path)
        sharded.load(*_fresh(), tmp_path, group=None)
    assert [str(w.message) for w in seen] == []


def test_a_drafter_of_another_shape_is_refused_naming_the_tensor(tmp_path):
    _saved(tmp_path)
    host = read(tmp_path, pin=False)
    model, optim = _fresh(width=17)
    with pytest.raises(RuntimeError, match=r"model.blocks.0.0.weight is \(16, 8\) in the "
                                           r"checkpoint, \(17, 8\) in the drafter"):
        sharded.load(model, optim, tmp_path, group=None, host=host)
    bigger = _Net()
    bigger.extra = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="lacks 2 of the drafter's weights, e.g. "
                                           "model.extra"):
        sharded.load(bigger, _optimizer(bigger), tmp_path, group=None, host=host)
    model = _Net()
    one_group = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(RuntimeError, match="other parameter groups"):
        sharded.load(model, one_group, tmp_path, group=None, host=host)


def test_on_the_host_the_optimizer_keeps_the_read_tensors_and_the_weights_are_spare(tmp_path):
    _saved(tmp_path)
    host = read(tmp_path, pin=False)
    model, optim = _fresh()
    sharded.load(model, optim, tmp_path, group=None, host=host)
    moments = {t.data_ptr() for s in optim.state.values() for t in s.values()}
    read_ptrs = {t.data_ptr() for t in host.tensors()}
    assert moments <= read_ptrs  # nothing copied for the optimizer
    spare = host.spare(optim)
    assert {t.data_ptr() for t in spare} == read_ptrs - moments
    assert len(spare) == len(list(model.parameters()))  # the weights' copies


def test_a_crafted_optimizer_setting_is_refused_and_runs_nothing(tmp_path, runs_code):
    model, optim = _fresh()
    state = sharded.drafter_state(model, optim)
    marker = tmp_path / "ran"
    state["optimizer"]["param_groups"][0]["lr"] = runs_code(marker)
    sharded.save(state, tmp_path, group=None)
    for load in (lambda: sharded.load(*_fresh(), tmp_path, group=None),
                 lambda: read(tmp_path, pin=False)):
        with pytest.raises(ValueError, match="refused to load optimizer.param_groups.0.lr: "
                                             ".*could run code"):
            load()
    assert not marker.exists()


def test_another_folder_or_a_failed_read_gives_nothing_and_the_load_says_why(tmp_path,
                                                                             caplog):
    _saved(tmp_path / "a")
    _saved(tmp_path / "b")
    ahead = ReadAhead.start(tmp_path / "a", pin=False)
    assert ahead.take(tmp_path / "b") is None
    assert ReadAhead.start(tmp_path / "b", pin=False).take(tmp_path / "b") is not None
    data = tmp_path / "b" / "drafter" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:64])
    ahead = ReadAhead.start(tmp_path / "b", pin=False)
    assert ahead.take(tmp_path / "b") is None
    with pytest.raises(ValueError, match=r"drafter/__0_0.distcp: not a readable checkpoint "
                                         r"file \(EOFError"):
        sharded.load(*_fresh(), tmp_path / "b", group=None)
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / sharded.LEGACY_FILE).write_bytes(b"")
    with caplog.at_level("INFO", logger="pipeline.checkpoint.read_ahead"):
        assert ReadAhead.start(tmp_path / "legacy", pin=False) is None
    assert "not reading" in caplog.text and "not a DCP checkpoint" in caplog.text


def test_a_pool_given_tensors_allocates_only_what_it_lacks():
    specs = [((4, 2), torch.float32)] * 3 + [((5,), torch.float32)]
    pool = HostPool(specs, pin=False, fill=False)
    given = [torch.empty(4, 2), torch.empty(4, 2)]
    pool.release(given)
    pool.fill()
    taken = [pool.acquire((4, 2), torch.float32) for _ in range(3)]
    assert [t is g for t, g in zip(taken[1:], reversed(given))] == [True, True]
    assert not any(taken[0] is g for g in given)
    assert tuple(pool.acquire((5,), torch.float32).shape) == (5,)
    assert pool._free == {((4, 2), torch.float32): [], ((5,), torch.float32): []}


def drafter_worker(target_dir, target_config, checkpoint=None, device="cpu"):
    options = DrafterConfig(num_layers=1, block_size=4, num_taps=2, mask_token_id=95,
                            num_anchors=4)
    return DrafterWorker(rank=0, world_size=1, spec=build_drafter_spec(target_config, options),
                         options=options, optim=OptimConfig(), seed=0,
                         target_path=str(target_dir), device=device, autocast_dtype=None,
                         feature_dtype=torch.float32, feature_numel=16, total_steps=4,
                         checkpoint=checkpoint)


def saved_by_a_drafter(folder, target_dir, target_config, device="cpu"):
    """A drafter worker with moved weights and AdamW state, saved into ``folder``."""
    first = drafter_worker(target_dir, target_config, device=device)
    master = pick_master()
    first.init_group(master.addr, master.port)
    try:
        with torch.no_grad():
            for p in first.trainer.model.parameters():
                p.add_(torch.randn_like(p))
        sharded.init_optimizer_state(first.trainer.optimizer)
        first.save_checkpoint(str(folder))
        (done,) = first.wait_saves()
        assert done.error is None
    finally:
        destroy_group()
    return first


def test_a_drafter_told_its_checkpoint_loads_it_read_ahead_into_its_save_buffers(
        tmp_path, random_target_dir, target_config):
    first = saved_by_a_drafter(tmp_path, random_target_dir, target_config)
    second = drafter_worker(random_target_dir, target_config, checkpoint=str(tmp_path))
    assert second.read_ahead is not None
    master = pick_master()
    second.init_group(master.addr, master.port)
    try:
        host = second.read_ahead.take(tmp_path)
        second.read_ahead.take = lambda folder: host  # the same read, seen by the load
        assert second.load_checkpoint(str(tmp_path)) == first.trainer.steps_done
        assert second.load_seconds().keys() == {"waited for the read-ahead",
                                                "copied from host memory"}
        for a, b in zip(second.trainer.model.parameters(), first.trainer.model.parameters()):
            assert torch.equal(a, b)
        for a, b in zip(second.trainer.optimizer.state.values(),
                        first.trainer.optimizer.state.values()):
            assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
        # The weights' read copies are save buffers now (none allocated twice); the moments'
        # are the optimizer's own on the host, and never a save buffer.
        spare = {id(t) for t in host.spare(second.trainer.optimizer)}
        pooled = {id(t) for ts in second.saver.pool._free.values() for t in ts}
        assert spare and spare <= pooled
        moments = {id(t) for s in second.trainer.optimizer.state.values() for t in s.values()}
        assert not moments & pooled
    finally:
        destroy_group()
