"""The test run's guard against CPython gh-106905 (tests/ast_parse_guard.py): two threads parse
while every collection hands the GIL over; unguarded, 3.11.7 raises its SystemError, guarded
it does not."""

from __future__ import annotations

import ast
import gc
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests import ast_parse_guard
from wattwise import local_serve

pytestmark = pytest.mark.skipif(ast.parse is not ast_parse_guard._parse_without_collection,
                                reason="this interpreter has no gh-106905 race to guard")


@pytest.fixture
def collections_hand_over_the_gil() -> Iterator[None]:
    def yield_gil(phase: str, info: dict[str, Any]) -> None:
        time.sleep(0)

    threshold, switch_interval_s = gc.get_threshold(), sys.getswitchinterval()
    gc.callbacks.append(yield_gil)
    gc.set_threshold(50, 1000, 1000)  # young collections only: often, and cheap
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        gc.callbacks.remove(yield_gil)
        gc.set_threshold(*threshold)
        sys.setswitchinterval(switch_interval_s)


def _race(parse: Callable[[str], Any], for_s: float) -> list[str]:
    """Two threads parse one module until either fails or `for_s` passes; the errors. They
    parse from different stack depths: the race shows when the shared depth is reset to
    another thread's."""
    source = inspect.getsource(local_serve)
    errors: list[str] = []
    deadline = time.monotonic() + for_s

    def parse_until_done(frames_deeper: int) -> None:
        if frames_deeper:
            return parse_until_done(frames_deeper - 1)
        while time.monotonic() < deadline and not errors:
            try:
                parse(source)
            except SystemError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=parse_until_done, args=(depth,)) for depth in (0, 40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.mark.usefixtures("collections_hand_over_the_gil")
def test_the_race_exists_unguarded_and_not_guarded() -> None:
    assert any("recursion depth mismatch" in e for e in _race(ast_parse_guard._unguarded, for_s=30))
    assert _race(ast.parse, for_s=1) == []
