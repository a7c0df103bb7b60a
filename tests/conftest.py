"""Fixtures shared by the whole suite: a small random Qwen3 target and a drafter for it, and a
value whose unpickling runs code (for the loads that must refuse it)."""

import os
import time
from pathlib import Path

# Under pytest-xdist several workers share the cores: one torch thread each (and in the CLIs,
# Ray clusters and subprocesses they start), since OpenMP threads that wait for each other on
# an oversubscribed machine run many times slower. Set before torch is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM

from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.target import load_target, load_target_head
from pipeline.runtime.ray_start import LOCAL_SYSTEM_CONFIG, init_local

VOCAB = 96
MASK_ID = 95
# The suite's local Ray, started by init_local as the driver starts its own (its actors start
# without a runtime_env); a test that needs another cluster brings this one back afterwards.
RAY_TEST_INIT = {"num_cpus": 8, "include_dashboard": False, "logging_level": "WARNING",
                 "_system_config": LOCAL_SYSTEM_CONFIG}


def pytest_sessionstart(session):
    """Under pytest-xdist (``-n N``), build the tiny assets in the controlling process before
    the workers start: built inside a worker, the build's threads would compete with the other
    workers' tests (and its test's timeout would count that). Built or not, one check."""
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from pipeline.assets import ensure_tiny_assets
        ensure_tiny_assets()


