"""Shared fixtures for the helper tests."""
import pytest


def _nothing():
    return None


@pytest.fixture
def warm_workers():
    """``warm_workers(n)`` starts ``n`` worker processes before a timed failure test, so its clock
    measures the job and not a pool start (a previous failure leaves no workers, and starting them
    takes seconds on a loaded CI machine)."""
    from helpers.launcher import launch

    return lambda n: launch(_nothing, world_size=n, quiet=True)
