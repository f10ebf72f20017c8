"""Runs the same rank-agnostic tests on every rank of `mpiexec -n N python -m pytest tests/mpi`.

Expected values are computed from rank and size, so the suite passes at any N. A test that fails
on one rank while the others wait in a collective would hang the job, so a failure prints its
report, names the rank, and aborts the whole job at once. Only rank 0 reports to the terminal.
A test past its time limit (--timeout) prints every rank's threads and aborts the job too.
"""
import faulthandler
import os
import shutil
import sys
import tempfile
import threading
import time

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


# How long a rank that passed a test's time limit waits before it aborts the job: the other
# ranks, which started the test with it, pass the limit meanwhile and print their threads too.
_TIMEOUT_GRACE_S = 5.0


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's limit, kept by a thread of this conftest: neither of pytest-timeout's own
    ways ends an MPI job with its stacks shown. A signal is never handled while the main thread
    waits in a collective, and one that lands in a weak reference's callback is swallowed
    there; its thread way needs the terminal reporter that ranks other than 0 do without."""
    timer = threading.Timer(settings.timeout, _past_time_limit, (item, settings.timeout))
    timer.daemon = True
    timer.name = "time limit of %s" % item.nodeid

    def cancel():
        timer.cancel()
        timer.join()
    item.cancel_timeout = cancel
    timer.start()
    return True


def _past_time_limit(item, seconds):
    """Prints, past pytest's capture, which test passed its limit on this rank and the stacks of
    all its threads, then aborts the job."""
    try:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        sys.stderr.write("\n===== rank %d of %d: %s passed its time limit of %g s; its threads, "
                         "newest call first: =====\n" % (RANK, SIZE, item.nodeid, seconds))
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        time.sleep(_TIMEOUT_GRACE_S)
    finally:  # whatever the printing met, the job ends
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)


@pytest.fixture
def world():
    """(rank, size) of this process in COMM_WORLD."""
    return RANK, SIZE


@pytest.fixture(params=["spare_rows_default", "spare_rows_all"])
def spare_rows(request, monkeypatch):
    """A test of hybrid tables twice: with the default spare rows (1/16 of max_capacity, too
    few for the small tables of these tests' evicting steps: their new keys take their victims'
    rows) and with as many spare rows as keys (SOK1X_SPARE_ROWS=1: an evicting step's new keys
    take spare rows)."""
    from sok1x.engine.tables import dynamic_table
    if request.param == "spare_rows_all":
        monkeypatch.setenv(dynamic_table.SPARE_ENV, "1")
    else:
        monkeypatch.delenv(dynamic_table.SPARE_ENV, raising=False)


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