def pytest_terminal_summary(terminalreporter, config):
    """Under xdist, the machine's speed beside the suite's time: the CPU a fresh ``import
    torch`` takes, measured once the tests are done. The suite is CPU-bound and most of its
    processes pay that import, so its time follows this figure (the 2-core development
    machine: 1.7 CPU-s at its usual speed, 2.1 in a slow stretch that took the suite from
    about 12 to 14 minutes; docs/BENCHMARKS.md)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    import resource
    import subprocess
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode == 0:
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        terminalreporter.write_line(f"machine speed: a fresh `import torch` took {cpu:.2f} "
                                    "CPU-s (1.7 on the development machine at its usual speed)")


# Module-scoped fixtures that cost nothing to build again on another xdist worker.
_CHEAP_MODULE_FIXTURES = {"ray_session"}

# The files that take longest (each a minute or more of training jobs and CLI runs on 2 cores,
# measured 2026-12-03; the driver's death and the run folder's CLI runs moved down after
# they went to one drafter), handed out first under xdist so that the short tests fill in
# around them instead of one long file running alone at the end. Only an order: a file
# missing here runs later, in collection order.
_START_FIRST = [
    "tests/bench/test_peers.py", "tests/driver/test_checkpoint_dcp.py",
    "tests/driver/test_contract.py",
    "tests/driver/test_recovery.py", "tests/driver/test_bucket_pipeline.py",
    "tests/driver/test_equivalence.py", "tests/launch/test_job_submit.py",
    "tests/bench/test_real_model.py", "tests/driver/test_disk_full.py",
    "tests/driver/test_driver_killed.py", "tests/driver/test_run_folder_cli.py",
    "tests/driver/test_bad_data_cli.py", "tests/driver/test_eval_failures.py",
    "tests/assets/test_build.py", "tests/driver/test_stages.py",
    "tests/driver/test_sigterm_cli.py", "tests/driver/test_eval_offpath.py",
    "tests/driver/test_resume.py", "tests/driver/test_families_train.py",
    "tests/driver/test_train_cli.py", "tests/driver/test_logging_export.py",
    "tests/driver/test_multinode.py", "tests/regen/test_regen_prompts.py",
    "tests/bench/test_stages_bench.py", "tests/driver/test_nonfinite.py",
]


def pytest_configure(config):
    """Under xdist, hand work out in the order of the collection (the long files first, see
    pytest_collection_modifyitems), not xdist's default of the groups with most tests first."""
    if getattr(config.option, "numprocesses", None) and hasattr(config.option,
                                                                "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``-n N --dist loadgroup`` (pytest-xdist), keep a module's tests on one worker when
    they share an expensive module-scoped fixture (a set of actors, a training run whose outputs
    several tests check), so it is built once; every other test is handed out on its own.
    Without xdist the mark does nothing."""
    for item in items:
        # The quick tier (-m "not slow") leaves out every test that starts Ray: a local
        # cluster and its actors cost seconds of CPU each, most of the suite's time.
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        if any(name not in _CHEAP_MODULE_FIXTURES and fixturedefs[-1].scope == "module"
               for name, fixturedefs in defs.items()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if not hasattr(config, "workerinput"):
        return
    rank = {path: i for i, path in enumerate(_START_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after xdist's
def pytest_collection_modifyitems_group_ids(config, items):
    """pytest-xdist 3.8 groups a test by appending ``@group`` to ``item._nodeid``, which
    pytest 9.1+ no longer reads (a node's id is ``item._id``): the mark was silently ignored,
    every test was handed out on its own and each module-scoped fixture (a CLI run, a chain
    of training jobs) was built on both workers. Where xdist's suffix is missing, add it."""
    if not hasattr(config, "workerinput") or not config.getoption("loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid:
            continue
        grouped = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):
            item._id = type(item._id).parse(grouped)
        else:
            item._nodeid = grouped


def _save_random_target(path, head_dim: int):
    """A small random-weight Qwen3 saved with save_pretrained (the real loading path)."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=4 * head_dim, intermediate_size=64,
                      num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=head_dim, max_position_embeddings=256, tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def random_target_dir(tmp_path_factory):
    return _save_random_target(tmp_path_factory.mktemp("target"), head_dim=8)


@pytest.fixture(scope="session")
def wide_target_dir(tmp_path_factory):
    """The same with head_dim 16: compiled flex attention on CUDA needs at least 16."""
    return _save_random_target(tmp_path_factory.mktemp("wide_target"), head_dim=16)


@pytest.fixture(scope="session")
def production_heads_target_dir(tmp_path_factory):
    """head_dim 128, as Qwen3-8B's: the shape the GPU tier compiles flex attention at."""
    return _save_random_target(tmp_path_factory.mktemp("production_heads_target"), head_dim=128)


@pytest.fixture(scope="session")
def target_config(random_target_dir):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(random_target_dir).to_dict()


@pytest.fixture()
def drafter_setup(random_target_dir, target_config):
    """(drafter, target features, head, spec, options) with block size 4 and 3 taps."""
    torch.manual_seed(1)
    options = DrafterConfig(num_layers=2, block_size=4, num_taps=3, mask_token_id=MASK_ID,
                            num_anchors=6, loss_chunk_size=7)
    spec = build_drafter_spec(target_config, options)
    drafter = DFlashDrafter(spec)
    target = load_target(random_target_dir, spec.target_layer_ids, "cpu", torch.float32)
    return drafter, target, load_target_head(random_target_dir), spec, options


@pytest.fixture(scope="session")
def tiny_tokenizer():
    # Only the tokenizer of the tiny assets (same recipe, so the same vocabulary), built in
    # about a second: the data tests need no model.
    from pipeline.assets.corpus import pydoc_topics
    from pipeline.assets.recipe import TinyRecipe
    from pipeline.assets.tokenizer import build_tokenizer

    return build_tokenizer([text for _, text in pydoc_topics()], TinyRecipe().vocab_size)


@pytest.fixture(scope="session")
def tiny_assets():
    """The embedded demo assets, built once (cached under DFLASH_ASSETS_DIR or ~/.cache)."""
    from pipeline.assets import ensure_tiny_assets
    return ensure_tiny_assets()


@pytest.fixture(scope="session")
def ray_init_args():
    """How the suite starts its local Ray, ``init_local(**ray_init_args)`` (a test that needs
    another cluster restores it so)."""
    return RAY_TEST_INIT


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance for the whole session (real actors, CPU).

    Its jobs keep their actors for the next job that asks for the same ones
    (pipeline.runtime.actor_pool.keep_actors), as a sweep of jobs would: a kept process is built again
    in place instead of starting a Ray worker and importing torch and the model code anew,
    which halves what a job in the suite costs. They serve every module's jobs: a job that
    needs other placement groups removes the kept ones first, and at most two are kept outside
    a group, so what they hold while idle leaves the tests' own actors room. A new layout, a
    restart and every CLI run still start new actors. DFLASH_KEEP_ACTORS=0 starts every actor
    anew."""
    import ray

    from pipeline.runtime.actor_pool import drop_kept_actors, keep_actors
    from pipeline.transport.shared import remove_dead_manager_folders

    keep = os.environ.get("DFLASH_KEEP_ACTORS", "1")
    if keep not in ("0", "1"):
        raise pytest.UsageError(f"DFLASH_KEEP_ACTORS={keep}: allowed 0, 1")
    if keep == "1":
        keep_actors()
    started = not ray.is_initialized()
    if started:
        init_local(**RAY_TEST_INIT)
    yield
    drop_kept_actors()
    if started:
        ray.shutdown()
    for wait_s in (0.0, 1.0):  # the kept actors' shm managers go with the cluster
        time.sleep(wait_s)
        remove_dead_manager_folders()


@pytest.fixture(scope="module")
def ray_session(request, ray_cluster):
    """Ray, with this test module's classes pickled by value.

    Workers cannot import test modules by name: pytest put their folders on this process's
    sys.path only. By value, the plain classes defined in a test travel whole.
    """
    import ray

    ray.cloudpickle.register_pickle_by_value(request.module)
    yield
    ray.cloudpickle.unregister_pickle_by_value(request.module)


@pytest.fixture()
def gpus_free(ray_session):
    """Ray with no kept actors: the kept placement groups of earlier jobs in this process hold
    GPU shares, and a test that places GPU actors of its own would wait for them forever."""
    from pipeline.runtime.actor_pool import drop_kept_actors

    drop_kept_actors()


@pytest.fixture(scope="session")
def small_train_file(tiny_assets, tmp_path_factory):
    """The first 24 conversations of the demo data: enough for a few steps, fast to load."""
    path = tmp_path_factory.mktemp("data") / "small.jsonl"
    lines = open(tiny_assets.train_path).read().splitlines()[:24]
    path.write_text("\n".join(lines) + "\n")
    return path


def _greedy_tokens(target, prompt, n):
    """``n`` tokens of ``target``'s greedy decoding of ``prompt``, re-reading the whole text
    each step (no cache: nothing of a family's cache rollback is in this reference)."""
    seq = torch.tensor(prompt)[None]
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, target(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[0, len(prompt):].tolist()


@pytest.fixture(scope="session")
def greedy_tokens():
    """``greedy_tokens(target, prompt, n)``: the uncached greedy reference decoding."""
    return _greedy_tokens


@pytest.fixture(scope="session")
def family_target(tmp_path_factory):
    """``family_target("llama")``: the folder of a tiny random-weight target of that family,
    built by transformers and saved with its family's tokenizer (pipeline/assets/
    family_targets.py); built once per session, on first use."""
    from pipeline.assets.family_targets import ensure_family_target, tiny_base_tokenizer

    root = tmp_path_factory.mktemp("family_targets")
    base = []

    def get(model_type: str) -> str:
        if not base:
            base.append(tiny_base_tokenizer())
        return ensure_family_target(model_type, root=str(root), base_tokenizer=base[0])
    return get


class _RunsCode:
    """What a hostile checkpoint holds: unpickling it calls a function of the file's choice
    (here: writes ``marker``, so a test can tell whether a load ran it)."""

    def __init__(self, marker):
        self.marker = Path(marker)

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


@pytest.fixture()
def runs_code():
    """``runs_code(marker)``: a value whose unpickling writes ``marker``."""
    return _RunsCode
