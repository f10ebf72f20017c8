"""TensorFlow 1.15's GPU step on the host seam (DESIGN D1), PyTorch standing in for TensorFlow's
GPU side: api.compact_lookup's results come to the host through page-locked staging (as a
py_func hands them over), the framework uploads them, gathers and pools on its own GPU and
differentiates with autograd (torch's index_select gradient: the distinct rows' sums); the
gradients go back through staging. Outputs and gradients equal the engine's pooled lookup of the
same tables, the device path. No TensorFlow needed.

    mpiexec -n 1 python3 -m pytest -q tests/gpu/test_host_seam_cuda.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pycuda")

from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.lookup.pooled import PooledInput  # noqa: E402

pytestmark = pytest.mark.timeout(300, method="thread")
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=17)
VOCAB = 4096


@pytest.fixture(scope="module")
def cuda(engine):
    torch.cuda.set_device(engine.device_ordinal)
    return engine.backend


def framework_pooling(rows, indices, item, device):
    """The graph's gather and pooling on the framework's GPU (tf.gather, unsorted_segment_sum,
    the mean's divisor), from host arrays as a py_func hands them over."""
    rows = torch.from_numpy(np.array(rows)).to(device).requires_grad_()
    per_key = rows.index_select(0, torch.from_numpy(np.array(indices)).to(device).long())
    count = item.num_segments
    weights = torch.ones(len(indices), device=device) if item.weights is None else \
        torch.from_numpy(item.weights).to(device)
    segments = torch.arange(len(indices), device=device) if item.segment_ids is None else \
        torch.from_numpy(item.segment_ids).to(device)
    out = torch.zeros(count, rows.shape[1], device=device).index_add(
        0, segments, per_key * weights[:, None])
    if item.combiner == "mean":
        total = torch.zeros(count, device=device).index_add(0, segments, weights)
        out = torch.where(total[:, None] != 0, out / total.clamp_min(1e-30)[:, None],
                          torch.zeros_like(out))
    return rows, out


def inputs(rng, rank, size):
    power = np.minimum(rng.zipf(1.3, size=20000), VOCAB) - 1
    return [PooledInput(power * size + rank, None, 20000, None, "sum"),
            PooledInput(rng.integers(0, VOCAB, size=3000), np.arange(3000) // 6, 500,
                        rng.random(3000).astype(np.float32), "mean"),
            PooledInput(rng.permutation(VOCAB)[:1000], None, 1000, None, "sum")]


def by_key(backend, name, pair):
    values, rows = (backend.to_host(a) for a in pair)
    table = runtime.get().tables[name]
    if table.use_hashtable:
        held_keys, held_rows = (backend.to_host(a) for a in table.index.export())
        key_of_row = dict(zip(held_rows.tolist(), held_keys.tolist()))
        keys = np.array([key_of_row[r] for r in rows.tolist()], np.int64)
    else:
        keys = rows * runtime.get().size + runtime.get().rank
    order = np.argsort(keys)
    return values[order], keys[order]


@pytest.mark.parametrize("hashed", [False, True])
def test_host_seam_step_equals_the_device_step(cuda, rng, hashed):
    rt = runtime.get()
    device = torch.device("cuda", rt.device_ordinal)
    items = inputs(rng, rt.rank, rt.size)
    dims = (128, 64, 32)
    names = ["host_seam_%d_%d" % (hashed, t) for t in range(len(dims))]

    def fresh():
        for name, dim in zip(names, dims):
            api.create_table(name, dim, 4 * VOCAB, hashed, SPEC, replace=True)

    fresh()  # the device step: engine arrays in and out
    tops = [np.asarray(rng.standard_normal((item.num_segments, dim)), np.float32)
            for item, dim in zip(items, dims)]
    with runtime.entered():
        outs, token = api.pooled_lookup(names, "seam_ref_fwd", [item._replace(
            keys=cuda.asarray(item.keys)) for item in items], True)
        want_outs = [cuda.to_host(o) for o in outs]
        want = [by_key(cuda, name, pair) for name, pair in zip(names, api.pooled_lookup_grad(
            names, "seam_ref_bwd", token, [cuda.asarray(t) for t in tops]))]

    fresh()  # the host seam step: staged copies both ways, the framework pools
    with runtime.entered():
        results, token = api.compact_lookup(names, "seam_fwd", [item._replace(
            keys=cuda.upload_staged(item.keys)) for item in items], True)
        staged = cuda.download_staged_many([a for r in results for a in r if a is not None])
    staged = iter(staged)
    grads, forms = [], []
    for result, item, want_out, top in zip(results, items, want_outs, tops):
        rows = next(staged)
        if result.indices is None:
            forms.append("pooled")
            np.testing.assert_allclose(rows, want_out, rtol=1e-5, atol=1e-5)  # GPU sums: any order
            grads.append(top)
            continue
        forms.append("distinct")
        indices = next(staged)
        assert indices.dtype == np.int32
        leaf, out = framework_pooling(rows, indices, item, device)
        np.testing.assert_allclose(out.detach().cpu().numpy(), want_out, rtol=1e-5, atol=1e-5)
        out.backward(torch.from_numpy(top).to(device))
        grads.append(leaf.grad.cpu().numpy())
    assert forms == ["distinct", "pooled", "pooled"]
    with runtime.entered():
        got = api.compact_lookup_grad(names, "seam_bwd", token,
                                     [cuda.upload_staged(g) for g in grads])
        got = [by_key(cuda, name, pair) for name, pair in zip(names, got)]
    for (got_values, got_keys), (want_values, want_keys) in zip(got, want):
        np.testing.assert_array_equal(got_keys, want_keys)
        # GPU sums in any order: a sum that cancels near zero keeps the rounding of its largest
        # terms (one H100, 2026-11-25: -0.14993 against -0.15007 among sums near 150)
        scale = max(1.0, float(np.abs(want_values).max()))
        np.testing.assert_allclose(got_values, want_values, rtol=1e-4, atol=1e-5 * scale)


def test_keyed_host_seam_step_equals_the_keyed_device_step(cuda, rng):
    """26 tables of one key per row as one KeyedInput (dlrm26's step): the unit's distinct rows
    and indices through staging and PyTorch's gather give keyed_lookup's outputs, and the
    gather's gradient its gradients."""
    rt = runtime.get()
    device = torch.device("cuda", rt.device_ordinal)
    count, batch, dim = 26, 2000, 32
    names = ["host_seam_keyed_%d" % t for t in range(count)]
    keys = np.concatenate([(np.minimum(rng.zipf(1.3, size=batch), VOCAB) - 1) * rt.size
                           + rt.rank for _ in range(count)])
    keyed = api.KeyedInput(keys, [batch] * count, None, [batch] * count, None, "sum")
    top = np.asarray(rng.standard_normal((count * batch, dim)), np.float32)

    def fresh():
        for name in names:
            api.create_table(name, dim, 4 * VOCAB, False, SPEC, replace=True)

    fresh()
    with runtime.entered():
        out, token = api.keyed_lookup(names, "keyed_ref_fwd", keyed._replace(
            keys=cuda.asarray(keys)), True)
        want_out = cuda.to_host(out)
        values, rows, counts = api.keyed_lookup_grad(names, "keyed_ref_bwd", token,
                                                     cuda.asarray(top), rows_per_table=True)
        starts = np.concatenate([[0], np.cumsum(counts)])
        want = [by_key(cuda, name, (cuda.row_view(values, int(a), int(b)), r))
                for name, a, b, r in zip(names, starts[:-1], starts[1:], rows)]
    fresh()
    with runtime.entered():
        joined, token = api.compact_keyed_lookup(names, "keyed_fwd", keyed._replace(
            keys=cuda.upload_staged(keys)), True)
        assert joined.indices is not None
        host_rows, host_indices = cuda.download_staged_many([joined.rows, joined.indices])
    rows_t = torch.from_numpy(np.array(host_rows)).to(device).requires_grad_()
    got_out = rows_t.index_select(0, torch.from_numpy(np.array(host_indices)).to(device).long())
    np.testing.assert_allclose(got_out.detach().cpu().numpy(), want_out, rtol=1e-6, atol=1e-6)
    got_out.backward(torch.from_numpy(top).to(device))
    with runtime.entered():
        got = api.compact_lookup_grad(names, "keyed_bwd", token,
                                      [cuda.upload_staged(rows_t.grad.cpu().numpy())])
        got = [by_key(cuda, name, pair) for name, pair in zip(names, got)]
    for (got_values, got_keys), (want_values, want_keys) in zip(got, want):
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_allclose(got_values, want_values, rtol=1e-4, atol=1e-4)
