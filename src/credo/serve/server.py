"""Running the server: :class:`PolicyServer` (start/stop) and :func:`serve_policy`.

The server runs uvicorn in a background thread on a socket bound before start (port 0:
an ephemeral port chosen by the OS, read back from the socket), so a training loop can
start it, point agents at ``base_url`` and stop it, every wait bounded:
``start_timeout_s`` for start-up, ``stop_timeout_s`` for a graceful stop, after which
uvicorn is forced to exit and the engine thread is given the same time again.

Binding: loopback (``127.0.0.1``, ``::1``, ``localhost``) by default; any other address
is refused unless an API key is set, and then every ``/v1`` request must carry it.
Without a key, only this machine's programs are answered, not web pages
(:mod:`credo.serve.app`: ``Host`` and ``Origin`` checks, JSON bodies only).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from credo.serve.engine import EngineConfig, GenerationEngine
from credo.serve.recorder import SessionRecorder

__all__ = ["PolicyServer", "check_bind", "is_loopback", "serve_policy"]

#: Seconds an idle keep-alive connection stays open. Clients reuse an idle connection
#: for up to their own expiry (httpx, under the openai client: 5 s); a server that
#: closed it at the same 5 s (uvicorn's default) would race their next request, which
#: then fails as "Connection error". Longer than any client default, so the client is
#: always the one to close.
KEEP_ALIVE_S = 75


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse a non-loopback ``host`` without an API key (``ValueError``, one line)."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"refusing to serve on {host!r} without an API key: bind 127.0.0.1 (the default) "
            "or set an API key (api_key=..., or CREDO_API_KEY for `python -m credo.serve`)"
        )


class PolicyServer:
    """An OpenAI-compatible server for ``policy`` (see :mod:`credo.serve.app`).

    Args:
        policy: the :class:`~credo.policy.hf.HFPolicy` to serve (its current weights are
            used for every request: a trainer that updates them in place serves the new
            policy at once).
        host: address to bind (default ``127.0.0.1``).
        port: port (default 0: an ephemeral port).
        api_key: required on ``/v1`` routes when set; mandatory off loopback.
        recorder: where sessions are recorded (default: a new one).
        engine: the engine's knobs (:class:`~credo.serve.engine.EngineConfig`).
        generator: the sampling RNG (default: CPU, seeded with ``seed``).
        seed: seed of the default generator (default 0).
        model_name: the id shown by ``/v1/models`` (default ``"credo"``).
        request_timeout_s: the longest a request waits for its generation (default 600).
        max_body_bytes: larger request bodies get a 413 (default 32 MiB).
        start_timeout_s: the longest :meth:`start` waits for the server (default 30).
        stop_timeout_s: the longest each stage of :meth:`stop` waits (default 10).
        record: record sessions (default true; ``python -m credo.serve``, whose
            recordings nothing reads, records none).
        allowed_hosts: more host names meaning this server, for the same-machine checks
            made without an API key (:func:`~credo.serve.app.create_app`).
    """

    def __init__(
        self,
        policy: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        recorder: SessionRecorder | None = None,
        engine: EngineConfig | None = None,
        generator: torch.Generator | None = None,
        seed: int = 0,
        model_name: str = "credo",
        request_timeout_s: float = 600.0,
        max_body_bytes: int = 32 * 2**20,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        record: bool = True,
        allowed_hosts: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        check_bind(host, api_key)
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0: any free port), got {port}")
        self.record = record
        self.allowed_hosts = frozenset(allowed_hosts) | {host}
        self.host, self.port, self.api_key = host, port, api_key
        self.recorder = recorder if recorder is not None else SessionRecorder()
        gen = generator if generator is not None else torch.Generator().manual_seed(seed)
        self.engine = GenerationEngine(policy, engine, gen)
        self.model_name = model_name
        self.request_timeout_s = request_timeout_s
        self.max_body_bytes = max_body_bytes
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (what ``openai.OpenAI(base_url=...)`` takes)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> PolicyServer:
        """Bind, start the engine and uvicorn; returns once the server accepts requests.

        Raises:
            RuntimeError: the server did not start within ``start_timeout_s``.
        """
        import uvicorn

        from credo.serve.app import create_app

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"cannot bind {self.host}:{self.port}: {exc}") from None
        sock.listen(128)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self.engine.start()
        app = create_app(
            self.engine,
            self.recorder if self.record else None,
            api_key=self.api_key,
            model_name=self.model_name,
            request_timeout_s=self.request_timeout_s,
            max_body_bytes=self.max_body_bytes,
            allowed_hosts=self.allowed_hosts,
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=max(1, int(self.stop_timeout_s)),
        )
        self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[sock]))
            except BaseException as exc:  # reported by start()
                self._error = exc

        self._thread = threading.Thread(target=run, name="credo-serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = f": {self._error!r}" if self._error else ""
                self.stop()
                raise RuntimeError(f"the server did not start within {self.start_timeout_s} s{why}")
            time.sleep(0.01)
        return self

    def stop(self) -> bool:
        """Stop uvicorn (gracefully, then forced) and the engine; True when both threads
        ended within their bounded waits."""
        ok = True
        if self._thread is not None and self._server is not None:
            self._server.should_exit = True
            self._thread.join(self.stop_timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(self.stop_timeout_s)
            ok = not self._thread.is_alive()
        ok = self.engine.stop(self.stop_timeout_s) and ok
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._thread = None
        return ok

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_policy(policy: Any, **kwargs: Any) -> Iterator[tuple[str, SessionRecorder]]:
    """Serve ``policy`` for the duration of a ``with`` block.

    ``with serve_policy(policy) as (base_url, recorder): ...`` — ``base_url`` is
    ``http://127.0.0.1:<ephemeral port>/v1``; ``recorder`` is the
    :class:`~credo.serve.recorder.SessionRecorder` of every session. Keyword arguments
    are those of :class:`PolicyServer`. The server is stopped on exit (bounded waits).
    """
    server = PolicyServer(policy, **kwargs).start()
    try:
        yield server.base_url, server.recorder
    finally:
        server.stop()
