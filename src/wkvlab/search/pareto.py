"""Quality versus memory: which measured configurations no other one beats on both."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    name: str
    memory: float  # bytes (weights + KV at the stated context)
    kld: float


def pareto_front(points: list[Point]) -> list[Point]:
    """Points not dominated (another point with memory <= and KLD <=, one of them strictly less),
    sorted by memory. Exact duplicates are all kept."""
    front = []
    for p in points:
        dominated = any(q.memory <= p.memory and q.kld <= p.kld and (q.memory < p.memory or q.kld < p.kld) for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: (p.memory, p.kld))
