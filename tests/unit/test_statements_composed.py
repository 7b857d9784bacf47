"""Every statement the package sends is composed with `psycopg.sql`, never formatted as text: an
audit of every `execute(`/`executemany(` call in activities/, read from the source (no server).

A statement may be a function's result (`local_timeouts()`, `sql.SQL(...).format(...)`), a module
constant, a string literal (psycopg's `LiteralString`: nothing in it came from outside), a
parameter annotated as `sql` composable, or a local bound to one of those; never an f-string, a
`%`-formatted or `.format`ted string, or text added to a string."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from tests.support.procs import REPO
from tests.support.source import parse

#: Calls that turn anything into plain text.
TEXT_CALLS = {"str", "repr", "format"}


def _calls(tree: ast.AST) -> Iterator[tuple[ast.Call, list[ast.AST]]]:
    """Every `.execute(`/`.executemany(` call, with the scopes around it (innermost last)."""

    def walk(node: ast.AST, scopes: list[ast.AST]) -> Iterator[tuple[ast.Call, list[ast.AST]]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scopes = [*scopes, node]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("execute", "executemany")
        ):
            yield node, scopes
        for child in ast.iter_child_nodes(node):
            yield from walk(child, scopes)

    yield from walk(tree, [tree])


def _bindings(scope: ast.AST, name: str) -> list[ast.expr]:
    """The values `name` is assigned in `scope` itself (not in functions nested in it)."""
    found: list[ast.expr] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            targets = child.targets if isinstance(child, ast.Assign) else []
            if isinstance(child, ast.AnnAssign) and child.value is not None:
                targets = [child.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                assert isinstance(child, ast.Assign | ast.AnnAssign)
                assert child.value is not None
                found.append(child.value)
            walk(child)

    walk(scope)
    return found


def _parameter(scope: ast.AST, name: str) -> ast.arg | None:
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    args = scope.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return next((a for a in every if a.arg == name), None)


def _composed(node: ast.AST, scopes: list[ast.AST]) -> str:
    """Why `node`, as a statement, may be text ('' when it is composed)."""
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    if isinstance(node, ast.Constant):
        return ""
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Mod):
            return "a %-formatted string"
        return _composed(node.left, scopes) or _composed(node.right, scopes)
    if isinstance(node, ast.IfExp):
        return _composed(node.body, scopes) or _composed(node.orelse, scopes)
    if isinstance(node, ast.Starred):
        return _composed(node.value, scopes)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in TEXT_CALLS:
            return f"{func.id}(...)"
        on_text = isinstance(func, ast.Attribute) and isinstance(
            func.value, ast.Constant | ast.JoinedStr
        )
        if on_text and isinstance(func, ast.Attribute) and func.attr in ("format", "join"):
            return f"a string's .{func.attr}(...)"
        return ""  # a function's result: the function composes it (and is audited itself)
    if isinstance(node, ast.Attribute):
        return ""  # a module's constant
    if isinstance(node, ast.Name):
        for scope in reversed(scopes):
            values = _bindings(scope, node.id)
            if values:
                return next((why for v in values if (why := _composed(v, scopes))), "")
            param = _parameter(scope, node.id)
            if param is not None:
                note = ast.unparse(param.annotation) if param.annotation else ""
                return "" if "sql." in note or "Composed" in note else f"parameter {node.id}"
        return ""  # imported
    return f"an expression ({type(node).__name__})"


def _statements() -> list[tuple[str, ast.Call, list[ast.AST]]]:
    found = []
    for path in sorted((REPO / "activities").rglob("*.py")):
        tree = parse(path.read_text(), str(path))
        found += [(f"{path.relative_to(REPO)}:{c.lineno}", c, s) for c, s in _calls(tree)]
    return found


def test_the_audit_finds_the_package_s_statements() -> None:
    assert len(_statements()) > 50


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("conn.execute(f'DELETE FROM {table}')", "an f-string"),
        ("conn.execute('DELETE FROM %s' % table)", "a %-formatted string"),
        ("conn.execute('DELETE FROM {}'.format(table))", "a string's .format(...)"),
        ("q = f'SELECT {x}'\nconn.execute(q)", "an f-string"),
        ("def f(q: str):\n    conn.execute(q)", "parameter q"),
        ("def f(t: str):\n    conn.execute('DROP TABLE ' + t)", "parameter t"),
        ("conn.execute('SELECT 1')", ""),
        ("conn.execute(sql.SQL('DELETE FROM {}').format(sql.Identifier(t)))", ""),
        ("def f(q: sql.Composed):\n    conn.execute(q, {})", ""),
    ],
)
def test_the_audit_tells_text_from_composed_sql(source: str, why: str) -> None:
    ((call, scopes),) = list(_calls(parse(source)))

    assert _composed(call.args[0], scopes) == why


def test_every_statement_in_activities_is_composed_sql() -> None:
    text = {
        where: why
        for where, call, scopes in _statements()
        if (why := _composed(call.args[0], scopes))
    }

    assert text == {}
