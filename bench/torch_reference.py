"""The same training step written in plain PyTorch: the references the sok1x step is timed against.

TorchDedupStep is the strongest we could write (distinct keys cross once, LazyAdam on distinct
rows); TorchShardedEmbedding, below, the earlier plain one.

Rows are sharded as in sok1x (global key k on rank k % size at row k // size). A step:
keys to the GPU; bucket them by owner (stable argsort), exchange the counts and then the keys with
all_to_all_single over NCCL; the owner gathers its rows with index_select and sends them back; the
asker puts them in input order and, for the pooled layer, sums each (sample, slot) with index_add_.
The top gradient is the output (loss = 0.5 * ||out||^2); it goes back to the owners the same way,
and torch.optim.SparseAdam (TensorFlow's LazyAdam formula: only rows with a gradient move, repeats
summed) updates the shard from a sparse COO gradient. No autograd: the backward pass is written out,
which is as fast as PyTorch gets for this step.
"""
import torch
import torch.distributed as dist

from sok_steps import (ADAGRAD_INITIAL, BETA1, BETA2, EPSILON, LEARNING_RATE,
                       lazy_adam_hyper)


def route(keys, size):
    """Buckets keys by owner (key % size) and exchanges the counts: returns (order, send_split,
    recv_split); keys[order] are grouped by owner."""
    owner = torch.remainder(keys, size)
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_split, recv_split = torch.stack([send_counts, recv_counts]).tolist()
    return order, send_split, recv_split


def exchange(send, send_split, recv_split):
    """all_to_all_single of rows with the given splits; returns the received rows."""
    recv = send.new_empty((sum(recv_split),) + tuple(send.shape[1:]))
    dist.all_to_all_single(recv, send, recv_split, send_split)
    return recv


class TorchShardedEmbedding:
    """One rank's shard (weight: [rows, dim] tensor on `device`) and its SparseAdam."""

    def __init__(self, weight, rank, size, pooled, nnz):
        self.weight = torch.nn.Parameter(weight)
        self.rank, self.size = rank, size
        self.pooled, self.nnz = pooled, nnz
        self.device = weight.device
        self.optimizer = torch.optim.SparseAdam([self.weight], lr=LEARNING_RATE,
                                                betas=(BETA1, BETA2), eps=EPSILON)

    @torch.no_grad()
    def step(self, keys_host):
        """One training step on host keys [batch, slots, nnz]; returns the forward output."""
        keys = torch.from_numpy(keys_host.reshape(-1)).to(self.device)
        weight = self.weight
        if self.size == 1:
            rows = keys
            out = weight.index_select(0, rows)
        else:
            order, send_split, recv_split = route(keys, self.size)
            owned_keys = exchange(keys[order], send_split, recv_split)
            rows = torch.div(owned_keys, self.size, rounding_mode="floor")
            returned = exchange(weight.index_select(0, rows), recv_split, send_split)
            out = torch.empty_like(returned)
            out[order] = returned
        per_key = out
        if self.pooled:
            segments = torch.div(torch.arange(keys.shape[0], device=self.device), self.nnz,
                                 rounding_mode="floor")
            out = out.new_zeros((keys.shape[0] // self.nnz, out.shape[1]))
            out.index_add_(0, segments, per_key)
            per_key = out.index_select(0, segments)
        if self.size == 1:
            owned_grads = per_key
        else:
            owned_grads = exchange(per_key[order], send_split, recv_split)
        weight.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), owned_grads, weight.shape,
                                              check_invariants=False)
        self.optimizer.step()
        weight.grad = None
        return out


