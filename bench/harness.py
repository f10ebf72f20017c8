"""What every benchmark script shares: the common flags, bringing up the engine (and PyTorch's
process group beside it), timing, freeing GPU memory between cases, teardown and the JSON result.

GPU regions are timed with CUDA events recorded on the one sok1x stream (so the gaps that Python
leaves between launches count, as they do in a training step); cpu regions with a host clock.
Every figure is the median of several repeats after warm-up calls, with the repeats' spread.
Nothing here imports mpi4py, PyCUDA or PyTorch until a script that uses them asks.
"""
import argparse
import datetime
import gc
import json
import os
import platform
import socket
import sys
import time

import numpy as np

# -- arguments ------------------------------------------------------------------------------------

COMMON_FLAGS = {
    "out": {"required": True, "help": "JSON file for the results (written by rank 0)"},
    "backend": {"default": "cuda", "choices": ("cuda", "cpu"),
                "help": "cpu runs the same on CPU-only hosts, to check the script"},
    "scale": {"type": int, "default": 1, "help": "divide batches, vocabularies and sizes"},
    "repeats": {"type": int, "default": 5, "help": "timed repeats (the figure is their median)"},
    "steps": {"type": int, "default": 20, "help": "steps per repeat"},
    "port": {"type": int, "default": 29500, "help": "TCP port of PyTorch's process group"},
}


def parser(doc, **flags):
    """An ArgumentParser described by the first line of `doc`, holding the COMMON_FLAGS named in
    `flags`: name=True takes the flag as it is, name=VALUE changes its default, name={...}
    changes its add_argument keywords. The script adds its own flags and parses."""
    result = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    for name, given in flags.items():
        keywords = dict(COMMON_FLAGS[name])
        if isinstance(given, dict):
            keywords.update(given)
        elif given is not True:
            keywords["default"] = given
        result.add_argument("--" + name, **keywords)
    return result


def seeded_rng(default=5):
    """NumPy's generator seeded by $SOK1X_BENCH_SEED (default `default`)."""
    return np.random.default_rng(int(os.environ.get("SOK1X_BENCH_SEED", str(default))))


# -- bringing up and tearing down ----------------------------------------------------------------

def backend_module(name):
    """The backend module `name` ("cpu" or "cuda") on its own, without the engine: the cuda one
    with GPU $SOK1X_BENCH_DEVICE (default 0) made current, for single-process kernel benchmarks."""
    from sok1x.backend import load_backend
    backend = load_backend(name)
    if backend.NAME == "cuda":
        from sok1x.backend.cuda import context as cuda_context
        cuda_context.activate(int(os.environ.get("SOK1X_BENCH_DEVICE", "0")))
    return backend


def start_engine(backend):
    """The engine's Runtime on `backend` ("cuda" or "cpu"), one rank per process of the job."""
    from sok1x.engine import runtime
    return runtime.init(backend=backend)


def start_torch(rt, port):
    """Points PyTorch at this rank's GPU (the engine's) and joins its process group (NCCL on GPUs,
    gloo on cpu, over tcp://127.0.0.1:port); returns the torch.device."""
    import torch
    import torch.distributed as dist
    if rt.backend.NAME == "cuda":
        device = torch.device("cuda", rt.device_ordinal)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if rt.size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method="tcp://127.0.0.1:%d" % port, rank=rt.rank,
                                world_size=rt.size)
    return device


