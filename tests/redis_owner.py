"""Who sends a Redis command: storage/ owns every one of celery-dlq's (tests/unit/test_storage_owns_redis.py).

Two checks, one list of exceptions:

* :func:`static_calls`: calls, in celery_dlq/ outside storage/, of a
  redis-py command method (or a script's run) on an object whose name says
  it is a Redis client, pipeline, connection or script set (``client``,
  ``redis``, ``pipe``, ``r``, ``conn``, ``blocking``, ``broker``, ...), read
  from the syntax tree: ``dict.get`` on a ``row`` is not one.
* :func:`guard`: while it is on, redis-py's ``Redis.execute_command``,
  ``Pipeline.execute`` and ``Script.__call__`` note every call whose nearest
  frame outside redis-py and fakeredis is in celery_dlq/ but not in
  celery_dlq/storage/. The nearest such frame is the one that sent the
  command: kombu's or Celery's own I/O (a publish, a pipeline kombu executes
  after a storage method queued it) starts in their code and is theirs.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import redis
from redis.client import Pipeline
from redis.commands.core import Script

import celery_dlq

PACKAGE = Path(celery_dlq.__file__).resolve().parent
STORAGE = PACKAGE / "storage"

#: Modules allowed to send Redis commands outside storage/: none.
IN_FLIGHT_ELSEWHERE: frozenset[str] = frozenset()

#: Calls the receiver heuristic takes for Redis but are not: (module, line's receiver.method, why).
NOT_REDIS = {
    ("analytics/plan.py", "r.get"): "r is a row of a pyarrow table (a dict)",
    ("cli/audit.py", "r.get"): "r is an audit record (a dict) the operator API returned",
    ("worker/park/turns.py", "_blocking.set"): "_blocking is a threading.Event (the mover is blocked on Redis)",
}

#: redis-py's command methods (every public method its command mixins define), and what sends or reads.
COMMANDS = frozenset(
    name for name in dir(redis.Redis)
    if not name.startswith("_") and (getattr(getattr(redis.Redis, name), "__module__", "") or "").startswith(
        "redis.commands")
) | {"execute_command", "execute", "send_command", "parse_response", "get_message", "subscribe", "psubscribe"}
#: A script set's run (``Scripts.run``) and redis-py's registration of a script.
SCRIPT_CALLS = frozenset({"run", "register_script"})
#: Names of objects that are Redis clients, pipelines, connections, pub/subs or script sets.
RECEIVER = re.compile(r"(^|_)(client|redis|pipe|pipeline|r|conn|connection|blocking|broker|plain|tracker|pubsub"
                      r"|backend_client)$", re.IGNORECASE)
SCRIPTS = re.compile(r"(^|_)scripts?$", re.IGNORECASE)


def _name(node: ast.AST) -> str:
    """The last name of a call's receiver: ``self.redis.broker`` -> broker, ``c.pipeline(...)`` -> pipeline."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def calls_in(source: str) -> Iterator[tuple[int, str]]:
    """``(line, "receiver.method")`` of each Redis command or script call in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, _name(node.func.value)
        if (method in COMMANDS and RECEIVER.search(receiver)) or (method in SCRIPT_CALLS and SCRIPTS.search(receiver)):
            yield node.lineno, f"{receiver}.{method}"


def module_of(path: Path) -> str:
    return path.resolve().relative_to(PACKAGE).as_posix()


def static_calls() -> list[str]:
    """``module:line: receiver.method`` of each call outside storage/ that is not an exception."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORAGE in path.resolve().parents:
            continue
        module = module_of(path)
        if module in IN_FLIGHT_ELSEWHERE:
            continue
        for line, call in calls_in(path.read_text("utf-8")):
            if (module, call) not in NOT_REDIS:
                found.append(f"{module}:{line}: {call}")
    return found


#: redis-py's and fakeredis' own frames are skipped: the sender is the nearest frame outside them.
_LIBRARIES = tuple(str(Path(module.__file__).resolve().parent) + "/" for module in (redis, fakeredis))


@functools.lru_cache(maxsize=4096)
def _resolved(filename: str) -> str:
    return filename if filename.startswith("<") else str(Path(filename).resolve())


def sender(filenames: Iterator[str]) -> str | None:
    """The module of celery_dlq outside storage/ that sent a command, given the call's frames' files from the
    innermost out; None when storage/ (or a library, or a test) sent it."""
    for filename in filenames:
        path = _resolved(filename)
        if path.startswith(_LIBRARIES):
            continue
        if not path.startswith(str(PACKAGE) + "/"):
            return None
        module = module_of(Path(path))
        if module.startswith("storage/") or module in IN_FLIGHT_ELSEWHERE:
            return None
        return module
    return None


def _callers() -> list[str]:
    """The files of the frames that called the wrapped redis-py method, innermost first."""
    files, frame = [], sys._getframe(2)   # 0: here, 1: the wrapper
    while frame is not None:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    return files


@contextlib.contextmanager
def guard() -> Iterator[list[str]]:
    """Note (in the list it gives) each command sent from celery_dlq outside storage/ while it is on."""
    found: list[str] = []
    originals = [(redis.Redis, "execute_command"), (Pipeline, "execute"), (Script, "__call__")]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in originals]

    def wrap(function, what):
        def noted(*args, **kwargs):
            module = sender(iter(_callers()))
            if module is not None:
                command = args[1] if what == "execute_command" and len(args) > 1 else what
                found.append(f"{module}: {command!r}")
            return function(*args, **kwargs)
        return noted

    for owner, name, function in saved:
        setattr(owner, name, wrap(function, name))
    try:
        yield found
    finally:
        for owner, name, function in saved:
            setattr(owner, name, function)
