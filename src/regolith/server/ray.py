"""regolith replicas on Ray Serve: one endpoint in front of several servers, routed by prompt prefix.

The application has two deployments (docs/scaling.md):

- ``Replica``: each replica loads the model (the ``load`` callable given to :func:`application`) and serves
  the very application ``regolith serve`` runs (:func:`regolith.server.create_app`), called in process: the
  frontend's request goes through its routes, errors, streaming and metrics unchanged.
- ``Frontend``: the HTTP ingress. It reads a request's body, takes the text whose prefix a replica's caches
  hold (:func:`affinity_text`), and forwards the request to the replica chosen by
  :class:`PrefixAffinityRouter`: the one that served the longest prefix of that text before, unless it is
  busier than the least busy replica by more than a threshold (then the less busy of two random replicas).
  The reply streams back as the replica writes it. A replica that dies before its reply started is retried
  once on another; one that dies mid-stream ends the stream with an error event in the API's own schema.

A replica's prompt cache (``cache_dir``) is a directory of its own under the one given: the first
``replica-K`` whose lock it can take, so a replica that Serve restarts takes up the dead one's entries.

Needs ``pip install "regolith[ray]"``. ``regolith serve --ray`` builds and runs the application from the
command line; a Serve config file names the command line's builder (``import_path: regolith.cli:ray_app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .affinity import PrefixAffinityRouter, affinity_text
from .api_error import APIError
from .app import create_app, error_event, error_response
from .endpoint import ServerConfig

if TYPE_CHECKING:
    from ray.serve import Application

    from ..model import Model

__all__ = [
    "Forwarded",
    "application",
    "replica_cache_dir",
    "run",
]

log = logging.getLogger("regolith.server")

# The response header naming the replica that answered.
REPLICA_HEADER = "x-regolith-replica"
_DIED = (RayActorError, ActorDiedError, ActorUnavailableError)


@dataclass(frozen=True)
class Forwarded:
    """An HTTP request as the frontend forwards it: ``prompt`` is its :func:`affinity_text`."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    client: tuple[str, int] | None
    prompt: str | None


def replica_cache_dir(root: str) -> tuple[str, int]:
    """The first ``root/replica-K`` whose lock this process can take, and the locked file's descriptor (held
    for the process's life: the lock goes with it)."""
    os.makedirs(root, exist_ok=True)
    for k in range(4096):
        path = os.path.join(root, f"replica-{k}")
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return path, fd
    raise RuntimeError(f"every prompt cache directory under {root} is locked by a running replica")


class Replica:
    """One model behind the server's application, called in process by the frontend (a Serve deployment's
    class: :func:`application` makes it one)."""

    def __init__(
        self, load: Callable[[], tuple[Model, ServerConfig]], cache_dir: str | None, cache_gb: float
    ):
        self.model, self.config = load()
        self._cache_lock = None
        if cache_dir:
            from ..prompt_cache import PromptCache

            path, self._cache_lock = replica_cache_dir(cache_dir)
            self.model.prompt_cache = PromptCache(path, int(cache_gb * 2**30))
        self.app = create_app(self.model, self.config)
        # Called in process, the application has no lifespan: the replica starts and stops its engine.
        self.engine = self.app.state.server.engine
        self.engine.start()
        self.name = serve.get_replica_context().replica_id.to_full_id_str()

    def check_health(self) -> None:
        """Serve's health check: the generation workers are running."""
        if not self.engine.alive:
            raise RuntimeError("the generation workers have stopped")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()

    async def handle(self, request: Forwarded) -> AsyncIterator[Any]:
        """The application's answer to ``request``: first ``(status, headers)``, then the body's pieces as
        the application writes them. Closing the generator (the client went away) disconnects the request."""
        out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            await out.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                await out.put(None)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.path.encode(),
            "query_string": request.query,
            "root_path": "",
            "headers": request.headers,
            "client": request.client,
            "server": None,
        }
        task = asyncio.create_task(run())
        try:
            while (message := await out.get()) is not None:
                if message["type"] == "http.response.start":
                    headers = [
                        (k, v) for k, v in message.get("headers", []) if k.lower() != b"content-length"
                    ]
                    headers.append((REPLICA_HEADER.encode(), self.name.encode()))
                    yield message["status"], headers
                elif message["type"] == "http.response.body":
                    # every piece written meanwhile goes in one item: a stream's item is a round trip
                    body, more = [message.get("body", b"")], message.get("more_body", False)
                    while more and not out.empty():
                        nxt = out.get_nowait()
                        more = nxt is not None and nxt.get("more_body", False)
                        body.append(b"" if nxt is None else nxt.get("body", b""))
                    if any(body):
                        yield b"".join(body)
                    if not more:
                        break
        finally:
            gone.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), 10)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()


def _died(e: BaseException, what: str, kind: str) -> APIError:
    return APIError(503, f"the replica serving this {what} died: {type(e).__name__}", kind=kind)