class TorchDedupStep:
    """The strongest plain-PyTorch step: distinct keys cross once, LazyAdam on distinct rows."""

    def __init__(self, weight, rank, size, slots=None):
        self.weight = weight
        self.m, self.v = slots or (torch.zeros_like(weight), torch.zeros_like(weight))
        self.rank, self.size, self.count = rank, size, 0

    @torch.no_grad()
    def step(self, keys):
        distinct, inverse = torch.unique(keys, return_inverse=True)
        if self.size == 1:
            rows = distinct
            out = self.weight.index_select(0, rows).index_select(0, inverse)
            grads = torch.zeros((rows.shape[0], out.shape[1]), device=out.device)
            grads.index_add_(0, inverse, out)
        else:
            order, send_split, recv_split = route(distinct, self.size)
            owned = exchange(distinct[order], send_split, recv_split)
            rows = torch.div(owned, self.size, rounding_mode="floor")
            back = exchange(self.weight.index_select(0, rows), recv_split, send_split)
            per_distinct = torch.empty_like(back)
            per_distinct[order] = back
            out = per_distinct.index_select(0, inverse)
            summed = torch.zeros_like(per_distinct).index_add_(0, inverse, out)
            received = exchange(summed[order], send_split, recv_split)
            rows, row_inverse = torch.unique(rows, return_inverse=True)
            grads = torch.zeros((rows.shape[0], out.shape[1]), device=out.device)
            grads.index_add_(0, row_inverse, received)
        self._lazy_adam(rows, grads)
        return out

    def _lazy_adam(self, rows, grads):
        self.count += 1
        _lazy_adam(self.weight, self.m, self.v, rows, grads, lazy_adam_hyper(self.count)["lr_t"])


class TorchGroupStep:
    """The strongest plain-PyTorch step for several tables of one dim, as TorchRec's fused
    table-batched embedding runs them: the tables' shards concatenated into one weight, each
    table's keys offset into one id space (table t's key k is key_offsets[t] + k, owned by rank
    (key_offsets[t] + k) % size at its row // size), one torch.unique before the exchange,
    all_to_all_single, index_select, sum pooling of each (table, sample) with one index_add_ (none
    where every table has one key per sample: a key's vector is then its sample's output, as the
    engine's keyed lookup without segment ids has it), and the optimizer ("lazy_adam" or
    "adagrad") on the distinct rows. The top gradient is the output.
    keys_list: per table int64 [batch * hotness_t] (sample-major); returns per table [batch, dim].
    """

    def __init__(self, weight, rank, size, key_offsets, hotness, batch, optimizer, slots=None):
        device = weight.device
        self.weight, self.rank, self.size, self.batch = weight, rank, size, batch
        self.optimizer, self.count = optimizer, 0
        counts = torch.tensor([batch * h for h in hotness], device=device)
        self.position_offsets = torch.repeat_interleave(
            torch.tensor(key_offsets, dtype=torch.int64, device=device), counts)
        self.segments = torch.cat([
            t * batch + torch.div(torch.arange(batch * h, device=device), h,
                                  rounding_mode="floor")
            for t, h in enumerate(hotness)])
        self.tables = len(hotness)
        self.one_hot = all(h == 1 for h in hotness)
        if slots is not None:  # another peer's (TorchGraphStep.shard), as they are
            self.slots = list(slots)
            return
        self.slots = [torch.zeros_like(weight)] + (
            [torch.zeros_like(weight)] if optimizer == "lazy_adam" else [])
        if optimizer == "adagrad":
            self.slots[0].fill_(ADAGRAD_INITIAL)

    @torch.no_grad()
    def step(self, keys_list):
        keys = torch.cat(keys_list) + self.position_offsets
        distinct, inverse = torch.unique(keys, return_inverse=True)
        if self.size == 1:
            rows = distinct
            per_distinct = self.weight.index_select(0, rows)
        else:
            order, send_split, recv_split = route(distinct, self.size)
            owned = exchange(distinct[order], send_split, recv_split)
            rows = torch.div(owned, self.size, rounding_mode="floor")
            back = exchange(self.weight.index_select(0, rows), recv_split, send_split)
            per_distinct = torch.empty_like(back)
            per_distinct[order] = back
        pooled, summed = _pooled_and_summed(per_distinct, inverse,
                                            None if self.one_hot else self.segments,
                                            self.tables * self.batch)
        if self.size == 1:
            grads = summed
        else:
            received = exchange(summed[order], send_split, recv_split)
            rows, row_inverse = torch.unique(rows, return_inverse=True)
            grads = received.new_zeros((rows.shape[0], received.shape[1]))
            grads.index_add_(0, row_inverse, received)
        self.count += 1
        if self.optimizer == "adagrad":
            _adagrad(self.weight, self.slots[0], rows, grads)
        else:
            _lazy_adam(self.weight, self.slots[0], self.slots[1], rows, grads,
                       lazy_adam_hyper(self.count)["lr_t"])
        return list(pooled.split(self.batch))


