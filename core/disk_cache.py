"""Results every process of a machine would otherwise compute at its start (a fitted model,
a trained predictor), kept once on that machine's disk."""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")

CACHE_DIR = Path(os.environ.get("WATTWISE_CACHE_DIR", Path.home() / ".cache" / "wattwise"))


def fingerprint(value: object, modules: Iterable[ModuleType] = (), files: Iterable[Path] = ()) -> str:
    """A digest of `value`'s repr, the source of `modules` and the bytes of `files`: what a
    cached result is a function of, so that changing any of them misses the cache."""
    digest = hashlib.sha256(repr(value).encode())
    for module in modules:
        digest.update(Path(module.__file__ or "").read_bytes())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_pickle(name: str, build: Callable[[], T]) -> T:
    """`build()`, or what it returned to a process of this machine before, read from
    CACHE_DIR/name. The name must carry everything the result is a function of (a
    `fingerprint`, library versions). A torn file, or one whose classes no longer load, is
    built again; the file is written whole or not at all (concurrent replicas race here),
    and an unwritable cache only costs the build."""
    path = CACHE_DIR / name
    try:
        cached: T = pickle.loads(path.read_bytes())
        return cached
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass
    built = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(built))
        tmp.replace(path)
    except OSError:
        pass
    return built
