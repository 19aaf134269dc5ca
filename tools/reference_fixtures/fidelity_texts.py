"""The code and chat texts of the fidelity fixtures (make_fidelity_fixtures.py; the prose is
make_dense_fixtures.py's ``TEXT``): each at least 512 tokens for every model's tokenizer."""

from __future__ import annotations

CODE = '''"""A small least-recently-used cache with a time limit, and a command line to exercise it."""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class Entry(Generic[V]):
    value: V
    expires: float


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expired: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclass
class TTLCache(Generic[K, V]):
    """Keeps at most ``capacity`` entries, each for at most ``ttl`` seconds."""

    capacity: int
    ttl: float
    clock: Callable[[], float] = time.monotonic
    stats: Stats = field(default_factory=Stats)
    _data: OrderedDict = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError(f"capacity must be positive, not {self.capacity}")
        if self.ttl <= 0:
            raise ValueError(f"ttl must be positive, not {self.ttl}")

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        entry = self._data.get(key)
        return entry is not None and entry.expires > self.clock()

    def get(self, key: K, default: V | None = None) -> V | None:
        entry = self._data.get(key)
        if entry is None:
            self.stats.misses += 1
            return default
        if entry.expires <= self.clock():
            del self._data[key]
            self.stats.expired += 1
            self.stats.misses += 1
            return default
        self._data.move_to_end(key)
        self.stats.hits += 1
        return entry.value

    def put(self, key: K, value: V) -> None:
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = Entry(value, self.clock() + self.ttl)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.stats.evictions += 1

    def purge(self) -> int:
        """Drops every expired entry; returns how many."""
        now = self.clock()
        stale = [k for k, e in self._data.items() if e.expires <= now]
        for k in stale:
            del self._data[k]
        self.stats.expired += len(stale)
        return len(stale)

    def items(self) -> Iterator[tuple[K, V]]:
        now = self.clock()
        for k, e in list(self._data.items()):
            if e.expires > now:
                yield k, e.value


def memoize(cache: TTLCache) -> Callable:
    def wrap(fn: Callable) -> Callable:
        def inner(*args):
            hit = cache.get(args)
            if hit is None:
                hit = fn(*args)
                cache.put(args, hit)
            return hit

        inner.__name__ = fn.__name__
        inner.__doc__ = fn.__doc__
        return inner

    return wrap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--keys", type=int, default=1000)
    args = parser.parse_args(argv)
    cache: TTLCache[int, int] = TTLCache(args.capacity, args.ttl)

    @memoize(cache)
    def square(n: int) -> int:
        return n * n

    for i in range(args.keys):
        square(i % (args.capacity * 2))
    print(f"hit rate {cache.stats.hit_rate:.1%}, {cache.stats.evictions} evictions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

CHAT = [
    {"role": "system", "content": "You are a patient teacher who explains things step by step."},
    {"role": "user", "content": "Why does bread go stale, and is it the same as drying out?"},
    {
        "role": "assistant",
        "content": (
            "Not quite. Stale bread often still holds most of its water. What changes is the starch. When "
            "bread bakes, the starch granules absorb water and swell, and their long chains loosen into a "
            "soft, disordered gel. As the loaf cools and sits, those chains slowly line up again and pack "
            "into crystals, a process called retrogradation. The crumb becomes firm and crumbly even though "
            "the water is still there, now trapped in a different structure. Drying out happens too, "
            "mostly at the crust, but it is a separate process. That is why warming a stale loaf in the "
            "oven for a few minutes makes it soft again: the heat melts the starch crystals back into a "
            "gel, at least until it cools."
        ),
    },
    {"role": "user", "content": "So should I keep bread in the fridge to slow it down?"},
    {
        "role": "assistant",
        "content": (
            "It is the opposite, surprisingly. Retrogradation is fastest at temperatures just above "
            "freezing, so the fridge makes bread go stale several times faster than the counter. Freezing "
            "is different: below zero the chains can barely move, so the process almost stops. The best "
            "plan is to keep the bread you will eat in a day or two at room temperature, wrapped in paper "
            "or in a bread box so the crust does not turn leathery, and to slice and freeze the rest. "
            "Slices can go straight from the freezer into the toaster."
        ),
    },
    {"role": "user", "content": "Does the kind of bread matter? My sourdough seems to last longer."},
    {
        "role": "assistant",
        "content": (
            "Yes, and your observation is a common one. Several things slow staling. Fat coats the starch "
            "and gets in the way of the chains lining up, so enriched breads such as brioche stay soft "
            "longer. Sugar holds on to water. In sourdough the acids produced by the bacteria change how "
            "the starch and gluten behave, and some of the enzymes in a long fermentation break starch "
            "into shorter pieces that crystallise less easily. A thick, well-baked crust also acts as a "
            "barrier against moisture loss. Commercial bakers add enzymes and emulsifiers for the same "
            "reasons, which is why supermarket sandwich bread can stay soft for a week or more."
        ),
    },
    {"role": "user", "content": "Could I test that at home with a simple experiment?"},
    {
        "role": "assistant",
        "content": (
            "Certainly. Bake or buy two loaves, one plain yeasted bread and one sourdough, ideally of "
            "similar size and crust. Cut each into four pieces. Store one piece of each on the counter in "
            "paper, one in a sealed plastic bag, one in the fridge and one in the freezer. Each day, take "
            "a thin slice from every piece, press it gently with a finger and note how quickly it springs "
            "back, then taste it. Keep a small table of the results. After four or five days you should "
            "see the fridge samples stale first, the frozen ones barely change, and the sourdough hold up "
            "better than the plain loaf in every condition."
        ),
    },
]
