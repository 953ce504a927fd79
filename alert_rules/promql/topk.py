"""topk and bottomk with the heap of Go's ``container/heap``, so that ties keep the series Prometheus keeps.

Prometheus 2.42 keeps, per group, a heap of at most k samples whose root is the worst one (NaN counts as
the worst of all); a new sample replaces the root only when strictly better. Which of several equal
samples sits at the root, and so is dropped, depends on the heap's exact sift order: that is reproduced.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from alert_rules.promql.values import Labels, Sample, Vector

Less = Callable[[float, float], bool]


def _less_top(a: float, b: float) -> bool:
    return math.isnan(a) or a < b


def _less_bottom(a: float, b: float) -> bool:
    return math.isnan(a) or a > b


def _up(heap: list[Sample], j: int, less: Less) -> None:
    while j > 0:
        i = (j - 1) // 2
        if not less(heap[j][1], heap[i][1]):
            break
        heap[i], heap[j] = heap[j], heap[i]
        j = i


def _down(heap: list[Sample], i: int, n: int, less: Less) -> None:
    while True:
        j = 2 * i + 1
        if j >= n:
            return
        if j + 1 < n and less(heap[j + 1][1], heap[j][1]):
            j += 1
        if not less(heap[j][1], heap[i][1]):
            return
        heap[i], heap[j] = heap[j], heap[i]
        i = j


def select(op: str, k: int, vec: Vector, key_of: Callable[[Labels], Labels]) -> Vector:
    """topk (``op == "topk"``) or bottomk of every group; each group's survivors best first."""
    less = _less_top if op == "topk" else _less_bottom
    groups: dict[Labels, list[Sample]] = {}
    for sample in vec:
        value = sample[1]
        heap = groups.get(key_of(sample[0]))
        if heap is None:
            groups[key_of(sample[0])] = [sample]
            continue
        root = heap[0][1]
        better = value > root if op == "topk" else value < root
        if len(heap) < k or better or math.isnan(root):
            if len(heap) == k:
                if k == 1:  # Prometheus replaces in place
                    heap[0] = sample
                    continue
                last = len(heap) - 1  # heap.Pop: swap the root to the end, sift down, drop it
                heap[0], heap[last] = heap[last], heap[0]
                _down(heap, 0, last, less)
                heap.pop()
            heap.append(sample)  # heap.Push
            _up(heap, len(heap) - 1, less)
    out: Vector = []
    for heap in groups.values():
        out.extend(sorted(heap, key=lambda s: (math.isnan(s[1]), -s[1] if op == "topk" else s[1])))
    return out
