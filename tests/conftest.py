import matplotlib
import pytest
import torch
from hypothesis import settings

matplotlib.use("Agg")

# Hypothesis profiles. "ci" is loaded by default, so every run (local, CI, mutation testing) draws
# the same examples: derandomize=True derives them from each test's source instead of a random
# seed, which keeps the suite from flaking and makes a failure reproduce; max_examples=50 per
# property unless a test's own @settings says otherwise; deadline=None because per-example
# timings on a shared 2-core machine vary; no example database is written.
# For a deeper random search: pytest --hypothesis-profile=explore tests/
settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None, database=None)
settings.register_profile("explore", derandomize=False, max_examples=1000, deadline=None)
settings.load_profile("ci")


def pytest_configure(config):
    # Tests run in parallel workers (pytest -n 2) on small machines: one intra-op thread per
    # worker avoids oversubscription, which slows small-tensor code down by an order of magnitude.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
