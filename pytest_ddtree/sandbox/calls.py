"""Tests as calls and expected results: what enters the sandbox, and how the parent judges.

Why: a test written as asserts runs *inside* the sandbox next to the candidate, which can then
read the expected values, patch the runner or return an object whose ``__eq__`` is always
true.  Here a test is a list of steps; only the calls (a function or method name and plain-data
arguments) enter the sandbox, the expectations stay in the parent, and each step's outcome
comes back as data (:mod:`pytest_ddtree.sandbox.values`), as EvalPlus does.

One step per line (the ``tests`` of a problem file), parsed with :mod:`ast`:

``f(1, "a") == EXPR``
    call the solution's ``f``; its result must equal ``EXPR`` by type and value.
``f(-1) raises ValueError``
    the call must raise that exception (or a subclass).
``f(x)``
    the call must not raise; its result is not checked.
``c = LRUCache(2)`` / ``c.get(1) == "a"`` / ``len(c) == 2``
    a call sequence: the object stays in the sandbox under that name, later steps call its
    methods or apply a builtin to it.
``data = EXPR``
    an input value, computed in the parent (``EXPR`` calls nothing of the solution) and sent
    as data; later steps pass it by name (``f(data)``) and expectations may use it.
``[f(k) for k in range(A, B)] == EXPR``
    many calls in one step (the results as a list).
``topo_sort(g) satisfies PREDICATE``
    where several answers are right: ``PREDICATE`` is evaluated in the parent on the result
    as data (``result``) and the inputs, e.g. ``sorted(result) == sorted(set(result))``.

``assert`` in front of a line and ``, "message"`` after it are accepted (the message is
shown on failure).  Arguments, expectations and predicates are the problem author's trusted
Python, evaluated in the parent; only their values cross the wall.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.sandbox import predicate
from pytest_ddtree.sandbox.values import Opaque, decode, difference, encode, short

__all__ = ["Arg", "Call", "StepError", "TestPlan", "Judgement", "judge_outcome", "parse_tests"]

_RAISES = re.compile(r"^(?P<call>.+?)\s+raises\s+(?P<exc>[A-Za-z_][A-Za-z0-9_.]*)\s*$", re.DOTALL)
_SATISFIES = re.compile(r"\s+satisfies\s+")
_NOTHING = object()


class StepError(ValueError):
    """A test line that is not one of the step forms; the message says which line and why."""


@dataclass(frozen=True)
class Arg:
    """A call argument: a name bound earlier (``ref``) or a plain-data value."""

    ref: str | None = None
    value: Any = None


@dataclass(frozen=True)
class Call:
    """One step: the call that runs in the sandbox, and what the parent expects of it."""

    source: str
    fn: tuple[str, ...]  # ("call", name) | ("method", obj, attr) | ("builtin", name)
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    bind: str | None = None
    loop: tuple[str, int, int, int] | None = None  # [call for var in range(a, b, s)]
    expect: Any = _NOTHING
    raises: str | None = None
    satisfies: str | None = None
    message: str = ""
    tolerance: float = 1e-6

    @property
    def has_expect(self) -> bool:
        return self.expect is not _NOTHING

    def to_job(self) -> dict[str, Any]:
        def arg(a: Arg) -> dict[str, Any]:
            return {"ref": a.ref} if a.ref is not None else {"v": encode(a.value)}

        return {
            "fn": list(self.fn),
            "args": [arg(a) for a in self.args],
            "kwargs": {k: arg(a) for k, a in self.kwargs},
            "bind": self.bind,
            "loop": list(self.loop) if self.loop else None,
        }


@dataclass(frozen=True)
class TestPlan:
    """A problem's tests: input values (sent as data) and the steps, in order."""

    calls: tuple[Call, ...]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    entry_point: str | None = None

    def to_job(self) -> dict[str, Any]:
        return {
            "entry_point": self.entry_point,
            "inputs": {name: encode(value) for name, value in self.inputs.items()},
            "steps": [c.to_job() for c in self.calls],
        }


# --------------------------------------------------------------------------- parsing


def _eval(node: ast.expr, env: Mapping[str, Any], line: str) -> Any:
    try:
        code = compile(ast.Expression(node), "<test>", "eval")
        return eval(code, {"__builtins__": builtins, **env})  # noqa: S307 - the problem author's trusted expression
    except Exception as exc:  # noqa: BLE001
        raise StepError(f"{line!r}: cannot evaluate {ast.unparse(node)!r} in the harness: {type(exc).__name__}: {exc}") from None


def _is_builtin(name: str, bound: set[str]) -> bool:
    return name not in bound and hasattr(builtins, name)


def _sandbox_call(node: ast.expr, bound: set[str]) -> bool:
    """Does this expression call into the solution (else it is data the parent computes)?"""
    if isinstance(node, ast.ListComp):
        return _sandbox_call(node.elt, bound)
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return isinstance(func.value, ast.Name) and func.value.id in bound
    if isinstance(func, ast.Name):
        if not _is_builtin(func.id, bound):
            return True
        return any(isinstance(a, ast.Name) and a.id in bound for a in node.args)
    return False


