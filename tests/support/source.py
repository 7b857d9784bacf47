"""Python source read into a syntax tree, safely inside a test process."""

from __future__ import annotations

import ast
import gc


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, with the garbage collector held off while it builds the tree. On Python 3.11
    a collection during that build can run a finalizer that logs a traceback, and formatting a
    traceback calls `ast.parse` again, inside the first: the first then fails with "SystemError:
    AST constructor recursion depth mismatch" (CPython gh-106905; seen in CI, from an object an
    earlier test left behind). Held off, the build runs no Python code."""
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        gc.enable()
