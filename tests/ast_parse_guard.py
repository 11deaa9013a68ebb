"""``ast.parse`` with garbage collection held off, for test runs on CPython 3.11 before 3.11.8.

Those releases keep the AST constructor's recursion depth in state the whole interpreter shares
(CPython gh-106905, fixed in 3.11.8; this machine and CI run 3.11.7). Building the tree runs no
Python code, so the parsing thread keeps the GIL, except when an allocation starts a collection:
its finalizers and gc callbacks are Python code, and there another thread may run. If that thread
parses too (pytest rewriting a module it imports, hypothesis describing a lambda, a traceback
formatting its caret line), it resets the shared depth and the first parse raises
``SystemError: AST constructor recursion depth mismatch`` for a tree it built correctly. CI
failed three times on it, in the fuzz run of tests/ray/test_http_guards.py, with no defect in wattwise.

With collection held off and parses taken one at a time, no Python code runs inside a parse.
Nothing is caught or retried: every error is raised as the interpreter raises it.
"""

from __future__ import annotations

import ast
import gc
import sys
import threading
from typing import Any

FIXED_IN = (3, 11, 8)
_lock = threading.RLock()
_unguarded = ast.parse


def _parse_without_collection(*args: Any, **kwargs: Any) -> Any:
    with _lock:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return _unguarded(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()


def install() -> bool:
    """Guard ``ast.parse`` where the interpreter has the race; True when it did."""
    if sys.version_info[:2] != (3, 11) or sys.version_info[:3] >= FIXED_IN:
        return False
    ast.parse = _parse_without_collection
    return True