def _pooled_and_summed(per_distinct, inverse, segments, outputs):
    """(the lookup's outputs, each distinct key's gradient) of a step whose top gradient is its
    output: with segments None each key its own output row, else sum pooling of the keys into
    `outputs` rows by segment id."""
    per_key = per_distinct.index_select(0, inverse)
    if segments is None:  # keys are table-major, sample-major: key i is output row i
        return per_key, torch.zeros_like(per_distinct).index_add_(0, inverse, per_key)
    pooled = per_key.new_zeros((outputs, per_key.shape[1])).index_add_(0, segments, per_key)
    return pooled, torch.zeros_like(per_distinct).index_add_(
        0, inverse, pooled.index_select(0, segments))


def _adagrad(weight, accumulator_all, rows, grads):
    accumulator = accumulator_all.index_select(0, rows).addcmul_(grads, grads)
    accumulator_all.index_copy_(0, rows, accumulator)
    weight.index_add_(0, rows, grads.div_(accumulator.sqrt_().add_(EPSILON)),
                      alpha=-LEARNING_RATE)


def _lazy_adam(weight, m_all, v_all, rows, grads, rate):
    """LazyAdam on distinct `rows`; rate: lr_t, a float or a device scalar (a captured step's,
    applied as rate * x then -1 * that: bit for bit the float's alpha=-lr_t in float32)."""
    m = m_all.index_select(0, rows).mul_(BETA1).add_(grads, alpha=1 - BETA1)
    v = v_all.index_select(0, rows).mul_(BETA2).addcmul_(grads, grads, value=1 - BETA2)
    m_all.index_copy_(0, rows, m)
    v_all.index_copy_(0, rows, v)
    step = m.div_(v.sqrt_().add_(EPSILON))
    if torch.is_tensor(rate):
        weight.index_add_(0, rows, step.mul_(rate), alpha=-1)
    else:
        weight.index_add_(0, rows, step, alpha=-rate)



