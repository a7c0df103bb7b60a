"""The GPU tier: ``pytest -m gpu`` on a CUDA machine; everything here is marked and skipped without one.

    pytest -q -m gpu                                       # on the GPU machine
    DFLASH_GPU_TESTS_ON_CPU=1 pytest -q tests/gpu          # the same test logic on CPU

With DFLASH_GPU_TESTS_ON_CPU=1 the ``device`` fixture is "cpu" and nothing is skipped for want
of CUDA; assertions that only mean something on CUDA (memory bounds, compiled kernels) check
``on_cuda`` and are skipped there.
"""

import os
from pathlib import Path

import pytest
import torch

ON_CPU = os.environ.get("DFLASH_GPU_TESTS_ON_CPU") == "1"
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA (or DFLASH_GPU_TESTS_ON_CPU=1 to run on CPU)")
    for item in items:
        if _HERE not in Path(item.fspath).parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if not ON_CPU and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    return "cpu" if ON_CPU else "cuda"


@pytest.fixture(scope="session")
def on_cuda(device) -> bool:
    return device == "cuda"


@pytest.fixture()
def fresh_dynamo():
    """Compile caches and automatic-dynamic state as in a fresh process, before and after."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
