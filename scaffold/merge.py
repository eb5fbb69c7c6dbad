"""Three-way merge of text files, line by line (diff3), with git's conflict markers.

``scaffold update`` merges *base* (the file scaffold generated last time), *ours* (the user's file now) and
*theirs* (the file scaffold generates now). The algorithm is classic diff3:

1. Diff base -> ours and base -> theirs. Runs of base lines matched in both diffs are stable regions, where
   all three files agree; between two stable regions lies an unstable chunk.
2. In a chunk, a side equal to base did not change there: take the other side. The same change on both sides
   is taken once. Otherwise the chunk's base is diffed against each side again, into hunks (a run of base
   lines and what replaces it, an insertion replacing none): hunks of the two sides that touch different
   base lines merge, an insertion next to the other side's change included (a helper appended after the
   file's last line, which scaffold changed; a line inserted after one scaffold rewrote). Two sides that
   change the same base line, or insert at the same place, conflict: lines common to the start and to the
   end of both sides are written once, outside the markers, and the rest as ``<<<<<<<`` ours ``=======``
   theirs ``>>>>>>>``, so every line the user changed is in the result.

Each diff anchors on the lines that occur once in each file, in the longest order-keeping sequence of them
(patience diff), and recurses into the gaps between anchors. A gap with no such line matches its equal first
and last lines, and what is left in between with difflib's SequenceMatcher (no autojunk) if that is small:
SequenceMatcher is cubic in the worst case (lines that repeat, "" or ``)``) and took 95 s on a rewritten file of
5000 lines; left unmatched, a large gap is one changed chunk, which loses nothing.

Lines end at ``\\n`` only, as in git (a form feed or a lone ``\\r`` does not split a line); a last line without
``\\n`` round-trips, and gets one before a marker so that markers are always lines of their own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher

# SequenceMatcher matches a gap without anchors of at most this many (lines of base) * (lines of the other) pairs.
SMALL_GAP = 10_000


@dataclass(frozen=True)
class MergeResult:
    """The merged text and the number of conflict regions written into it with markers."""

    text: str
    conflicts: int

    @property
    def clean(self) -> bool:
        return self.conflicts == 0


def merge3(
    base: str, ours: str, theirs: str, *, ours_label: str = "yours", theirs_label: str = "scaffold"
) -> MergeResult:
    """Merge the changes base -> ours and base -> theirs; conflicting chunks are written with both sides."""
    if ours == theirs or theirs == base:
        return MergeResult(ours, 0)
    if ours == base:
        return MergeResult(theirs, 0)
    b, o, t = _lines(base), _lines(ours), _lines(theirs)
    out: list[str] = []
    conflicts = 0
    bi = oi = ti = 0  # where the current unstable chunk starts in each file
    for bj, oj, tj, size in _stable_regions(b, o, t):  # the chunk ends where the next stable region starts
        chunk_b, chunk_o, chunk_t = b[bi:bj], o[oi:oj], t[ti:tj]
        if chunk_o == chunk_t or chunk_t == chunk_b:
            out += chunk_o
        elif chunk_o == chunk_b:
            out += chunk_t
        elif (merged := _merge_hunks(chunk_b, chunk_o, chunk_t)) is not None:
            out += merged
        else:
            _conflict(chunk_o, chunk_t, out, ours_label, theirs_label)
            conflicts += 1
        out += b[bj : bj + size]
        bi, oi, ti = bj + size, oj + size, tj + size
    return MergeResult("".join(out), conflicts)


def changed_lines(a: str, b: str) -> int:
    """How many lines a two-way diff of ``a`` and ``b`` changes: lines of either that it does not match."""
    la, lb = _lines(a), _lines(b)
    matched = sum(n for _, _, n in _matching_blocks(la, lb))
    return len(la) + len(lb) - 2 * matched


def _lines(text: str) -> list[str]:
    """Split after each ``\\n``; a last line without one is kept as it is (``"".join`` gives ``text`` back)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _stable_regions(b: list[str], o: list[str], t: list[str]) -> list[tuple[int, int, int, int]]:
    """(start in base, in ours, in theirs, length) of each run of base lines matched in both diffs, in order.

    The last region is empty and sits at the end of all three files, so that the chunk before it is merged too.
    """
    ours_blocks, theirs_blocks = _matching_blocks(b, o), _matching_blocks(b, t)
    regions = []
    i = j = 0
    while i < len(ours_blocks) and j < len(theirs_blocks):
        ob, oo, on = ours_blocks[i]
        tb, tt, tn = theirs_blocks[j]
        start, end = max(ob, tb), min(ob + on, tb + tn)
        if start < end:
            regions.append((start, oo + start - ob, tt + start - tb, end - start))
        if ob + on < tb + tn:
            i += 1
        else:
            j += 1
    regions.append((len(b), len(o), len(t), 0))
    return regions


