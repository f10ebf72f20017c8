"""CUDA graphs of the sok1x stream (sok1x/backend/cuda/captured_graph.py, DESIGN D14): a recorded
stretch of sok1x's kernels (two gathers and a LazyAdam update over rows padded with -1)
replayed over fixed buffers whose contents change between replays equals, bit for bit, the same
kernels run eagerly on a copy of the state; the graph holds the memory its work allocated until
it is freed; a host wait or an upload inside a capture is refused at once and leaves the stream
usable. Needs a GPU and PyCUDA, not TensorFlow."""
import time

import numpy as np
import pytest

pytest.importorskip("pycuda")

CAPACITY, DIM, N, PADDED = 5000, 16, 4096, 3000
HYPER = (0.01, 0.9, 0.999, 1e-7)


@pytest.fixture(scope="module")
def graphs(cuda):
    from sok1x.backend.cuda import captured_graph, context, kernel_launch
    return cuda, captured_graph, context, kernel_launch


def step(cuda, var, m, v, keys, picks, rows):
    """One made-up training step on fixed-size inputs: gather the keys' vectors, take some of
    them as the gradient of `rows` (padded with -1), update those by LazyAdam (no atomics, so
    any two runs agree to the bit); returns the gathered vectors."""
    vectors = cuda.take_rows(var, keys)
    cuda.update_lazy_adam(var, m, v, rows, cuda.take_rows(vectors, picks), *HYPER)
    return vectors


def batch(rng):
    """(keys [N], picks [PADDED] of positions in keys, rows [PADDED]: distinct, -1 where
    padding)."""
    keys = rng.integers(0, CAPACITY, size=N).astype(np.int64)
    inverse = rng.integers(0, N, size=PADDED).astype(np.int64)
    rows = np.full(PADDED, -1, np.int64)
    used = np.sort(rng.choice(PADDED, size=PADDED // 2, replace=False))
    rows[used] = rng.choice(CAPACITY, size=used.shape[0], replace=False)
    return keys, inverse, rows


def test_replay_equals_eager_over_changing_inputs(graphs, rng):
    cuda, captured_graph, context, kernel_launch = graphs
    initial = rng.standard_normal((CAPACITY, DIM)).astype(np.float32)
    eager = [cuda.asarray(initial), cuda.zeros((CAPACITY, DIM), np.float32),
             cuda.zeros((CAPACITY, DIM), np.float32)]
    replayed = [cuda.asarray(initial), cuda.zeros((CAPACITY, DIM), np.float32),
                cuda.zeros((CAPACITY, DIM), np.float32)]
    fixed = [cuda.asarray(a) for a in batch(rng)]  # the graph's inputs, refilled per step
    graph = captured_graph.CapturedGraph()
    with graph.capture():
        out = step(cuda, *replayed, *fixed)
    assert graph.ready and graph.nodes >= 3 and graph.held_bytes >= N * DIM * 4
    try:
        for _ in range(6):
            inputs = [cuda.asarray(a) for a in batch(rng)]
            for dst, src in zip(fixed, inputs):
                kernel_launch.copy_rows_async(dst, 0, src, 0, src.shape[0])
            graph.replay()
            want = step(cuda, *eager, *inputs)
            assert cuda.to_host(out).tobytes() == cuda.to_host(want).tobytes()
            for got, expected in zip(replayed, eager):
                assert cuda.to_host(got).tobytes() == cuda.to_host(expected).tobytes()
    finally:
        graph.free()
    assert not graph.ready and graph.held_bytes == 0


def test_memory_is_held_until_free(graphs):
    cuda, captured_graph, context, _ = graphs
    pool = context.memory_pool()
    keys = cuda.asarray(np.arange(N, dtype=np.int64) % CAPACITY)
    var = cuda.zeros((CAPACITY, DIM), np.float32)
    active = pool.active_blocks
    graph = captured_graph.CapturedGraph()
    with graph.capture():
        cuda.take_rows(var, keys)  # dropped at once: the graph keeps its memory anyway
    assert pool.active_blocks == active + len(graph._blocks) >= active + 1
    assert graph.held_bytes >= N * DIM * 4
    graph.replay()
    graph.free()
    assert pool.active_blocks == active


@pytest.mark.parametrize("what", ["wait", "upload"])
def test_a_host_wait_or_upload_inside_a_capture_is_refused(graphs, what):
    cuda, captured_graph, context, _ = graphs
    var = cuda.zeros((CAPACITY, DIM), np.float32)
    keys = cuda.asarray(np.arange(N, dtype=np.int64))
    graph = captured_graph.CapturedGraph()
    with pytest.raises(captured_graph.CaptureError, match="host wait" if what == "wait"
                       else "upload of host data"):
        with graph.capture():
            vectors = cuda.take_rows(var, keys)
            if what == "wait":
                cuda.to_host(vectors)
            else:
                cuda.asarray(np.ones(7, np.float32))
    assert not graph.ready and graph.held_bytes == 0
    assert not captured_graph.stream_is_capturing()
    assert not cuda.to_host(cuda.take_rows(var, keys)).any()  # the stream runs eagerly again
    with graph.capture():  # the same graph records again after the refusal
        cuda.take_rows(var, keys)
    graph.replay()
    graph.free()


def test_what_a_replay_costs_the_host(graphs, rng):
    """Reported, not asserted (speed is the benchmarks' job): host microseconds to queue the
    step eagerly against one replay."""
    cuda, captured_graph, context, _ = graphs
    state = [cuda.asarray(rng.standard_normal((CAPACITY, DIM)).astype(np.float32)),
             cuda.zeros((CAPACITY, DIM), np.float32), cuda.zeros((CAPACITY, DIM), np.float32)]
    fixed = [cuda.asarray(a) for a in batch(rng)]
    graph = captured_graph.CapturedGraph()
    with graph.capture():
        step(cuda, *state, *fixed)
    with context.entered():
        times = {}
        for name, run in (("eager", lambda: step(cuda, *state, *fixed)), ("replay", graph.replay)):
            run()
            context.wait_stream()
            started = time.perf_counter()
            for _ in range(50):
                run()
            times[name] = (time.perf_counter() - started) / 50 * 1e6
            context.wait_stream()
    print("\nhost us a step: eager %.1f, replay %.1f (%d nodes, %.1f MiB held)" % (
        times["eager"], times["replay"], graph.nodes, graph.held_bytes / 2.0 ** 20))
    graph.free()
    assert times["replay"] > 0