def _parse_call(node: ast.expr, bound: set[str], inputs: Mapping[str, Any], line: str, loop_var: str | None = None) -> tuple[tuple[str, ...], tuple[Arg, ...], tuple[tuple[str, Arg], ...]]:
    if not isinstance(node, ast.Call):
        raise StepError(f"{line!r}: expected a call such as f(1) or obj.method(2), got {ast.unparse(node)!r}")
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in bound:
        fn: tuple[str, ...] = ("method", func.value.id, func.attr)
    elif isinstance(func, ast.Name) and _is_builtin(func.id, bound):
        fn = ("builtin", func.id)
    elif isinstance(func, ast.Name):
        fn = ("call", func.id)
    else:
        raise StepError(f"{line!r}: call a function of the solution or a method of a name bound earlier, not {ast.unparse(func)!r}")

    def arg(a: ast.expr) -> Arg:
        if isinstance(a, ast.Name) and (a.id in bound or a.id == loop_var):
            return Arg(ref=a.id)
        if isinstance(a, ast.Starred):
            raise StepError(f"{line!r}: *args are not supported; write the arguments out")
        return Arg(value=_eval(a, inputs, line))

    kwargs = []
    for kw in node.keywords:
        if kw.arg is None:
            raise StepError(f"{line!r}: **kwargs are not supported; write the arguments out")
        kwargs.append((kw.arg, arg(kw.value)))
    return fn, tuple(arg(a) for a in node.args), tuple(kwargs)


def _range_of(node: ast.expr, inputs: Mapping[str, Any], line: str) -> tuple[int, int, int]:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"):
        raise StepError(f"{line!r}: a list comprehension step must loop over range(...)")
    values = [_eval(a, inputs, line) for a in node.args]
    r = range(*values)
    return r.start, r.stop, r.step


def parse_tests(text: str, entry_point: str | None = None) -> TestPlan:
    """Parse the step lines of a problem's ``tests`` (see the module docstring)."""
    calls: list[Call] = []
    inputs: dict[str, Any] = {}
    bound: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        calls_or_none = _parse_line(line, bound, inputs)
        if calls_or_none is not None:
            calls.append(calls_or_none)
    if not calls:
        raise StepError("no test steps: write one call per line, e.g. f(1) == 2")
    return TestPlan(tuple(calls), inputs, entry_point)


def _parses(text: str) -> bool:
    try:
        ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return True


def _parse_line(line: str, bound: set[str], inputs: dict[str, Any]) -> Call | None:
    body, message = line, ""
    if line.startswith("assert "):
        body = line[len("assert "):].strip()
        try:
            node = ast.parse(line).body[0]
        except SyntaxError:  # e.g. "assert f(1) raises ValueError"
            node = None
        if isinstance(node, ast.Assert):
            body = ast.get_source_segment(line, node.test) or body
            message = str(_eval(node.msg, inputs, line)) if node.msg is not None else ""
    raises = satisfies = None
    m = _RAISES.match(body)
    if m and _parses(m.group("call")):
        body, raises = m.group("call"), m.group("exc").rsplit(".", 1)[-1]
    else:
        for sep in _SATISFIES.finditer(body):  # the first " satisfies " outside a string argument
            if _parses(body[: sep.start()]):
                body, satisfies = body[: sep.start()], body[sep.end():]
                break
    try:
        tree = ast.parse(body, mode="exec")
    except SyntaxError as exc:
        raise StepError(f"{line!r}: not valid Python: {exc.msg}") from None
    if len(tree.body) != 1:
        raise StepError(f"{line!r}: one step per line")
    stmt = tree.body[0]
    if satisfies is not None:
        try:
            compile(satisfies, "<predicate>", "eval")
        except SyntaxError as exc:
            raise StepError(f"{line!r}: the predicate is not a Python expression: {exc.msg}") from None
    if isinstance(stmt, ast.Assign):
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name) or raises or satisfies:
            raise StepError(f"{line!r}: bind one name: name = call(...) or name = value")
        name = stmt.targets[0].id
        if _sandbox_call(stmt.value, bound):
            fn, args, kwargs = _parse_call(stmt.value, bound, inputs, line)
            bound.add(name)
            return Call(line, fn, args, kwargs, bind=name)
        inputs[name] = _eval(stmt.value, inputs, line)
        bound.add(name)
        return None
    if isinstance(stmt, ast.Assert):
        raise StepError(f"{line!r}: one assert per line, without a nested assert")
    if not isinstance(stmt, ast.Expr):
        raise StepError(f"{line!r}: a step is a call, a comparison with ==, or name = ...")
    expr = stmt.value
    expect: Any = _NOTHING
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq):
        if raises or satisfies:
            raise StepError(f"{line!r}: use == or raises or satisfies, not two of them")
        expect = _eval(expr.comparators[0], inputs, line)
        expr = expr.left
    loop = None
    loop_var = None
    if isinstance(expr, ast.ListComp):
        gen = expr.generators
        if len(gen) != 1 or gen[0].ifs or not isinstance(gen[0].target, ast.Name):
            raise StepError(f"{line!r}: a list comprehension step is [call for name in range(...)]")
        loop_var = gen[0].target.id
        loop = (loop_var, *_range_of(gen[0].iter, inputs, line))
        expr = expr.elt
    fn, args, kwargs = _parse_call(expr, bound, inputs, line, loop_var)
    return Call(line, fn, args, kwargs, loop=loop, expect=expect, raises=raises, satisfies=satisfies, message=message)


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class Judgement:
    """The parent's decision on one run's outcome: ``passed``, ``failed`` or ``error``."""

    verdict: str
    message: str


