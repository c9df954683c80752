"""The preallocated KV cache (pygpt.nn.kv_cache): in-place appends against concatenation (the
old cache, written here as the oracle), the rolling window's exact contents across many moves of
its room, growth past the capacity, reassigned rows (beam search), rows of different lengths
and put_rows; and whole-model greedy decoding with it against the concatenating oracle, for
absolute and rolling encodings, well past the context."""

import dataclasses

import pytest
import torch

from helpers import TINY, make_model, rand_tokens
from pygpt.decoding.sampling import Sampling
from pygpt.nn import KVCache, LayerKV


class ConcatKV(LayerKV):
    """The cache as it was: torch.cat per append, the oldest sliced off past the window."""

    def append(self, k, v, lengths=None):
        assert lengths is None
        if self._k is not None:
            k, v = torch.cat([self._k, k], dim=2), torch.cat([self._v, v], dim=2)
        over = 0 if self.window is None else k.shape[2] - self.window
        if over > 0:
            k, v, self.dropped = k[:, :, over:], v[:, :, over:], self.dropped + over
        self._k, self._v = k, v
        return k, v


def _kv(T, B=2, H=3, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D + 1, generator=g)


@pytest.mark.parametrize("window,capacity", [(None, 4), (None, 64), (5, None), (1, None),
                                             (7, 7)])
def test_in_place_appends_equal_concatenation(window, capacity):
    """Chunks then single positions, far past the capacity or window: the same keys and
    values (values wider than keys), lengths and positions as concatenating; views, not
    copies, of one buffer while the room lasts."""
    cache, oracle = LayerKV(window=window, capacity=capacity), ConcatKV(window=window)
    chunks = [1, 3] if window in (None, 7) else [1]
    for step, n in enumerate(chunks + [1] * 40):
        k, v = _kv(n, seed=step)
        got, want = cache.append(k, v), oracle.append(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"step {step}"
        assert cache.length == oracle.length and cache.position == oracle.position
        assert got[0] is cache.k and got[1] is cache.v
    if window is not None:
        assert cache.k.data_ptr() != k.data_ptr() and cache._bufs[0].shape[2] == 2 * window


def test_growth_doubles_and_reassigned_rows_are_kept():
    cache = LayerKV(capacity=2)
    k, v = _kv(3)
    cache.append(k, v)
    assert cache._bufs[0].shape[2] == 3
    cache.append(*_kv(1, seed=1))
    assert cache._bufs[0].shape[2] == 6 and cache.length == 4
    rows = torch.tensor([1, 1])
    kept_k, kept_v = cache.k.index_select(0, rows), cache.v.index_select(0, rows)
    cache.k, cache.v = kept_k, kept_v  # as beam search re-selects hypotheses
    k1, v1 = _kv(1, seed=2)
    got_k, got_v = cache.append(k1, v1)
    assert torch.equal(got_k, torch.cat([kept_k, k1], 2))
    assert torch.equal(got_v, torch.cat([kept_v, v1], 2))
    with pytest.raises(ValueError, match="holds 2 rows, got 3"):
        cache.append(*_kv(1, B=3))
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        LayerKV(capacity=0)


@pytest.mark.parametrize("window", [None, 4])
def test_rows_of_different_lengths(window):
    """A padded prefill with per-row lengths, then steps: each row holds exactly its own
    positions at the front (a full row of a rolling cache drops its oldest), the positions are
    per row, and the cache turns uniform once the rows agree."""
    cache = LayerKV(window=window, capacity=8)
    lens = [1, 3]
    k, v = _kv(3)
    cache.append(k, v, torch.tensor(lens))
    rows = [[(k[b, :, t], v[b, :, t]) for t in range(n)] for b, n in enumerate(lens)]
    assert cache.lengths.tolist() == lens
    for step in range(6):
        k1, v1 = _kv(1, seed=step + 1)
        assert cache.next_positions.tolist() == [step + n for n in lens]
        cache.append(k1, v1)
        for b in range(2):
            rows[b].append((k1[b, :, 0], v1[b, :, 0]))
            held = rows[b][-window:] if window else rows[b]
            n = len(held)
            assert torch.equal(cache.k[b, :, :n], torch.stack([h[0] for h in held], 1))
            assert torch.equal(cache.v[b, :, :n], torch.stack([h[1] for h in held], 1))
    if window:  # both rows full: uniform lengths again, positions still per row
        assert cache.lengths is None and cache.next_positions.tolist() == [7, 9]
    with pytest.raises(ValueError, match="counts in"):
        cache.append(*_kv(1), torch.tensor([2, 0]))
    ragged = LayerKV(capacity=4)
    ragged.append(*_kv(2), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="differ in length"):
        ragged.k = ragged.k.index_select(0, torch.tensor([1, 0]))


def test_put_rows_restarts_rows_and_errors():
    cache = KVCache(2, capacity=6)
    for layer in cache.layers:
        layer.append(*_kv(4, B=3))
    other = KVCache(2, capacity=6)
    for layer in other.layers:
        layer.append(*_kv(2, B=1, seed=5))
    cache.put_rows([1], other)
    assert cache[0].lengths.tolist() == [4, 2, 4]
    assert torch.equal(cache[0].k[1, :, :2], other[0].k[0])
    assert cache.next_positions.tolist() == [4, 2, 4]
    cache.put_rows([0, 2], None)
    assert cache[1].lengths.tolist() == [0, 2, 0] and cache.length == 2
    with pytest.raises(ValueError, match="rows of different lengths need a cache"):
        LayerKV().append(*_kv(2), torch.tensor([1, 2]))
    rolling = LayerKV(window=3)
    rolling.append(*_kv(2))
    with pytest.raises(ValueError, match="rows start at position 0"):
        rolling.put_rows([0], None)


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("encoding", ["learned", "sinusoidal", "rotary", "relative", "alibi"])
def test_model_decoding_equals_the_concatenating_cache(encoding, kernels, monkeypatch):
    """Greedy decoding 3 contexts long (absolute positions re-prefill, the others roll): the
    same tokens and the same logits as with the concatenating cache."""
    cfg = dataclasses.replace(TINY, pos_encoding=encoding)
    model = make_model(cfg, kernels, spread=0.3).eval()
    idx, n = rand_tokens(2, 5), 3 * cfg.block_size
    greedy = dict(sampling=Sampling(greedy=True))
    new = model.generate(idx, n, **greedy)

    def concat_cache():
        window = model.context_length if model.rolling_cache else None
        cache = KVCache(0)
        cache.layers = [ConcatKV(window=window) for _ in model.blocks]
        return cache

    monkeypatch.setattr(model, "new_cache", concat_cache)
    assert torch.equal(new, model.generate(idx, n, **greedy))
