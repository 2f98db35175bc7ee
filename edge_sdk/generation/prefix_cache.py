"""KV snapshots of token prefixes (a system prompt, a chat history), shared read-only between
generations of a :class:`~edge_sdk.generation.engine.GenerationEngine`.

A prompt's prefix is cut into blocks of ``block`` tokens; block ``i``'s key is a SHA-256 over the
previous block's key and block ``i``'s token ids, so a key names the whole prefix up to it (the
scheme vLLM's automatic prefix caching uses: https://docs.vllm.ai/en/latest/design/prefix_caching.html).
An entry holds one snapshot of ``L`` tokens of KV (``[2 * layers, kv_heads, L, head_dim]``) and is
reachable through the keys of each of its block boundaries, so a later prompt that shares only its
first blocks (the same system prompt, another question) still finds it. A hit is also checked token
for token against the entry's ids before it is used: a stream never gets KV of a prefix it did not send.

Entries are never written after they are made (the engine copies a snapshot into the stream's own
KV slot), counted in tokens against the engine's one KV budget, and evicted least recently used
first when running streams need the room.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import OptionsError

__all__ = ["PrefixCache", "PrefixEntry"]


@dataclass(frozen=True)
class PrefixEntry:
    """One snapshot: ``ids`` (the prefix) and its KV."""

    ids: np.ndarray
    kv: np.ndarray
    created: float

    @property
    def tokens(self) -> int:
        """Tokens the snapshot holds."""
        return int(self.ids.shape[0])


def _block_keys(ids: np.ndarray, block: int, limit: int) -> list[bytes]:
    keys: list[bytes] = []
    h = b""
    for end in range(block, limit + 1, block):
        h = hashlib.sha256(h + ids[end - block : end].astype("<i8").tobytes()).digest()
        keys.append(h)
    return keys


class PrefixCache:
    """Snapshots by token prefix (see the module docs). ``capacity_tokens`` bounds what it holds;
    the engine lowers the bound with :meth:`evict_to` while streams need the KV budget."""

    def __init__(self, block: int = 32, capacity_tokens: int = 0) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise OptionsError(f"prefix cache block: expected an int >= 1 (tokens), got {block!r}")
        self.block = block
        self.capacity_tokens = int(capacity_tokens)
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # id -> entry, least recently used first
        self._index: dict[bytes, list[int]] = {}  # block key -> entry ids that contain that prefix
        self._keys: dict[int, list[bytes]] = {}
        self._next = 0
        self.tokens = 0
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int] | np.ndarray) -> tuple[PrefixEntry | None, int]:
        """The entry with the longest block-aligned prefix of ``ids`` and how many tokens of it to
        use (at most ``len(ids) - 1``: the last prompt token must run to give the next token's logits)."""
        arr = np.asarray(ids, dtype=np.int64)
        limit = (len(arr) - 1) // self.block * self.block
        best, n = -1, 0
        for i, key in enumerate(_block_keys(arr, self.block, limit)):
            cands = self._index.get(key)
            if not cands:
                break
            m = (i + 1) * self.block
            if not np.array_equal(self._entries[cands[-1]].ids[:m], arr[:m]):  # never trust the hash alone
                break
            best, n = cands[-1], m
        if best < 0:
            self.misses += 1
            return None, 0
        self.hits += 1
        self.hit_tokens += n
        self._entries.move_to_end(best)
        return self._entries[best], n

    def covered(self, ids: Sequence[int] | np.ndarray) -> int:
        """How many block-aligned tokens of ``ids`` some entry already holds (no hit counted)."""
        arr = np.asarray(ids, dtype=np.int64)
        n = 0
        for i, key in enumerate(_block_keys(arr, self.block, len(arr) // self.block * self.block)):
            cands = self._index.get(key)
            if not cands or not np.array_equal(self._entries[cands[-1]].ids[: (i + 1) * self.block], arr[: (i + 1) * self.block]):
                break
            n = (i + 1) * self.block
        return n

    def insert(self, ids: Sequence[int] | np.ndarray, kv: np.ndarray) -> PrefixEntry | None:
        """Keep ``kv`` (``[2 * layers, kv_heads, >= L, head_dim]``, copied by the caller: the cache owns it)
        as the snapshot of the first ``L = len(ids)`` tokens (a multiple of ``block``). Evicts least
        recently used entries to stay within ``capacity_tokens``; returns None when it cannot fit."""
        arr = np.asarray(ids, dtype=np.int64).copy()
        n = len(arr)
        if n == 0 or n % self.block or kv.shape[2] < n:
            raise OptionsError(
                f"prefix cache insert: expected a multiple of {self.block} tokens with KV for all of them, got {n} ids, KV of {kv.shape[2]}"
            )
        if n > self.capacity_tokens:
            return None
        self.evict_to(self.capacity_tokens - n)
        eid = self._next
        self._next += 1
        entry = PrefixEntry(arr, kv[:, :, :n], time.monotonic())
        arr.setflags(write=False)
        entry.kv.setflags(write=False)
        keys = _block_keys(arr, self.block, n)
        self._entries[eid] = entry
        self._keys[eid] = keys
        for k in keys:
            self._index.setdefault(k, []).append(eid)
        self.tokens += n
        return entry

    def evict_to(self, tokens: int) -> int:
        """Evict least recently used entries until at most ``tokens`` are held; returns the tokens freed."""
        freed = 0
        while self._entries and self.tokens > max(tokens, 0):
            eid, entry = self._entries.popitem(last=False)
            for k in self._keys.pop(eid):
                lst = self._index[k]
                lst.remove(eid)
                if not lst:
                    del self._index[k]
            self.tokens -= entry.tokens
            freed += entry.tokens
            self.evictions += 1
        return freed

    def clear(self) -> None:
        """Drop every entry."""
        self.evict_to(0)

    def stats(self) -> dict[str, int]:
        """Entries, tokens held, capacity, hits, misses, tokens served from the cache, evictions."""
        return {
            "entries": len(self._entries),
            "tokens": self.tokens,
            "capacity_tokens": self.capacity_tokens,
            "hits": self.hits,
            "misses": self.misses,
            "hit_tokens": self.hit_tokens,
            "evictions": self.evictions,
        }