def _describe_call(call: Call, index: int) -> str:
    return f"step {index + 1}: {call.source}"


def judge_outcome(plan: TestPlan, outcome: Mapping[str, Any], check_s: float = 10.0) -> Judgement:
    """Compare the sandbox's outcome (plain JSON from the run) with the plan's expectations.

    Decoding, comparing and printing are bounded here (:mod:`.values`); a ``satisfies``
    predicate, whose cost on a hostile result no bound covers, runs in a worker process
    that is killed after ``check_s`` seconds (:mod:`.predicate`).

    Anything malformed (a result the candidate forged or cut short) is an ``error``; a value
    that differs, a missing or wrong exception is ``failed``; an unexpected exception is an
    ``error`` with its traceback tail.
    """
    if not isinstance(outcome, Mapping):
        return Judgement("error", "the run's result is not a JSON object")
    load_error = outcome.get("load_error")
    if load_error is not None:
        return Judgement("error", load_error[-2000:] if isinstance(load_error, str) else "the run's load error report is malformed")
    steps = outcome.get("steps")
    if not isinstance(steps, list):
        return Judgement("error", "the run's result has no step outcomes")
    for index, call in enumerate(plan.calls):
        where = _describe_call(call, index)
        if index >= len(steps) or not isinstance(steps[index], Mapping):
            return Judgement("error", f"{where}: the run reported no outcome for this step")
        step = steps[index]
        raised = step.get("raised")
        if raised is not None:
            if not isinstance(raised, Mapping):
                return Judgement("error", f"{where}: malformed exception report")
            names = [n for n in raised.get("mro", []) if isinstance(n, str)] if isinstance(raised.get("mro"), list) else []
            exc_name = _text(raised.get("type", "?"), 200)
            if call.raises is not None and call.raises in names:
                continue
            if exc_name == "SystemExit":
                return Judgement("error", f"{where}: the solution called exit()")
            exc_message = _text(raised.get("message", ""), 300)
            detail = _text(raised.get("trace", ""), 2000, tail=True) or f"{exc_name}: {exc_message}"
            if call.raises is not None:
                return Judgement("failed", f"{where}: expected {call.raises}, got {exc_name}: {exc_message}")
            return Judgement("error", f"{where}: raised {exc_name}\n{detail}")
        if call.raises is not None:
            return Judgement("failed", f"{where}: expected {call.raises} to be raised, but the call returned")
        if not call.has_expect and call.satisfies is None:
            continue
        try:
            actual = decode(step.get("v"))
        except ValueError as exc:
            return Judgement("error", f"{where}: the run's result is not valid data ({exc})")
        if call.has_expect:
            diff = difference(call.expect, actual, call.tolerance)
            if diff is not None:
                note = f" ({call.message})" if call.message else ""
                return Judgement("failed", f"{where}{note}\n{diff}\nexpected: {short(call.expect)}\ngot:      {short(actual)}")
        if call.satisfies is not None:
            try:
                why = _check_predicate(call, plan.inputs, actual, step.get("v"), check_s)
            except predicate.PredicateError as exc:
                return Judgement("error", f"{where}\n{exc}")
            if why is not None:
                return Judgement("failed", f"{where}\n{why}\ngot: {short(actual)}")
    return Judgement("passed", "")


def _text(value: Any, width: int, tail: bool = False) -> str:
    """A string field of the run's report, cut to ``width``; anything else is shown bounded."""
    if not isinstance(value, str):
        return short(value, width)
    if len(value) <= width:
        return value
    return "..." + value[-width:] if tail else value[:width] + "..."


def _check_predicate(call: Call, inputs: Mapping[str, Any], actual: Any, nodes: Any, check_s: float) -> str | None:
    if isinstance(actual, Opaque):
        return f"the result is {actual!r}, not plain data"
    env: dict[str, Any] = dict(inputs)
    for arg_index, a in enumerate(call.args):
        env[f"arg{arg_index}"] = inputs.get(a.ref) if a.ref is not None else a.value
    return predicate.evaluate(call.satisfies or "True", env, nodes, check_s)
