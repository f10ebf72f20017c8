"""Runs the same rank-agnostic tests on every rank of `mpiexec -n N python -m pytest tests/mpi`.

Expected values are computed from rank and size, so the suite passes at any N. A test that fails
on one rank while the others wait in a collective would hang the job, so a failure prints its
report, names the rank, and aborts the whole job at once. Only rank 0 reports to the terminal.
"""
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if RANK != 0:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        sys.stderr.write("\n===== rank %d of %d: %s failed (%s) =====\n%s\n" % (
            RANK, SIZE, item.nodeid, report.when, report.longreprtext))
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture
def world():
    """(rank, size) of this process in COMM_WORLD."""
    return RANK, SIZE


@pytest.fixture
def shared_dir():
    """A fresh directory every rank sees: rank 0 makes it, and removes it after the test."""
    path = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="sok1x-test-") if RANK == 0 else None)
    yield path
    MPI.COMM_WORLD.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rank_dir():
    """A fresh directory of this rank's own, removed after the test."""
    path = tempfile.mkdtemp(prefix="sok1x-test-r%d-" % RANK)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fresh_sok1x():
    """Shuts sok1x down before and after the test, so it can test bringing sok1x up."""
    from sok1x.engine import runtime
    MPI.COMM_WORLD.Barrier()
    runtime.shutdown()
    yield
    MPI.COMM_WORLD.Barrier()
    runtime.shutdown()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # One JUnit file per job: rank 0 writes it.
    if RANK != 0:
        config.option.xmlpath = None
