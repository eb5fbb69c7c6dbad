"""A hard time limit on the symbolic work, by running it in a worker process.

The parser bounds the input (length, depth, node count, size of numeric powers), but an expression
within those bounds can still make sympy work for minutes. A signal alarm cannot stop it reliably:
sympy may be inside C code (gmpy, Python's own big integers) that holds the interpreter until it
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