class GcClock:
    """Python's garbage collections while it is installed (gc.callbacks): how many of each
    generation, and the wall microseconds they took. A step that makes container objects pays
    for collections whose cost grows with everything else the process holds, so a step's host
    time may depend on what else is in its process (counts() says how much)."""

    def __init__(self):
        self.collections, self.us, self._started = [0, 0, 0], 0.0, None
        gc.callbacks.append(self._note)

    def _note(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.collections[info["generation"]] += 1
            self.us += (time.perf_counter() - self._started) * 1e6
            self._started = None

    def counts(self):
        """{"gc_gen0".."gc_gen2": collections, "gc_us": their microseconds} so far."""
        result = {"gc_gen%d" % g: n for g, n in enumerate(self.collections)}
        result["gc_us"] = self.us
        return result

    def remove(self):
        gc.callbacks.remove(self._note)


def gc_frozen_if_asked():
    """With $SOK1X_BENCH_GC_FREEZE=1, moves every object the process holds now into the
    collector's permanent generation (gc.freeze): later collections do not scan them. Returns
    whether it did (to tell a step slowed by collections over a large heap from one that is
    not)."""
    if os.environ.get("SOK1X_BENCH_GC_FREEZE") != "1":
        return False
    gc.collect()
    gc.freeze()
    return True


def _pace_call(value):
    return value


def host_pace_us(repeats=9):
    """Microseconds this process takes for one fixed piece of host work, the median of `repeats`:
    20,000 Python calls and 2,000 small NumPy operations, what an engine step's host work is
    made of. The GPU hosts run one code's step 1.5-2x slower in one process than in another
    (2026-11-29), so a host figure divided by this one can be compared across processes where
    the figure alone cannot (if what slows a process slows both alike: say whether it did)."""
    small = np.arange(26, dtype=np.int64)
    spent = []
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for index in range(20000):
            total += _pace_call(index)
        for _ in range(1000):
            total += int((small + small).any()) + small.shape[0]
        spent.append((time.perf_counter() - started) * 1e6)
    return median(spent)


def release_memory(backend, torch_device=None):
    """Frees what earlier cases left: Python garbage, then (cuda) the blocks the sok1x memory
    pool holds, and PyTorch's cached blocks when it runs on `torch_device`."""
    gc.collect()
    if backend.NAME == "cuda":
        from sok1x.backend.cuda import context as cuda_context
        backend.synchronize()
        cuda_context.memory_pool().free_held()
    if torch_device is not None and torch_device.type == "cuda":
        import torch
        torch.cuda.empty_cache()


def finish():
    """Ends an engine job: waits for every rank, leaves PyTorch's process group if it was
    joined, and shuts the engine down."""
    from sok1x.engine import runtime
    barrier()
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    runtime.shutdown()


# -- ranks ----------------------------------------------------------------------------------------

def rank():
    """This process's rank in the MPI job; 0 in a script that does not use MPI."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi.COMM_WORLD.Get_rank() if mpi is not None else 0


def job_max(value):
    """The largest of every rank's `value` (the slowest rank's time), as a float."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.allreduce(float(value), op=MPI.MAX)


