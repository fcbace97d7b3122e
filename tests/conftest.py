import matplotlib
import pytest
import torch

matplotlib.use("Agg")


def pytest_configure(config):
    # Tests run in parallel workers (pytest -n 2) on small machines: one intra-op thread per
    # worker avoids oversubscription, which slows small-tensor code down by an order of magnitude.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
