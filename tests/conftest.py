"""Shared test set-up: no network, one torch thread, a private cache directory, seeded RNGs.

* ``HF_HUB_OFFLINE``: a hub id that is not cached fails at once instead of retrying for a minute (the
  machines that run the tests have no route to the hub). Set before transformers is imported.
* One intra-op thread: the unit tests run tiny models, where thread start-up and, on a busy 2-core
  machine, oversubscription cost far more than they gain (measured: 55 s with 2 threads under load
  against 7 s with 1 for test_grpo.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Warm starts and other cached artefacts go to a directory of this test run, never the user's cache.

    An explicit ``SWARMLM_CACHE`` in the environment is kept (to reuse a warm start across sessions).
    """
    if os.environ.get("SWARMLM_CACHE"):
        yield os.environ["SWARMLM_CACHE"]
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # the workers of one run share it (a warm start or a GGUF is built once, under its lock, for all of them):
        # the parent of a worker's base directory is this run's own
        path = tmp_path_factory.getbasetemp().parent / "swarmlm-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("swarmlm-cache")
    os.environ["SWARMLM_CACHE"] = str(path)
    yield path
    os.environ.pop("SWARMLM_CACHE", None)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    yield