def job_min(value):
    """The smallest of every rank's `value`, as a float."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.allreduce(float(value), op=MPI.MIN)


def barrier():
    """Waits for every rank of the MPI job."""
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()


# -- timing ---------------------------------------------------------------------------------------

def per_call_us(run, calls, repeats, synchronize):
    """Median (min, max) host microseconds per call of run() over `repeats` rounds of `calls`,
    each round after synchronize() (few enough calls that the GPU's launch queue never fills
    and blocks the host: what is timed is the host's own work)."""
    run()
    rounds = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        rounds.append((time.perf_counter() - start) * 1e6 / calls)
    return {"median_us": median(rounds), "min_us": min(rounds), "max_us": max(rounds)}


def median(values):
    """The median of `values`, as a float."""
    return float(np.median(np.asarray(values, dtype=np.float64)))


def profiler_gpu_us(prof, steps):
    """(kernel us, copy and set us, {name: us}) a step of `steps` steps PyTorch's profiler
    `prof` saw on the GPU (CUPTI sees PyCUDA's kernels too)."""
    kernels = copies = 0.0
    by_name = {}
    for event in prof.events():
        if event.device_type.name != "CUDA":
            continue
        us = getattr(event, "device_time_total", None)
        us = event.cuda_time_total if us is None else us
        if "emcpy" in event.name or "emset" in event.name:
            copies += us
        else:
            kernels += us
        by_name[event.name] = by_name.get(event.name, 0.0) + us / steps
    return kernels / steps, copies / steps, by_name


def summary(values, names=("median_ms", "min_ms", "max_ms", "repeats_ms")):
    """{names[0]: median, names[1]: min, names[2]: max, names[3]: every value} of repeats
    (the first len(names) of those)."""
    values = [float(v) for v in values]
    return dict(zip(names, (median(values), min(values), max(values), values)))


class StreamTimer:
    """Times callables on the sok1x stream (cuda) or with perf_counter (cpu), in milliseconds."""

    def __init__(self, backend):
        self.backend = backend
        self.on_gpu = backend.NAME == "cuda"

    def time_ms(self, run, repeats, warmup=2, before=None):
        """Calls before() (untimed, may be None) then run(), `warmup` + `repeats` times; returns
        the times of the last `repeats` runs in ms."""
        times = []
        for index in range(warmup + repeats):
            if before is not None:
                before()
            times_this = self._one(run)
            if index >= warmup:
                times.append(times_this)
        return times

    def part_us(self, name, run, repeats, moved=None):
        """Times run() as time_ms does and logs it under `name`; returns {us, us_min, us_max,
        us_repeats}, and tb_per_s where `moved` (bytes a run moves) is given."""
        return _logged_us(name, [ms * 1e3 for ms in self.time_ms(run, repeats)], moved)

    def _one(self, run):
        if not self.on_gpu:
            start = time.perf_counter()
            run()
            return (time.perf_counter() - start) * 1e3
        import pycuda.driver as driver
        from sok1x.backend.cuda import context as cuda_context
        with cuda_context.entered():
            stream = cuda_context.stream()
            start, end = driver.Event(), driver.Event()
            start.record(stream)
            run()
            end.record(stream)
            end.synchronize()
            return start.time_till(end)


def kernels_from(path, arg_types, options=()):
    """{name: kernel} for each kernel named in `arg_types` ({name: pycuda arg types}) of the
    CUDA source file at `path` (another tree's cuda_kernels/*.cu, or a candidate), compiled once
    for this device with sok1x's compiler and the installed headers (-I the installed
    cuda_kernels), nvcc `options` added (e.g. "-DNAME=1"), each prepared. Call on cuda with the
    engine's backend active."""
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.cuda_kernels import compiler
    with open(path) as handle:
        text = handle.read()
    with cuda_context.entered():
        major, minor = cuda_context.context().get_device().compute_capability()
        cubin = compiler.compile_text(text, os.path.basename(path), "sm_%d%d" % (major, minor),
                                      tuple(options))
        module = driver.module_from_buffer(cubin)
    kernels = {}
    for name, types in arg_types.items():
        kernels[name] = module.get_function(name)
        kernels[name].prepare(types)
    return kernels


def interleaved_parts(timer, parts, rounds, repeats, moved=None):
    """Times each (name, run) of `parts` with timer.part_us, `rounds` times in turn (so a slow
    spell of the GPU falls on every part alike). Returns {name: figures}: the median, min and max
    over all rounds' repeats (us), and tb_per_s where `moved` bytes a run is given."""
    times = {name: [] for name, _ in parts}
    for _ in range(rounds):
        for name, run in parts:
            times[name].extend(ms * 1e3 for ms in timer.time_ms(run, repeats))
    return {name: _logged_us(name, times[name], moved) for name, _ in parts}


def _logged_us(name, times_us, moved=None):
    """{us, us_min, us_max, us_repeats} of `times_us`, and tb_per_s where `moved` (bytes a run
    moves) is given, logged under `name`."""
    figures = summary(times_us, ("us", "us_min", "us_max", "us_repeats"))
    rate = ""
    if moved is not None:
        figures["tb_per_s"] = moved / figures["us"] / 1e6
        rate = ", %.2f TB/s" % figures["tb_per_s"]
    log("%-28s %7.1f us (%.1f-%.1f)%s" % (name, figures["us"], figures["us_min"],
                                           figures["us_max"], rate))
    return figures


class TorchTimer:
    """Times PyTorch work on `device`'s current stream with CUDA events (a host clock on cpu),
    in milliseconds; time_ms as StreamTimer's."""

    def __init__(self, device):
        self.device = device

    def time_ms(self, run, repeats, warmup=2):
        """Calls run() `warmup` + `repeats` times; returns the last `repeats` times in ms."""
        import torch
        times = []
        for index in range(warmup + repeats):
            if self.device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                elapsed = wall_ms(run, 1, lambda: None)
            if index >= warmup:
                times.append(elapsed)
        return times


def wall_ms(run, repeats, synchronize):
    """Mean wall time of `repeats` calls of run() in ms, synchronize() once at the end."""
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    synchronize()
    return (time.perf_counter() - start) * 1e3 / repeats


class Steps:
    """A callable that runs run(step) with the step number counting up from `first`, so that
    timed steps keep cycling through a script's input batches."""

    def __init__(self, run, first=0):
        self.run, self.step = run, first

    def __call__(self):
        self.run(self.step)
        self.step += 1


def interleaved_ms(timed, repeats, steps, synchronize, warmup=2):
    """{name: [the job's slowest rank's ms per step, one per repeat]} for the callables in
    `timed` ({name: run}): `warmup` untimed calls of each, then `repeats` rounds that time each
    in turn over `steps` calls (after a barrier), so that the host's load drifts over all alike."""
    for run in timed.values():
        wall_ms(run, warmup, synchronize)
    times = {name: [] for name in timed}
    for _ in range(repeats):
        for name, run in timed.items():
            barrier()
            times[name].append(job_max(wall_ms(run, steps, synchronize)))
    return times


def step_ms(run, steps, synchronize, warmup=2, after_warmup=None):
    """This rank's wall ms per step of `steps` calls of run(), after a barrier, `warmup` untimed
    calls, after_warmup() (may be None) and a second barrier."""
    barrier()
    wall_ms(run, warmup, synchronize)
    if after_warmup is not None:
        after_warmup()
    barrier()
    return wall_ms(run, steps, synchronize)


def profile_steps(rt, run, synchronize, label, steps=20):
    """With $SOK1X_BENCH_PROFILE set to a file, appends to it (rank 0) the cProfile of `steps`
    steps of `run`: the host functions by their own time, then by their time with what they
    call (where a step whose host time exceeds its GPU time spends it); other pstats orders with
    $SOK1X_BENCH_PROFILE_SORTS (comma-separated, e.g. "tottime,ncalls"); with
    $SOK1X_BENCH_PROFILE_RAW set, each profile is also dumped beside it as FILE.<label>.prof."""
    path = os.environ.get("SOK1X_BENCH_PROFILE")
    if not path:
        return
    lines = int(os.environ.get("SOK1X_BENCH_PROFILE_LINES", "30"))
    import cProfile
    import io
    import pstats
    barrier()
    synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        run()
    synchronize()
    profiler.disable()
    if rt.rank == 0:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        orders = os.environ.get("SOK1X_BENCH_PROFILE_SORTS", "tottime,cumulative")
        for order in [o.strip() for o in orders.split(",") if o.strip()]:
            stats.sort_stats(order).print_stats(lines)
        with open(path, "a") as handle:
            handle.write("# %s, %d steps\n%s\n" % (label, steps, text.getvalue()))
        if os.environ.get("SOK1X_BENCH_PROFILE_RAW"):  # pstats' own file, for exact times
            stats.dump_stats("%s.%s.prof" % (path, "".join(
                c if c.isalnum() or c in "_-" else "_" for c in label)))



# -- results --------------------------------------------------------------------------------------

def gpu_name():
    """The name of the GPU the cuda backend drives, or None."""
    try:
        from sok1x.backend.cuda import context as cuda_context
        if cuda_context.is_active():
            return cuda_context.context().get_device().name()
    except Exception:  # no PyCUDA: a cpu run
        return None
    return None


def environment(extra=None):
    """What produced a result: date, host, Python, NumPy, GPU, and `extra` (a dict)."""
    info = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
            "host": socket.gethostname(), "python": platform.python_version(),
            "numpy": np.__version__, "gpu": gpu_name()}
    info.update(extra or {})
    return info


def write_json(path, payload):
    """Writes `payload` as indented JSON to `path` (folders created) via a temporary name, on
    rank 0 only (the other ranks return at once)."""
    if rank() != 0:
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True)
    os.replace(temporary, path)


def log(*parts):
    """Prints a line at once (the device tool returns only the tail of the output)."""
    print(" ".join(str(p) for p in parts), flush=True)


def say(line):
    """log() on rank 0 only."""
    if rank() == 0:
        log(line)