class Frontend:
    """The HTTP ingress: each request forwarded to the replica its prompt's prefix chooses (a Serve
    deployment's class: :func:`application` makes it one)."""

    def __init__(self, replicas: Any, max_body: int):
        self.replicas = replicas.options(stream=True)
        self.max_body = max_body

    async def _forward(self, request: Forwarded) -> tuple[Any, int, list[tuple[bytes, bytes]]]:
        """The replica's response stream with its status and headers read; a replica that dies before it
        answers is retried once on another."""
        for attempt in (0, 1):
            stream = self.replicas.handle.remote(request)
            try:
                status, headers = await stream.__anext__()
                return stream, status, headers
            except _DIED:
                stream.cancel()
                if attempt:
                    raise
                log.warning(
                    "a replica died before answering %s %s; retried on another", request.method, request.path
                )
        raise AssertionError("unreachable")

    async def __call__(self, http: Request) -> Response:
        path = http.url.path
        body = b""
        async for chunk in http.stream():
            body += chunk
            if len(body) > self.max_body:
                e = APIError(413, f"the request body is over {self.max_body} bytes", kind="too_large")
                return error_response(e, path)
        request = Forwarded(
            method=http.method,
            path=path,
            query=http.url.query.encode(),
            headers=[(k.lower(), v) for k, v in http.headers.raw],
            body=body,
            client=(http.client.host, http.client.port) if http.client else None,
            prompt=affinity_text(path, body),
        )
        try:
            stream, status, headers = await self._forward(request)
        except _DIED as e:
            return error_response(_died(e, "request", "overloaded"), path)
        media = {k.lower(): v for k, v in headers}.get(b"content-type", b"").decode("latin-1")
        if not media.startswith("text/event-stream"):
            try:
                content = b"".join([piece async for piece in stream])
            except _DIED as e:
                return error_response(_died(e, "request", "server"), path)
            reply = Response(content, status_code=status)
            reply.raw_headers = [*headers, (b"content-length", str(len(content)).encode())]
            return reply

        async def events() -> AsyncIterator[bytes]:
            try:
                async for piece in stream:
                    yield piece
            except _DIED as e:
                yield error_event(_died(e, "stream", "server"), path).encode()
            finally:
                stream.cancel()

        reply = StreamingResponse(events(), status_code=status)
        reply.raw_headers = headers
        return reply


def application(
    load: Callable[[], tuple[Model, ServerConfig]],
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    replica_cpus: float = 1.0,
    replica_gpus: float = 0.0,
    replica_memory_gb: float | None = None,
    affinity: bool = True,
    cache_dir: str | None = None,
    cache_gb: float = 4.0,
    max_body: int = 16 * 1024 * 1024,
    max_ongoing: int = 64,
) -> Application:
    """The Serve application: ``replicas`` replicas (or between ``autoscale``'s bounds, by load), each
    calling ``load()`` for its model and server configuration, with ``replica_cpus`` / ``replica_gpus`` of
    Ray's resources each (``REGOLITH_THREADS`` is set to the CPUs; ``replica_memory_gb``, the replica's memory
    budget, is reserved as Ray's ``memory``, so a node gets no more replicas than fit), behind the frontend;
    requests routed by prefix unless ``affinity`` is False (then by load alone). ``cache_dir``: a prompt
    cache of ``cache_gb`` GiB per replica. ``max_ongoing``: requests Serve sends one replica at most (give its
    queue and its batch: the replica's own 503 then answers an overload, as one server's does)."""
    env = {"REGOLITH_THREADS": str(max(1, int(replica_cpus)))}
    options: dict[str, Any] = {
        "ray_actor_options": {
            "num_cpus": replica_cpus,
            "num_gpus": replica_gpus,
            "runtime_env": {"env_vars": env},
        },
        "max_ongoing_requests": max_ongoing,
        "health_check_period_s": 5,
    }
    if replica_memory_gb is not None:
        options["ray_actor_options"]["memory"] = int(replica_memory_gb * 2**30)
    if autoscale is not None:
        low, high = autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": 2,
        }
    else:
        options["num_replicas"] = replicas
    if affinity:
        options["request_router_config"] = RequestRouterConfig(request_router_class=PrefixAffinityRouter)
    replica = serve.deployment(Replica, name="Replica", **options)
    frontend = serve.deployment(
        Frontend,
        name="Frontend",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(1000, max_ongoing),
    )
    return frontend.bind(replica.bind(load, cache_dir, cache_gb), max_body)


def run(
    app: Application,
    *,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8080,
    name: str = "regolith",
) -> None:
    """Run ``app`` on the Ray cluster at ``address`` (None: a new one on this machine, even where another
    runs; "auto": the one this machine joined with ``ray start``), its HTTP endpoint on
    ``host``:``port``, until interrupted (Ctrl-C or SIGTERM): then the application is deleted, and a cluster
    this call started is stopped."""
    import ray

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    ray.init(address=address or "local", include_dashboard=False)
    previous = signal.signal(signal.SIGTERM, interrupt)  # after ray.init, whose own handler dies loudly
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=name, route_prefix="/")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(Exception):  # the cluster may be gone already
            serve.delete(name)
        ray.shutdown()
