"""Whether a process is still there, and when it started: Linux's ``/proc/<pid>/stat``, read once.

Serves :mod:`helpers.launcher.pool` (the kernel side: a launcher folder whose kernel is gone is removed, a
killed worker counts as ended while it is still an unreaped zombie) and :mod:`helpers.launcher.worker` (the
rank side: a worker ends itself when its kernel has ended). Plain Python, no torch. Without
``/proc`` (not Linux) signal 0 is all either can ask, and only a reaped process counts as ended.
"""
from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state first, the start time
    20th), None when there is no such process; OSError when there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()  # the name in parentheses may hold anything
    except FileNotFoundError:
        return None


def _is_zombie(fields: list[bytes]) -> bool:
    return fields[0] in (b"Z", b"X")


def process_ended(pid: int) -> bool:
    """True when process ``pid`` has ended, also while it is an unreaped zombie."""
    try:
        fields = _stat_fields(pid)
    except OSError:  # no /proc (not Linux): signal 0 at least sees a reaped process
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        return False
    return fields is None or _is_zombie(fields)


def start_ticks(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), None when it is gone or a zombie;
    ``"0"`` for a live process when there is no ``/proc`` to say when."""
    try:
        fields = _stat_fields(pid)
    except OSError:  # no /proc: a live pid is all we can tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return "0"
    return None if fields is None or _is_zombie(fields) else fields[19].decode()
