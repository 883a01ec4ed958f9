"""``gmts serve`` listens at once and imports the app behind it in a thread.

Importing the app means importing the request models (``sweeps.spec`` → ``orchestrator.config`` →
the worker configs, torch among them) and MLflow: ≈ 14 s of CPU, up to a minute on two loaded cores, during
which a restarted service would look dead to a health check. ``/healthz`` only says that
the process is up, so this wrapper answers it from the first moment; every other request waits for
the app (then goes to it as if nothing happened) and gets 503 naming the error if loading failed,
which also ends the process. The reconciler starts once the app is loaded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

ASGIApp = Callable[..., Any]


class DeferredApp:
    """An ASGI app whose real app is built by ``load()`` → (app, shutdown) in a thread at start-up."""

    def __init__(self, load: Callable[[], tuple[ASGIApp, Callable[[], None]]],
                 on_failure: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGTERM)) -> None:
        self._load = load
        self._on_failure = on_failure  # default: SIGTERM to this process, on which uvicorn shuts down
        self._loaded = threading.Event()
        self._app: ASGIApp | None = None
        self._shutdown: Callable[[], None] | None = None
        self._error = ""

    def _build(self) -> None:
        try:
            self._app, self._shutdown = self._load()
            logger.info("the API is loaded")
        except BaseException as exc:  # noqa: BLE001 - whatever it is, the service cannot run
            logger.exception("the API failed to load")
            self._error = f"{type(exc).__name__}: {exc}"
            self._on_failure()
        finally:
            self._loaded.set()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http" and scope["path"] == "/healthz" and not self._loaded.is_set():
            await _json(send, 200, {"status": "ok"})
            return
        while not self._loaded.is_set():
            await asyncio.sleep(0.05)
        if self._app is None:
            message = f"the API failed to start: {self._error}"
            await _json(send, 503, {"message": message, "detail": message})
            return
        await self._app(scope, receive, send)

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                threading.Thread(target=self._build, name="gmts-load", daemon=True).start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._shutdown is not None:
                    await asyncio.to_thread(self._shutdown)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _json(send: Callable, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
