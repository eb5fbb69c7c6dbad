"""Limits on what scaffold takes in and on the work it does with it.

Text is bounded before anything parses it: a spec file (:data:`MAX_SPEC_LENGTH`), and each expression (the
forward, in one line or in steps, and each custom gradient: :data:`MAX_LENGTH`), whether it comes from a
spec file or from flags. Parsed expressions are bounded in nesting (:data:`MAX_DEPTH`, also once a forward's
steps are substituted): Python's parser, sympy and the printers recurse over the tree, and a deeper one would
end in a RecursionError. :mod:`.expression` bounds the rest (node count, size of numeric powers).

An expression within those bounds can still make sympy work for minutes. A signal alarm cannot stop it
reliably: sympy may be inside C code (gmpy, Python's own big integers) that holds the interpreter until it
returns. A worker process can always be killed, so the derivation runs in one and is stopped when its
time is up. The worker is forked where the platform allows it (sympy and scaffold are then already
imported: starting it costs milliseconds), spawned elsewhere.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TypeVar

from .errors import DerivationError, ScaffoldError

T = TypeVar("T")

#: Characters of one expression: a forward (all its steps) or a custom gradient.
MAX_LENGTH = 5000
#: Characters of a spec file.
MAX_SPEC_LENGTH = 100_000
#: Levels of nesting of an expression (a sum or a product of many terms is one level).
MAX_DEPTH = 60
#: Seconds the derivation of one op may take before it is stopped.
TIME_LIMIT = 30.0


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _work(connection: Connection, function: Callable[..., T], args: tuple) -> None:
    try:
        result = ("ok", function(*args))
    except ScaffoldError as exc:
        result = ("error", exc)
    except BaseException as exc:  # a bug in scaffold: re-raised in the caller with its message
        result = ("crash", f"{type(exc).__name__}: {exc}")
    try:
        connection.send(result)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        connection.send(("crash", f"the result could not be sent back: {exc}"))
    finally:
        connection.close()


def run_with_time_limit(function: Callable[..., T], args: tuple, *, seconds: float, where: str, what: str) -> T:
    """``function(*args)`` in a worker process, stopped after ``seconds`` with a clear error.

    A :class:`ScaffoldError` raised in the worker is raised here unchanged.
    """
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    worker = context.Process(target=_work, args=(sender, function, args), daemon=True)
    worker.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise DerivationError(
                f"{what} took longer than {seconds:g} second{'' if seconds == 1 else 's'} and was stopped",
                where=where,
                hint="simplify the expression (fewer nested functions or powers), or split the op into several",
            )
        try:
            status, value = receiver.recv()
        except EOFError:  # the worker died without answering (killed, out of memory)
            raise DerivationError(
                f"{what} stopped unexpectedly (exit code {worker.exitcode})",
                where=where,
                hint="the expression may be too large for the memory available; simplify it",
            ) from None
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join()
        receiver.close()
    if status == "error":
        raise value
    if status == "crash":
        raise RuntimeError(f"scaffold failed while {what}: {value}; please report this")
    return value
