"""How the query rows of one forward call split into sequences, and into the attention pieces
and buckets every layer's attention walks (computed once per call, shared by all layers).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from parity.model.gemm import ROW_TILE

KV_TILE = 64  # keys are visited in tiles of this many, counted from absolute position 0
QUERY_CHUNK = 64  # query rows per attention piece (see SeqLayout.groups)
ATTENTION_ROW_MULTIPLE = 8  # prefill pieces round their rows up to this (fewer buckets)
# One KV head's score elements (2 MB in fp32) aligned attention works on at once: a group's
# pieces run in blocks of about this size, a long piece's softmax in key chunks of it, so its
# passes over the scores run in cache instead of sweeping hundreds of MB.
BLOCK_SCORES = 2**19


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@dataclass
class SeqLayout:
    """How the N query rows of one forward call split into sequences.

    Rows of one sequence are contiguous: sequence s owns rows
    `starts[s] : starts[s] + lengths[s]`, whose absolute positions are `positions[rows]`.
    `kv_lens[s]` is the number of keys sequence s has after this call (its last position
    + 1). Derived index tensors are computed once and shared by every layer.
    """

    starts: list[int]
    lengths: list[int]
    positions: torch.Tensor  # [N] long
    kv_lens: list[int]

    @classmethod
    def from_lengths(cls, lengths: list[int], offsets: list[int] | None = None) -> SeqLayout:
        """Sequences of `lengths` new tokens, each continuing after `offsets[s]` cached ones."""
        offsets = offsets or [0] * len(lengths)
        if len(offsets) != len(lengths):
            raise ValueError(f"{len(lengths)} lengths but {len(offsets)} offsets")
        if min(lengths, default=1) < 1:
            raise ValueError("every sequence in a forward call needs at least one new token")
        starts = list(itertools.accumulate(lengths, initial=0))[:-1]
        # row i of sequence s sits at position offsets[s] + (i - starts[s])
        shift = torch.tensor([off - start for off, start in zip(offsets, starts, strict=True)])
        positions = torch.arange(sum(lengths)) + shift.repeat_interleave(torch.tensor(lengths))
        kv = [off + n for n, off in zip(lengths, offsets, strict=True)]
        return cls(starts, list(lengths), positions, kv)

    @cached_property
    def seq_of_row(self) -> torch.Tensor:
        """[N] the sequence index of each row."""
        return torch.repeat_interleave(torch.arange(len(self.lengths)), torch.tensor(self.lengths))

    @cached_property
    def max_kv_len(self) -> int:
        return round_up(max(self.kv_lens), KV_TILE)

    def groups(self, g_heads: int) -> list[Group]:
        """The query rows cut into pieces and bucketed, so that no piece computes what it cannot see.

        Each sequence's rows are cut into pieces of at most QUERY_CHUNK rows; a piece visits
        only the key tiles its last row can see (causal tiles are skipped, not masked), and a
        decode step is not padded to a prefill (its query matrix, one row per query head,
        is padded to ROW_TILE rows at the matrix level). Pieces are bucketed by row count and
        by their key tile count rounded up to a power of two, which bounds both the wasted
        tiles (< 2x) and the number of buckets. Skipped tiles would only add exact zeros.
        """
        if g_heads not in self._groups:
            self._groups[g_heads] = self._make_groups(g_heads)
        return self._groups[g_heads]

    @cached_property
    def _groups(self) -> dict[int, list[Group]]:
        return {}

    def attention_scores(self, heads: int, kv_heads: int) -> int:
        """Attention score elements (padded query-matrix rows x KV heads x keys) of one layer,
        as `attention_scores` counts them: read off the groups the forward walks."""
        return sum(len(g.seqs) * kv_heads * g.matrix_rows * g.kv_len
                   for g in self.groups(heads // kv_heads))

    def _make_groups(self, g_heads: int) -> list[Group]:
        buckets: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        for s, (start, n, kv) in enumerate(
            zip(self.starts, self.lengths, self.kv_lens, strict=True)
        ):
            for a, rows, keys in _pieces(n, kv):
                buckets.setdefault(_bucket(rows, keys), []).append((s, start + a, rows, keys))
        out = []
        for (rpad, _), pieces in sorted(buckets.items()):
            seqs, first, n, keys = (list(c) for c in zip(*pieces, strict=True))
            first_t, offset = torch.tensor(first)[:, None], torch.arange(rpad)[None, :]
            valid = offset < torch.tensor(n)[:, None]
            # padded rows repeat the piece's first row: finite, and dropped afterwards
            rows = torch.where(valid, first_t + offset, first_t)
            kv_exact = max(keys)
            out.append(
                Group(
                    torch.tensor(seqs),
                    rows,
                    valid,
                    self.positions[rows],
                    round_up(kv_exact, KV_TILE),
                    kv_exact,
                    g_heads,
                )
            )
        return out


@dataclass(frozen=True)
class PagedKeys:
    """One layer's keys (or values) for a call, left in a paged pool for attention to read in
    place: `pool` [blocks, Hkv, block_size, D] (D contiguous, other strides free), `table`
    [S, blocks] int32, each sequence's blocks in order (entries past its keys are not read
    by the fused kernel; they must name a block of finite values for `dense`), `length` the
    call's L (`SeqLayout.max_kv_len`)."""

    pool: torch.Tensor
    table: torch.Tensor
    length: int

    def dense(self) -> torch.Tensor:
        """The same keys gathered as [S, Hkv, L, D], for the kernels that read them so."""
        _, hkv, bs, d = self.pool.shape
        n = -(-self.length // bs)
        table = self.table[:, :n].long()
        table = torch.nn.functional.pad(table, (0, n - table.shape[1]))
        keys = self.pool[table].transpose(1, 2).reshape(table.shape[0], hkv, n * bs, d)
        return keys[:, :, : self.length]


def _pieces(n: int, kv: int) -> list[tuple[int, int, int]]:
    """(first row, rows, keys its last row sees) of each piece of a sequence's n new rows
    that end at kv keys: cut every QUERY_CHUNK rows from the first."""
    return [
        (a, min(QUERY_CHUNK, n - a), kv - max(0, n - a - QUERY_CHUNK))
        for a in range(0, n, QUERY_CHUNK)
    ]


def _bucket(rows: int, keys: int) -> tuple[int, int]:
    """A piece's bucket: its padded row count and its key tiles rounded up to a power of two."""
    return _query_rows(rows), 1 << (-(-keys // KV_TILE) - 1).bit_length()


def attention_scores(
    lengths: Sequence[int], kv_lens: Sequence[int], heads: int, kv_heads: int
) -> int:
    """Score elements one attention layer materialises for sequences of `lengths` new rows
    ending at `kv_lens` keys: per bucket of `SeqLayout.groups`, pieces x KV heads x padded
    query-matrix rows x the bucket's longest keys (rounded up to KV_TILE). Computed from the
    bucketing rule alone, without tensors, so that a scheduler can price a chunk it has not
    built yet."""
    count: dict[tuple[int, int], int] = {}
    longest: dict[tuple[int, int], int] = {}
    for n, kv in zip(lengths, kv_lens, strict=True):
        for _, rows, keys in _pieces(n, kv):
            b = _bucket(rows, keys)
            count[b] = count.get(b, 0) + 1
            longest[b] = max(longest.get(b, 0), keys)
    g_heads = heads // kv_heads
    return sum(
        c * kv_heads * round_up(g_heads * b[0], ROW_TILE) * round_up(longest[b], KV_TILE)
        for b, c in count.items()
    )


def rows_within(budget: int, offset: int, limit: int, heads: int, kv_heads: int) -> int:
    """Most new rows (at most `limit`) of one sequence after `offset` cached tokens whose
    attention scores alone fit `budget`; never fewer than min(limit, ATTENTION_ROW_MULTIPLE),
    so that a long prompt always advances."""
    lo = min(limit, ATTENTION_ROW_MULTIPLE)
    hi = limit
    while lo < hi:  # the scores grow with the rows: binary search for the last that fits
        mid = (lo + hi + 1) // 2
        if attention_scores([mid], [offset + mid], heads, kv_heads) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _query_rows(n: int) -> int:
    """Rows a piece of n query rows is padded to (by repeating its first row).

    A decode step keeps its single row; longer pieces round up to ATTENTION_ROW_MULTIPLE so
    that pieces of similar length share a bucket. Either way the query matrix (G rows per
    piece row) is then zero-padded to a multiple of ROW_TILE for the GEMMs.
    """
    return 1 if n == 1 else round_up(n, ATTENTION_ROW_MULTIPLE)


def _consecutive(t: torch.Tensor) -> int | None:
    """t[0] when the 1-d tensor t is t[0], t[0] + 1, ..., else None."""
    first = int(t[0])
    return first if torch.equal(t, torch.arange(first, first + len(t))) else None


@dataclass
class Group:
    seqs: torch.Tensor  # [g] the sequence each piece belongs to
    rows: torch.Tensor  # [g, R] row indices into the flat batch
    valid: torch.Tensor  # [g, R] real rows
    positions: torch.Tensor  # [g, R] absolute positions of the rows
    kv_len: int  # keys visited, a multiple of KV_TILE
    kv_exact: int  # the longest piece's real key count
    g_heads: int  # query heads per KV head, stacked in the query matrix
    out_rows: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.out_rows = self.rows[self.valid]

    @property
    def matrix_rows(self) -> int:
        """Rows of each query matrix the GEMMs see: G*R real ones padded to ROW_TILE."""
        return round_up(self.g_heads * self.rows.shape[1], ROW_TILE)

    @cached_property
    def first_seq(self) -> int | None:
        """s when the pieces are sequences s, s+1, ... in order (their keys are then a slice
        of the call's, not a gather), else None."""
        return _consecutive(self.seqs)

    @cached_property
    def first_row(self) -> int | None:
        """r when the pieces are single rows r, r+1, ... in order (a decode step's rows:
        its query matrices are then a view of the call's), else None."""
        return _consecutive(self.rows[:, 0]) if self.rows.shape[1] == 1 else None

    @cached_property
    def mask_from(self) -> int:
        """The first key some row may not see: every row sees the keys before its position."""
        return int(self.positions.min()) + 1

    def visible(self, heads: int, start: int = 0) -> torch.Tensor:
        """[g, 1, heads*R, L - start] True where key start.. is visible: key position <= query
        position."""
        keys = torch.arange(start, self.kv_len)
        m = keys[None, None, :] <= self.positions[:, :, None]
        return m.unsqueeze(1).expand(-1, heads, -1, -1).reshape(m.shape[0], 1, -1, len(keys))

    @cached_property
    def hidden(self) -> torch.Tensor:
        """[g, 1, G*R, L - mask_from] the keys from mask_from on that each row of the query
        matrix must not see (every layer's)."""
        return ~self.visible(self.g_heads, self.mask_from)

    @cached_property
    def bias(self) -> torch.Tensor:
        """The keys each row may not see as an additive mask [g, 1, G*R, L]: -inf where
        hidden, 0 elsewhere."""
        hidden = ~self.visible(self.g_heads)
        return torch.zeros(hidden.shape).masked_fill_(hidden, float("-inf"))

    @cached_property
    def blocks(self) -> list[Group]:
        """The pieces in runs whose scores fit BLOCK_SCORES per KV head (a piece alone may
        not), each visiting only its own pieces' key tiles: the tiles it skips would only add
        exact zeros."""
        rows = self.matrix_rows
        if len(self.seqs) * rows * self.kv_len <= BLOCK_SCORES:
            return [self]  # one block: the group itself (a decode step's, usually)
        keys = (self.positions.amax(1) + 1).tolist()
        out, a = [], 0
        while a < len(keys):
            b, longest = a + 1, keys[a]
            while b < len(keys) and (b + 1 - a) * rows * round_up(
                    max(longest, keys[b]), KV_TILE) <= BLOCK_SCORES:
                longest = max(longest, keys[b])
                b += 1
            out.append(Group(self.seqs[a:b], self.rows[a:b], self.valid[a:b], self.positions[a:b],
                             round_up(longest, KV_TILE), longest, self.g_heads))
            a = b
        return out

    @property
    def chunk_keys(self) -> int:
        """Keys per softmax chunk: all the tiles, rounded up to a power of two, if the block's
        scores fit BLOCK_SCORES per KV head (one chunk: no copy of V), else the largest power
        of two of tiles that fits, so that per-chunk pairwise trees are subtrees of the one
        over all tiles."""
        fit = BLOCK_SCORES // (len(self.seqs) * self.matrix_rows * KV_TILE)
        tiles = self.kv_len // KV_TILE
        return (1 << ((tiles - 1).bit_length() if fit >= tiles else max(fit, 1).bit_length() - 1)) * KV_TILE
