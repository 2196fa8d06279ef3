"""The one door every MLflow write of the sweep driver goes through.

Why a queue: a tracking server that restarts for a minute is ordinary on a shared cluster,
and a sweep of hours must not die of it, nor make its trials wait. Writes are put here and
return at once; one writer thread sends them in order, retrying with backoff while the store
is away. Trials keep training meanwhile.

Why a journal: every write is appended to a file next to the sweep state before it is sent
(and acknowledged there once it is), so a driver killed in the middle of an outage loses
nothing: `mtbert sweep resume` reads the journal back and sends what was never acknowledged,
in order, before anything else. The file is emptied each time the queue drains.

Why a limit: past `outage_s` of failed attempts (or `max_queued` waiting writes) the driver
stops the sweep cleanly instead of queueing forever (launch.py says how to resume).

Writes are plain JSON ops ({"do": ..., "ref": trial key or "parent", ...}), applied by the
owner's `apply(op, replay)`; runs are named by trial key, not run id, so a trial that starts
during an outage gets its run created, and then its figures, once the store is back.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

# Errors that are the store saying no to this write, not the store being away: retrying
# cannot help, so the write is dropped with one warning line.
PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
                   "INVALID_STATE", "BAD_REQUEST", "PERMISSION_DENIED", "UNAUTHENTICATED"}
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0


def is_permanent(exc: BaseException) -> bool:
    code = getattr(exc, "error_code", None)
    return isinstance(code, str) and code in PERMANENT_CODES


def reason(exc: BaseException) -> str:
    text = str(exc)
    for needle, said in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                         ("Name or service not known", "unknown host"), ("database is locked", "database is locked"),
                         ("Max retries exceeded", "connection failed"), ("Connection aborted", "connection aborted")):
        if needle in text:
            return said
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:200]


class Outbox:
    """Ordered, journaled, retried writes. `apply(op, replay)` performs one op and raises
    on failure; `replay` is true for ops read back from a journal (or retried), whose earlier
    attempt may have reached the store: apply must then be idempotent (find before create)."""

    def __init__(self, apply: Callable[[dict, bool], None], journal: Path | None = None,
                 outage_s: float = 180.0, max_queued: int = 100_000,
                 warn: Callable[[str], None] = print):
        self._apply = apply
        self.journal = Path(journal) if journal else None
        self.outage_s = outage_s
        self.max_queued = max_queued
        self._warn = warn
        self._queue: deque[dict] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._seq = 0
        self._file = None
        self.outage_since: float | None = None
        # The journal's folder refused a write (a full disk): the queue goes on in memory, and
        # the driver stops the sweep (callbacks.py), as a resume needs that folder anyway.
        self.journal_error: OSError | None = None
        self.last_error = ""
        self.sent = 0
        self.dropped = 0
        self.busy_s = 0.0  # writer time in the store's calls
        # Of which the writer thread's own CPU: the rest is waiting, on the store (a server's
        # round trips, sqlite's fsync) or on the GIL while the driver's other threads run.
        self.busy_cpu_s = 0.0
        if self.journal is not None:
            self._load()

    # ------------------------------------------------------------------ journal

    def _load(self) -> None:
        if not self.journal.is_file():
            return
        ops: dict[int, dict] = {}
        for line in self.journal.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line a kill cut short: it was never acknowledged nor complete
            if "ack" in entry:
                ops.pop(entry["ack"], None)
            elif "op" in entry:
                ops[entry["seq"]] = dict(entry["op"], replay=True)
        for seq in sorted(ops):
            self._queue.append(dict(ops[seq], seq=seq))
        self._seq = max(ops, default=0)
        self._rewrite()

    def _rewrite(self) -> None:
        """The journal as the queue stands (on load and whenever it drains)."""
        tmp = self.journal.with_suffix(".tmp")
        try:
            if self._file is not None:
                file, self._file = self._file, None
                file.close()
            tmp.write_text("".join(json.dumps({"seq": op["seq"], "op": _bare(op)}) + "\n" for op in self._queue))
            os.replace(tmp, self.journal)
            self._file = self.journal.open("a")
        except OSError as exc:
            self.journal_error = exc

    def _append(self, entry: dict) -> None:
        if self._file is not None:
            try:
                self._file.write(json.dumps(entry, default=str) + "\n")
                self._file.flush()  # in the OS: it survives this process being killed
            except OSError as exc:
                self.journal_error = exc

    # ------------------------------------------------------------------ API

    @property
    def pending(self) -> int:
        return len(self._queue)

    def put(self, op: dict[str, Any]) -> None:
        with self._cond:
            self._seq += 1
            op = dict(op, seq=self._seq)
            self._append({"seq": self._seq, "op": _bare(op)})
            self._queue.append(op)
            self._cond.notify_all()
        self._start()

    def outage(self) -> float:
        """Seconds the store has been failing (0 when it answers)."""
        since = self.outage_since
        return time.monotonic() - since if since is not None else 0.0

    def given_up(self) -> bool:
        return self.outage() > self.outage_s or len(self._queue) > self.max_queued

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write is sent; False when the store stayed away past the limit
        (or `timeout`)."""
        self._start()
        deadline = time.monotonic() + timeout if timeout is not None else None
        with self._cond:
            while self._queue:
                if self.given_up() or (deadline is not None and time.monotonic() >= deadline):
                    return False
                self._cond.wait(0.2)
        return True

    def close(self, timeout: float = 5.0) -> bool:
        drained = self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as exc:
                self.journal_error = exc
        return drained

    # ------------------------------------------------------------------ the writer

    def _start(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                if self._closing or not self._queue:
                    return
                self._thread = threading.Thread(target=self._run, name="mtbert-mlflow-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                op = self._queue[0]
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                self._apply(op, bool(op.get("replay")))
            except Exception as exc:  # noqa: BLE001 - sorted below: store away vs store says no
                self._busy(t0, c0)
                if is_permanent(exc):
                    self.dropped += 1
                    self._warn(f"warning: MLflow refused a {op.get('do')} write for {op.get('ref')}: {reason(exc)}")
                    self._done(op)
                    continue
                with self._cond:
                    if self.outage_since is None:
                        self.outage_since = time.monotonic()
                    self.last_error = reason(exc)
                    op["replay"] = True  # it may have landed before the answer was lost
                    if self._closing:
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self._busy(t0, c0)
            backoff = FIRST_BACKOFF_S
            self.sent += 1
            self._done(op)

    def _busy(self, t0: float, c0: float) -> None:
        self.busy_s += time.perf_counter() - t0
        self.busy_cpu_s += time.thread_time() - c0

    def _done(self, op: dict) -> None:
        with self._cond:
            self._queue.popleft()
            self.outage_since = None
            if self._queue:
                self._append({"ack": op["seq"]})
            elif self.journal is not None:
                self._rewrite()  # drained: the journal starts empty again
            self._cond.notify_all()


def _bare(op: dict) -> dict:
    return {k: v for k, v in op.items() if k not in ("seq", "replay")}