def _matching_blocks(a: list[str], b: list[str]) -> list[tuple[int, int, int]]:
    """(start in a, start in b, length) of the matched runs, in order: ``a[i:i+n] == b[j:j+n]``."""
    blocks = []
    todo = [(0, len(a), 0, len(b))]
    while todo:
        alo, ahi, blo, bhi = todo.pop()
        if alo == ahi or blo == bhi:
            continue
        anchors = _unique_anchors(a, b, alo, ahi, blo, bhi)
        if not anchors:
            head = 0
            while alo + head < ahi and blo + head < bhi and a[alo + head] == b[blo + head]:
                head += 1
            tail = 0
            while alo + head < ahi - tail and blo + head < bhi - tail and a[ahi - 1 - tail] == b[bhi - 1 - tail]:
                tail += 1
            blocks += [(alo, blo, head), (ahi - tail, bhi - tail, tail)]
            alo, ahi, blo, bhi = alo + head, ahi - tail, blo + head, bhi - tail
            if (ahi - alo) * (bhi - blo) <= SMALL_GAP:
                matcher = SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
                blocks += [(alo + i, blo + j, n) for i, j, n in matcher.get_matching_blocks()]
            continue
        for i, j in anchors:
            todo.append((alo, i, blo, j))
            blocks.append((i, j, 1))
            alo, blo = i + 1, j + 1
        todo.append((alo, ahi, blo, bhi))
    return sorted(block for block in blocks if block[2])


def _unique_anchors(a: list[str], b: list[str], alo: int, ahi: int, blo: int, bhi: int) -> list[tuple[int, int]]:
    """The pairs (i, j), a[i] == b[j] a line once in a[alo:ahi] and once in b[blo:bhi], longest increasing in both."""
    in_a, in_b = Counter(a[alo:ahi]), Counter(b[blo:bhi])
    where_b = {b[j]: j for j in range(blo, bhi) if in_b[b[j]] == 1}
    pairs = [(i, where_b[a[i]]) for i in range(alo, ahi) if in_a[a[i]] == 1 and a[i] in where_b]
    # Longest increasing subsequence of the j's, by patience sorting: ends[k] is the smallest j that ends an
    # increasing run of length k + 1 so far, last[k] the pair that holds it, before[p] the pair before p in its run.
    ends: list[int] = []
    last: list[int] = []
    before: list[int] = []
    for p, (_, j) in enumerate(pairs):
        k = bisect_left(ends, j)
        before.append(last[k - 1] if k else -1)
        if k == len(ends):
            ends.append(j)
            last.append(p)
        else:
            ends[k], last[k] = j, p
    run = []
    p = last[-1] if last else -1
    while p >= 0:
        run.append(pairs[p])
        p = before[p]
    return run[::-1]


def _hunks(base: list[str], side: list[str]) -> list[tuple[int, int, tuple[str, ...]]]:
    """The changes ``base`` -> ``side``: (start, end, lines), ``base[start:end]`` replaced by ``lines``."""
    hunks = []
    i = j = 0
    for bi, sj, n in [*_matching_blocks(base, side), (len(base), len(side), 0)]:
        if i < bi or j < sj:
            hunks.append((i, bi, tuple(side[j:sj])))
        i, j = bi + n, sj + n
    return hunks


def _overlap(a: tuple[int, int, tuple[str, ...]], b: tuple[int, int, tuple[str, ...]]) -> bool:
    """Whether two hunks of different sides touch the same base lines or insert at the same place (an
    insertion at either end of the other's lines does not: its place among them is clear)."""
    (s1, e1, _), (s2, e2, _) = a, b
    if s1 == e1 and s2 == e2:
        return s1 == s2
    if s1 == e1:
        return s2 < s1 < e2
    if s2 == e2:
        return s1 < s2 < e1
    return max(s1, s2) < min(e1, e2)


def _merge_hunks(b: list[str], o: list[str], t: list[str]) -> list[str] | None:
    """The chunk with both sides' hunks applied, where no two of them overlap; else None (a conflict)."""
    ours, theirs = _hunks(b, o), _hunks(b, t)
    shared = set(ours) & set(theirs)  # the same change on both sides, taken once
    ours = [h for h in ours if h not in shared]
    if any(_overlap(h, k) for h in ours for k in theirs if k not in shared):
        return None
    merged: list[str] = []
    at = 0
    # An insertion sorts before the change that starts where it is, after the one that ends there.
    for start, end, lines in sorted([*ours, *theirs], key=lambda h: (h[0], h[1])):
        merged += b[at:start]
        merged += lines
        at = end
    merged += b[at:]
    if any(not line.endswith("\n") for line in merged[:-1]):  # a last line without "\n" now has lines after it
        return None
    return merged


def _conflict(o: list[str], t: list[str], out: list[str], ours_label: str, theirs_label: str) -> None:
    """Write one conflict to ``out``: the lines both sides share at its start and end once, the rest marked."""
    shortest = min(len(o), len(t))
    head = 0
    while head < shortest and o[head] == t[head]:
        head += 1
    tail = 0
    while tail < shortest - head and o[-1 - tail] == t[-1 - tail]:
        tail += 1
    out += o[:head]
    out.append(f"<<<<<<< {ours_label}\n")
    _side(o[head : len(o) - tail], out)
    out.append("=======\n")
    _side(t[head : len(t) - tail], out)
    out.append(f">>>>>>> {theirs_label}\n")
    out += o[len(o) - tail :]


def _side(lines: list[str], out: list[str]) -> None:
    """Write one side of a conflict, ending it with a newline (a file's last line may have none)."""
    out += lines
    if lines and not lines[-1].endswith("\n"):
        out.append("\n")
