"""List-then-watch into a Store, in a thread: the informer pattern, on raw JSON.

The kubernetes client's own Watch turns every event into model objects, which costs more CPU than
the rest of the operator on a busy cluster; this reads the watch stream's JSON lines directly.
Lists are paged, and each page slimmed as it arrives, so a large cluster's raw list is never held.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.cache import Slim, Store, object_key
from phalanx.k8s import short_error

log = logging.getLogger("phalanx.reflector")

LIST_PAGE_SIZE = 500
WATCH_SECONDS = 290  # the server ends the watch; we list-free resume from the last revision
READ_TIMEOUT_SECONDS = 330
BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0)

# (resource_version, continue_token, watch, page size) -> the raw HTTP response
Request = Callable[..., Any]
Change = Callable[[str, "Slim | None", "Slim | None"], None]


class Expired(Exception):
    """The watch's revision has been compacted away (410 Gone): list again."""


@dataclass
class Reflector:
    name: str
    request: Request
    store: Store
    on_change: Change | None = None
    namespace: str | None = None  # the one namespace `request` lists; None: every namespace

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.name}", daemon=True)
        self._response: Any = None
        # Held while stop() shuts the watch's socket and while the watch lets its response go: a
        # connection back in the pool may already serve another request, whose socket is not ours.
        self._response_lock = threading.Lock()

    def start(self) -> Reflector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._interrupt_watch()

    def _interrupt_watch(self) -> None:
        """Ends the watch's blocking read from another thread. Closing the response here would wait
        for the lock the reading thread holds (a shutdown that hung until the watch timed out);
        shutting the socket down makes that read return at once, and the reader closes it."""
        with self._response_lock:
            sock = getattr(getattr(self._response, "connection", None), "sock", None)
            if sock is None:
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._list()
                failures = 0
                while not self._stop.is_set():
                    version = self._watch(version)
            except Expired:
                log.info("%s: watch expired, listing again", self.name)
            except Exception as exc:  # noqa: BLE001 - the API server may fail any way; keep trying
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                if not self._stop.is_set():
                    log.warning(
                        "%s: list/watch failed (%s), again in %.0fs", self.name, short_error(exc), delay
                    )
                    self._stop.wait(delay)

    def _list(self) -> str:
        # Each page is slimmed as it arrives: only one raw page is held at a time, never the list.
        fresh: dict[str, Slim] = {}
        token: str | None = None
        while True:
            response = self.request(limit=LIST_PAGE_SIZE, _continue=token, watch=False)
            page = json.loads(response.data)
            fresh.update(self.store.slimmed(page.get("items") or ()))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                version = str(page["metadata"]["resourceVersion"])
                break
            del page, response
        before = self.store.as_dict()
        self.store.replace_slimmed(fresh, int(version), self.namespace)
        if self.on_change is not None:
            after = self.store.as_dict()
            for key in before.keys() | after.keys():
                if before.get(key) != after.get(key):
                    self.on_change(key, before.get(key), after.get(key))
        return version

    def _watch(self, version: str) -> str:
        started = time.monotonic()
        response = self.request(
            resource_version=version,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(10, READ_TIMEOUT_SECONDS),
        )
        self._response = response
        if self._stop.is_set():  # stop() came while the request was on its way: it saw no response
            self._interrupt_watch()
        ended = False  # whether the server ended the stream: only then may the connection be reused
        try:
            for line in _lines(response):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    old = self.store.delete(obj)
                    if old is not None and self.on_change is not None:
                        self.on_change(object_key(obj), old, None)
                    continue
                changed = self.store.upsert(obj)
                if changed is not None and self.on_change is not None:
                    self.on_change(object_key(obj), *changed)
            ended = not self._stop.is_set()
        finally:
            with self._response_lock:
                self._response = None
            if ended:
                response.release_conn()
            else:  # left mid-stream (410, an error, a stop): pooled, its next request would read the rest
                response.close()
        if time.monotonic() - started < 1.0 and not self._stop.is_set():
            self._stop.wait(1.0)  # a server that ends watches at once must not be hammered
        return version


def per_namespace(
    kind: str,
    request: Callable[..., Any],
    store: Store,
    namespaces: Sequence[str],
    on_change: Change | None = None,
) -> list[Reflector]:
    """One reflector per watched namespace (or one for all when `namespaces` is empty), one store.

    `request(namespace, **params)` lists or watches one namespace (None: every namespace).
    """
    scopes: list[str | None] = [*namespaces] if namespaces else [None]
    store.expect_lists(scopes)
    return [
        Reflector(f"{kind}/{ns or '*'}", functools.partial(request, ns), store, on_change, namespace=ns)
        for ns in scopes
    ]


def _lines(response: Any) -> Iterator[bytes]:
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending
