"""Synthetic coding tasks like the demo's, for the warm corpus and the warm check's held-out probes.

Each is a prompt, its deliverables, seed files and a worker's correct answer (script and result).
Deterministic for the `random.Random` passed in.
"""

from __future__ import annotations

import json
import random
from typing import Any

# Task families: (name, prompt template, deliverables, seed files, script text, result file text).
_SEQUENCES = {
    "fib": ("Fibonacci numbers", "print([0, 1, 1, 2, 3, 5, 8, 13, 21, 34][:{k}])\n"),
    "squares": ("square numbers", "print([i * i for i in range({k})])\n"),
    "evens": ("even numbers", "print([2 * i for i in range({k})])\n"),
    "cubes": ("cube numbers", "print([i ** 3 for i in range({k})])\n"),
    "odds": ("odd numbers", "print([2 * i + 1 for i in range({k})])\n"),
    "powers": ("powers of two", "print([2 ** i for i in range({k})])\n"),
}
_LIST_JOBS = {
    "sort": ("sorts the numbers", "nums = open('data/{d}.txt').read().split()\nprint(sorted(nums, key=int))\n"),
    "reverse": ("reverses the lines", "print(open('data/{d}.txt').read().splitlines()[::-1])\n"),
    "dedupe": ("removes repeated numbers", "print(sorted(set(open('data/{d}.txt').read().split())))\n"),
    "total": ("adds up the numbers", "print(sum(int(x) for x in open('data/{d}.txt').read().split()))\n"),
}
_COUNT_JOBS = {
    "primes": (
        "lists the primes below the number in data/limit.txt",
        "limit.txt",
        "n = int(open('data/limit.txt').read())\nprint([p for p in range(2, n) if all(p % d for d in range(2, p))])\n",
    ),
    "words": ("counts the words in data/text.txt", "text.txt", "print(len(open('data/text.txt').read().split()))\n"),
    "lines": ("counts the lines of data/log.txt", "log.txt", "print(len(open('data/log.txt').read().splitlines()))\n"),
}


def synthetic_task(rng: random.Random) -> dict[str, Any]:
    """A small coding task like the demo's: prompt, deliverables, seed files and a worker's answer."""
    kind = rng.randrange(3)
    if kind == 0:
        name = rng.choice(sorted(_SEQUENCES))
        what, code = _SEQUENCES[name]
        k = rng.choice([5, 8, 10, 12, 20])
        out = f"results/{name}.json"
        prompt = f"Write {name}.py that prints the first {k} {what} and save them to {out}."
        return {
            "prompt": prompt,
            "deliverables": [f"{name}.py", out],
            "files": {},
            "script": code.format(k=k),
            "result": json.dumps(_sequence(name, k)),
        }
    if kind == 1:
        name = rng.choice(sorted(_LIST_JOBS))
        what, code = _LIST_JOBS[name]
        d = rng.choice(["nums", "values", "input", "data"])
        out = f"results/{rng.choice(['sorted', 'out', name])}.txt"
        prompt = f"Write {name}.py that {what} in data/{d}.txt and writes them to {out}."
        nums = "\n".join(str(rng.randint(0, 99)) for _ in range(rng.randint(3, 6))) + "\n"
        return {
            "prompt": prompt,
            "deliverables": [f"{name}.py", out],
            "files": {f"data/{d}.txt": nums},
            "script": code.format(d=d),
            "result": _list_result(name, nums.split()),
        }
    name = rng.choice(sorted(_COUNT_JOBS))
    what, src, code = _COUNT_JOBS[name]
    out = rng.choice(["results/metrics.json", f"results/{name}.json"])
    prompt = f'Write {name}.py that {what} and save the count to {out} as {{"count": N}}.'
    number = rng.randint(10, 90)
    count = sum(all(p % d for d in range(2, p)) for p in range(2, number)) if name == "primes" else 1
    return {
        "prompt": prompt,
        "deliverables": [f"{name}.py", out],
        "files": {f"data/{src}": f"{number}\n"},
        "script": code,
        "result": json.dumps({"count": count}),
    }


def _sequence(name: str, k: int) -> list[int]:
    """The true first k numbers of a sequence task (the worker's result file is correct)."""
    fib = [0, 1]
    while len(fib) < k:
        fib.append(fib[-1] + fib[-2])
    return {
        "fib": fib[:k],
        "squares": [i * i for i in range(k)],
        "evens": [2 * i for i in range(k)],
        "cubes": [i**3 for i in range(k)],
        "odds": [2 * i + 1 for i in range(k)],
        "powers": [2**i for i in range(k)],
    }[name]


def _list_result(name: str, nums: list[str]) -> str:
    """The true output of a list task, one value per line."""
    out = {
        "sort": sorted(nums, key=int),
        "reverse": nums[::-1],
        "dedupe": sorted(set(nums), key=int),
        "total": [str(sum(int(x) for x in nums))],
    }[name]
    return "\n".join(out) + "\n"
