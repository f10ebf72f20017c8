"""A DeepRec-style program beside Horovod. argv[1]:
- "up": enable_distributed_strategy("collective") must bring Horovod up: prints
  "hvd R of N" from hvd.rank()/hvd.size() and the job's own MPI rank and size to compare;
- "fail": Horovod brought MPI up first (hvd.init() before sok1x), then the rank raises:
  the job must end with that error, at once."""
import sys

import horovod.tensorflow as hvd

import sok1x

if sys.argv[1] == "up":
    import mpi4py.MPI as MPI
    sok1x.enable_distributed_strategy(strategy="collective", backend="cpu")
    # one write a line: mpiexec forwards both ranks' output into one stream
    sys.stdout.write("hvd %d of %d; mpi %d of %d\n" % (hvd.rank(), hvd.size(),
                                                     MPI.COMM_WORLD.Get_rank(),
                                                     MPI.COMM_WORLD.Get_size()))
    sys.stdout.flush()
    sok1x.enable_distributed_strategy(strategy="collective", backend="cpu")  # idempotent
    sys.stdout.write("again %d\n" % hvd.size())
    sys.stdout.flush()
else:
    hvd.init()
    sok1x.init(backend="cpu")
    raise RuntimeError("the program's own error")
