"""Every statement the package sends is composed with `psycopg.sql`, never formatted as text: an
audit of every `execute(`/`executemany(` call in activities/, read from the source (no server).

A statement may be a function's result (`local_timeouts()`, `sql.SQL(...).format(...)`), a module
constant, a string literal (psycopg's `LiteralString`: nothing in it came from outside), a
parameter annotated as `sql` composable, or a local bound to one of those (by `=`, unpacking, `+=`,
`:=`, `for` or `with ... as`: every binding is judged); never an f-string, a `%`-formatted or
`.format`ted string, text added to a string, or a name the audit cannot trace to its binding."""

from __future__ import annotations

import ast
import builtins
import itertools
from collections.abc import Callable, Iterator

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


def _pairs(target: ast.expr, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    """Each name `target` binds, with what it is bound to: a tuple or list target taken apart
    beside a value of as many parts, else each of its names bound to an element of the value
    (`_ElementOf`)."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, ast.Starred):
        yield from _pairs(target.value, _ElementOf(value))
    elif isinstance(target, ast.Tuple | ast.List):
        parts = value.elts if isinstance(value, ast.Tuple | ast.List) else None
        plain = not any(isinstance(t, ast.Starred) for t in target.elts)
        if parts is not None and plain and len(parts) == len(target.elts):
            for t, v in zip(target.elts, parts, strict=True):
                yield from _pairs(t, v)
        else:
            for t in target.elts:
                yield from _pairs(t, _ElementOf(value))


class _ElementOf(ast.expr):
    """A part of `value` that the source does not single out: an element of a tuple unpacked or
    of what a `for` walks. Composed only when the whole `value` is made of composed parts."""

    def __init__(self, value: ast.expr) -> None:
        super().__init__()
        self.value = value


def _bound(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """The names `node` itself binds, and to what."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _pairs(target, node.value)
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        yield from _pairs(node.target, node.value)
    elif isinstance(node, ast.AugAssign):
        # `q += x`: q is then its earlier value (its other bindings) with x added.
        yield from _pairs(node.target, ast.BinOp(ast.Constant(""), node.op, node.value))
    elif isinstance(node, ast.NamedExpr):
        yield from _pairs(node.target, node.value)
    elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        yield from _pairs(node.target, _ElementOf(node.iter))
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        yield from _pairs(node.optional_vars, node.context_expr)


def _walk_own(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope` itself, not those of functions or classes nested in it."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        yield child
        yield from _walk_own(child)


def _bindings(scope: ast.AST, name: str) -> list[ast.expr]:
    """The values `name` is assigned in `scope` itself (not in functions nested in it): by `=`
    (plain, annotated, augmented, unpacked), `:=`, `for` and `with ... as`."""
    return [value for node in _walk_own(scope) for bound, value in _bound(node) if bound == name]


def _imported(scope: ast.AST, name: str) -> bool:
    """Whether `scope` itself imports `name` (or binds it by `def`, `class` or `except`)."""
    for node in [scope, *_walk_own(scope)]:
        imports = node.names if isinstance(node, ast.Import | ast.ImportFrom) else []
        if any((a.asname or a.name.split(".")[0]) == name for a in imports):
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
        for child in ast.iter_child_nodes(node):
            defined = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            if isinstance(child, defined) and child.name == name:
                return True
    return False


def _parameter(scope: ast.AST, name: str) -> ast.arg | None:
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    args = scope.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return next((a for a in every if a is not None and a.arg == name), None)


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
    if isinstance(node, _ElementOf):
        return _element(node.value, scopes)
    if isinstance(node, ast.Name):
        return _named(node.id, scopes, _composed)
    return f"an expression ({type(node).__name__})"


def _element(value: ast.expr, scopes: list[ast.AST]) -> str:
    """Why an element of `value` (unpacked or walked by `for`) may be text."""
    if isinstance(value, ast.Tuple | ast.List | ast.Set):
        return next((why for v in value.elts if (why := _element_part(v, scopes))), "")
    if isinstance(value, ast.Name):
        return _named(value.id, scopes, _element)
    return _composed(value, scopes)


def _element_part(part: ast.expr, scopes: list[ast.AST]) -> str:
    if isinstance(part, ast.Starred):
        return _element(part.value, scopes)
    return _composed(part, scopes)


def _named(
    name: str, scopes: list[ast.AST], judge: Callable[[ast.expr, list[ast.AST]], str]
) -> str:
    """Why the value of `name` may be text, each value it is bound to judged by `judge`: in the
    innermost scope that binds it, every binding and the parameter (a name a scope binds is that
    scope's own); else imported, a builtin, or unresolved (text: the audit cannot read it)."""
    for scope in reversed(scopes):
        values = _bindings(scope, name)
        param = _parameter(scope, name)
        if values or param is not None:
            whys: Iterator[str] = (judge(v, scopes) for v in values)
            if param is not None:
                note = ast.unparse(param.annotation) if param.annotation else ""
                typed = "sql." in note or "Composed" in note
                whys = itertools.chain(whys, ["" if typed else f"parameter {name}"])
            return next((why for why in whys if why), "")
        if _imported(scope, name):
            return ""
    return "" if hasattr(builtins, name) else f"unresolved name {name}"


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
        # Bound otherwise than by a plain `=`.
        ("q, p = f'DELETE FROM {t}', {}\nconn.execute(q, p)", "an f-string"),
        ("q, p = 'SELECT 1', {}\nconn.execute(q, p)", ""),
        ("[q, *rest] = (sql.SQL('x'), f'DROP {t}')\nconn.execute(q)", "an f-string"),
        ("q = 'DELETE FROM t'\nq += f' WHERE id = {i}'\nconn.execute(q)", "an f-string"),
        ("q = 'DELETE FROM t'\nq %= t\nconn.execute(q)", "a %-formatted string"),
        ("def f(q: str):\n    q += ''\n    conn.execute(q)", "parameter q"),
        ("if (q := f'DELETE FROM {t}'):\n    conn.execute(q)", "an f-string"),
        ("for q in ('SELECT 1', f'DROP {t}'):\n    conn.execute(q)", "an f-string"),
        (
            "def f(t: str):\n    ALL = (sql.SQL('x'), 'DROP ' + t)\n"
            "    for q in ALL:\n        conn.execute(q)",
            "parameter t",
        ),
        ("for q in (sql.SQL('x'), local_timeouts()):\n    conn.execute(q)", ""),
        ("with open(f) as q:\n    conn.execute(q)", ""),
        ("with ctx() as (q, p):\n    conn.execute(str(q), p)", "str(...)"),
        ("async def f():\n    async for q in g():\n        conn.execute(q)", ""),
        ("def f(*qs: str):\n    conn.execute(qs[0])", "an expression (Subscript)"),
        ("conn.execute(q)", "unresolved name q"),
        ("from m import q\nconn.execute(q)", ""),
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
