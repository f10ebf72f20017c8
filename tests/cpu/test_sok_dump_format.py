"""sok.dump / sok.load in SOK v2's own file format (jobs/sok_dump_format_job.py), against a
faithful writer built from SOK's code, at 1 and 2 ranks, with SOK's 64 MiB save rounds and with
rounds small enough that every table takes several."""
import pytest
from mpi_jobs import run_passing_job


@pytest.mark.parametrize("ranks,rounds", [(1, "sok"), (2, "sok"), (2, "40")])
def test_sok_dump_format(ranks, rounds):
    run_passing_job(ranks, "dlpack", "sok_dump_format_job.py", "SOK DUMP FORMAT OK", rounds,
                    timeout=300)