class TorchGraphStep:
    """TorchGroupStep's step at one rank (one table: TorchDedupStep's) over buffers whose sizes
    never change, captured once with torch.cuda.CUDAGraph and replayed: what a PyTorch user gets
    from CUDA graphs for this step, the peer issue 45 holds sok1x's captured step against.

    The distinct keys come from one sort of the step's keys (torch.unique's output is as long
    as the data says, which a graph cannot be): the i-th distinct key in the i-th slot, a slot
    past the last distinct key pointing at a scratch row of its own appended to the shard (one
    row for all of them made the pads' updates contend for it: 13 ms a step on seed), which
    that pad alone reads and updates (its gradient is zero); the real rows get LazyAdam's (or
    Adagrad's) update exactly as TorchGroupStep gives them. The learning rate is a device scalar
    set before each replay. A step's host work: the keys copied into the graph's buffer, the rate
    filled in, one replay.

    weight: the shard [rows, dim] (copied); key_count: the keys of every step; key_offsets,
    hotness, batch: as TorchGroupStep's (None: one table, each key its own output row).
    step(keys) takes every table's keys as one int64 array (the tables one after the other)
    and returns the outputs (one per table, or one), the graph's own buffers, valid until the
    next step. shard() lends the shard and its slots to another peer (torch_dedup beside it:
    one H200 holds sok1x's dlrm26 and two copies of it, not three); snapshot() lets the two
    start their first steps from the same rows."""

    WARMUP = 3

    def __init__(self, weight, key_count, optimizer="lazy_adam", key_offsets=None, hotness=None,
                 batch=None):
        device = weight.device
        self.weight = torch.cat([weight, weight.new_zeros((key_count, weight.shape[1]))])
        self.pad_rows = torch.arange(key_count, device=device) + int(weight.shape[0])
        self.optimizer, self.count, self.batch = optimizer, 0, batch
        self.slots = [torch.zeros_like(self.weight)] + (
            [torch.zeros_like(self.weight)] if optimizer == "lazy_adam" else [])
        if optimizer == "adagrad":
            self.slots[0].fill_(ADAGRAD_INITIAL)
        self.keys = torch.zeros(key_count, dtype=torch.int64, device=device)
        self.rate = torch.zeros((), dtype=torch.float32, device=device)
        self.position_offsets = self.segments = None
        self.tables = 1
        if key_offsets is not None:
            counts = torch.tensor([batch * h for h in hotness], device=device)
            self.position_offsets = torch.repeat_interleave(
                torch.tensor(key_offsets, dtype=torch.int64, device=device), counts)
            self.tables = len(hotness)
            if any(h != 1 for h in hotness):
                self.segments = torch.cat([
                    t * batch + torch.div(torch.arange(batch * h, device=device), h,
                                          rounding_mode="floor")
                    for t, h in enumerate(hotness)])
        self.rows = int(weight.shape[0])
        self.restore = lambda: None  # a snapshot() its caller keeps here
        self.graph, self.out = self._captured()
        self.outputs = [self.out] if key_offsets is None else list(self.out.split(batch))

    def shard(self):
        """(weight, slots): views of the shard's rows and its slots' (the scratch rows left
        out), for a peer that steps over the same memory."""
        return self.weight[:self.rows], [slot[:self.rows] for slot in self.slots]

    def _rows_of(self, keys):
        return keys if self.position_offsets is None else keys + self.position_offsets

    def snapshot(self, keys_list):
        """Returns a function that puts back, once, the rows the steps of `keys_list` (this
        step's key arrays) may change, in the shard and its slots, as they are now."""
        rows = torch.unique(torch.cat([self._rows_of(k) for k in keys_list]))
        state = [self.weight] + self.slots
        saved = [t.index_select(0, rows) for t in state]

        def restore():
            for t, before in zip(state, saved):
                t.index_copy_(0, rows, before)
            saved.clear()
        return restore

    def _captured(self):
        """Warms the step up on a side stream (as torch.cuda.graphs asks), captures it, and puts
        back the rows the warm-up's keys (zeros) changed in the shard and its slots."""
        restore = self.snapshot([self.keys])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._step()
        restore()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-up's blocks back to the driver, for sok1x's pool
        return graph, out

    @torch.no_grad()
    def _step(self):
        keys = self.keys if self.position_offsets is None else self.keys + self.position_offsets
        ordered, order = torch.sort(keys)
        first = torch.ones_like(ordered, dtype=torch.bool)
        first[1:] = ordered[1:] != ordered[:-1]
        slot = torch.cumsum(first, 0) - 1  # the distinct key of each ordered position
        inverse = torch.empty_like(slot).scatter_(0, order, slot)
        rows = self.pad_rows.clone().scatter_(0, slot, ordered)
        pooled, grads = _pooled_and_summed(self.weight.index_select(0, rows), inverse,
                                           self.segments, self.tables * (self.batch or 0))
        if self.optimizer == "adagrad":
            _adagrad(self.weight, self.slots[0], rows, grads)
        else:
            _lazy_adam(self.weight, self.slots[0], self.slots[1], rows, grads, self.rate)
        return pooled

    def step(self, keys):
        self.count += 1
        if self.optimizer == "lazy_adam":
            self.rate.fill_(lazy_adam_hyper(self.count)["lr_t"])
        self.keys.copy_(keys)
        self.graph.replay()
        return self.outputs

    def floor_ms(self, replays=50):
        """The GPU's time for one replay, replayed back to back with no host work between them
        (the keys and rate left as they are): the step's floor on this device. Changes the shard,
        so call it after every figure is taken."""
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / replays
