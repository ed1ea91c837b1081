"""The pooled backend client every kind composes: one backend origin, its turns and models.

What is the same for every backend kind lives here once: HTTP/1.1 pools per client identity
(`http1.pool.ClientPools`, keyed by `Turn.client`: a backend that desynchronises a
connection can only hand a client its own words), the proxy, TLS and timeouts, content
codings, the shared whole-JSON byte budget, transport errors mapped to `RequestError`s
(streamer/upstream/backend_errors.py), and the 400-retry without the optional parameters a
backend names. What a kind's turns are on the wire is its `Wire`: the path, the body as
sent, the headers and key, the stream and whole-body decoders, its reading of an error.

Every turn is streamed; a backend that answers with a whole JSON body anyway is decoded
into the same deltas, so callers have one path. Failures before the stream starts raise
`RequestError` with the backend's own status and message (502 when it cannot be reached);
failures after it started are the stream's last batch, ending in `UpstreamError`.

The backend's API key only ever travels in the kind's key header; no message, repr or
exception built here contains it (exceptions are raised `from None` for that reason). The
backend's own words are scrubbed of `secrets` (whole ones, streamer/core/scrub.py) where
they enter: its error bodies (the kind's `http_error`), its error events and malformed
payloads (the kind's decoders), the bytes a protocol error quotes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import orjson

from streamer.core.errors import RequestError
from streamer.core.identity import client_identity
from streamer.core.scrub import bearer_token, excerpt, secrets_of
from streamer.core.wire_messages import body_pieces
from streamer.upstream.backend_errors import Failures, Rejected, read_http_error
from streamer.upstream.backend_stream import BackendStream
from streamer.upstream.body_budget import ByteBudget
from streamer.upstream.chat.rejected_params import without
from streamer.upstream.http1.connection import READ_SIZE, Payload, Response
from streamer.upstream.http1.connection_limit import ConnectionLimit, OpenConnections
from streamer.upstream.http1.content_coding import (
    ContentCodingError,
    DecodedResponse,
    UnsupportedCoding,
    decoder_for,
)
from streamer.upstream.http1.pool import ClientPools, ConnectionPool
from streamer.upstream.http1.proxy import Proxy
from streamer.upstream.http1.wire import (
    ConnectError,
    HTTPClientError,
    ProtocolError,
    ReadTimeout,
)
from streamer.upstream.kind import Wire, bearer

log = logging.getLogger("streamer.upstream")

# A whole non-streamed answer: 4x the default --max-output-bytes (JSON escapes, and
# arguments are JSON in a JSON string), so an answer within the output limit always fits.
JSON_BODY_LIMIT = 64 << 20
JSON_BUDGET_LIMIT = 256 << 20  # all whole-JSON answers being read at once (the default)
# Shorter than the 5 s keep-alive of uvicorn (vLLM, SGLang) and llama.cpp, so a pooled
# connection is dropped here before the server drops it under a request.
KEEPALIVE_TIMEOUT = 4.0
PROBE = "probe"  # the pool of readiness probes and unauthenticated model listings (not a digest)


class BackendClient:
    """One backend at `base_url` (what the OpenAI SDK would take: `.../v1`) of one kind."""

    def __init__(
        self,
        base_url: str,
        wire: Wire,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10,
        idle_timeout: float = 300,
        first_byte_timeout: float | None = None,
        max_connections: int = 0,
        keepalive: bool = True,
        client_pools: int = 256,
        proxy: Proxy | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_json_body: int = JSON_BODY_LIMIT,
        json_budget: ByteBudget | None = None,
        open_connections: OpenConnections | None = None,
        secrets: Iterable[str | None] = (),
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.wire = wire
        # taken out of the backend's words where they enter: its key, and every other
        # this gateway knows (a forwarded bearer token is added per request)
        self.secrets = secrets_of((api_key, *secrets))
        # optional parameters this backend answered 400 to: left out from then on (a subset
        # of the fixed `rejected_params.DROPPABLE`, so bounded)
        self.rejected: frozenset[str] = frozenset()
        self._parts = parts = urlsplit(self.base_url)  # the pools take it parsed
        self._proxy = proxy  # None: direct (see `proxy.select_proxy`)
        self._forward_proxy = proxy is not None and parts.scheme != "https"
        # one bound for every pool to this origin (0: unlimited, the backend sets the pace)
        self.connection_limit = ConnectionLimit(max_connections) if max_connections > 0 else None
        # every backend connection of the process, all upstreams together (its fd budget)
        self.open_connections = open_connections
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._path = parts.path
        self.connect_timeout = connect_timeout
        # `first_byte_timeout` bounds the wait for the answer's first body byte (the head
        # may come first; a backend reading a long prompt sends nothing), `idle_timeout`
        # every gap between body reads after it (llama.cpp goes silent after SIGTERM); they
        # do not run while reading is paused by flow control, so a slow client is not idle
        self.idle_timeout = idle_timeout
        self.first_byte_timeout = idle_timeout if first_byte_timeout is None else first_byte_timeout
        self.failures = Failures(self._where(), self.first_byte_timeout)
        self._api_key = api_key
        self._keepalive = keepalive  # False: a new connection per request, nothing shared
        self._client_pools = client_pools  # most client identities with a pool of their own
        self._pools: ClientPools | None = None
        if ssl_context is None and parts.scheme == "https":
            ssl_context = ssl.create_default_context()  # the system's CAs
        self._ssl_context = ssl_context
        self._read_buffer = memoryview(bytearray(READ_SIZE))  # one for all pools (see Connection)
        self._turn_head = b""  # the request head up to Content-Length, without extra headers
        self.max_json_body = max_json_body
        # shared by every answer of this upstream (one per process): the app passes one
        self.json_budget = json_budget or ByteBudget(JSON_BUDGET_LIMIT)

    def __repr__(self) -> str:
        return f"BackendClient({self.wire.path!r} at {self._where()!r})"

    @property
    def pools(self) -> ClientPools:
        """The keep-alive connections to the backend, per client (made on first use)."""
        if self._pools is None:
            self._pools = ClientPools(self._new_pool, self._client_pools if self._keepalive else 1)
        return self._pools

    def pool_for(self, client: str) -> ConnectionPool:
        """The pool that carries the requests of `client` (with keep-alive off: one for all,
        since it keeps nothing)."""
        return self.pools.get(client if self._keepalive else "")

    @property
    def pool(self) -> ConnectionPool:
        """The anonymous client's pool."""
        return self.pool_for("")

    def _new_pool(self) -> ConnectionPool:
        pool = ConnectionPool(
            self._parts,
            connect_timeout=self.connect_timeout,
            keepalive=KEEPALIVE_TIMEOUT,
            ssl_context=self._ssl_context,
            proxy=self._proxy,
            limiter=self.connection_limit,
            open_limit=self.open_connections,
            reuse=self._keepalive,
            read_buffer=self._read_buffer,
        )
        if not self._turn_head:  # the same for every pool: one origin, one reuse policy
            target = self._path + self.wire.path
            head = pool.head("POST", target, self._headers(dict(self.wire.headers), pool), None)
            self._turn_head = head[:-2]  # without the blank line
        return pool

    async def open(
        self,
        backend_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        client: str = "",
    ) -> BackendStream:
        """Send a turn's request and return its stream once the backend has answered 2xx.

        `on_raw`, if given, sees every byte of a 2xx body as it is read (for recordings).
        `client` (`Turn.client`) picks the connections: only this client's requests use them.
        A 400 naming optional parameters the backend does not take is sent again once
        without them, before anything reaches the caller; they stay out from then on.
        """
        try:
            return await self._open(self._as_sent(backend_request), headers, on_raw, client)
        except Rejected as rejected:
            self._remember(rejected)
        try:  # once: what a second 400 names is remembered, and the 400 passes through
            return await self._open(self._as_sent(backend_request), headers, on_raw, client)
        except Rejected as rejected:
            self._remember(rejected)
            raise rejected.error from None

    def _as_sent(self, backend_request: dict[str, Any]) -> dict[str, Any]:
        return without(self.wire.body(backend_request), self.rejected)

    def _remember(self, rejected: Rejected) -> None:
        new = [name for name in rejected.names if name not in self.rejected]
        if new:
            self.rejected = self.rejected | set(new)
            log.warning(
                "the backend at %s answered %d to %s: left out of every request from now on",
                self._where(),
                rejected.status,
                ", ".join(new),
            )

    async def _open(
        self,
        body: dict[str, Any],
        headers: dict[str, str] | None,
        on_raw: Callable[[bytes], None] | None,
        client: str,
    ) -> BackendStream:
        # a continued conversation's earlier messages as kept: pieces, sent as they are
        pieces = body_pieces(body)
        length = len(pieces[0]) if len(pieces) == 1 else sum(map(len, pieces))
        pool = self.pool_for(client)
        secrets = self._secrets_for(headers)
        if headers:
            merged = self._headers({**dict(self.wire.headers), **headers}, pool)
            head = pool.head("POST", self._path + self.wire.path, merged, length)
        else:
            head = self._turn_head + b"Content-Length: %d\r\n\r\n" % length
        payload = head + pieces[0] if len(pieces) == 1 else [head, *pieces]
        raw_resp = await self._request(
            pool, payload, self.first_byte_timeout, self.idle_timeout, secrets
        )
        resp: Response | DecodedResponse = raw_resp
        try:
            if resp.status >= 300:
                raise await self._http_error(raw_resp, secrets, body)
            resp = self._decoding(raw_resp, secrets)
            if "json" in resp.content_type:
                return self._whole(await self._read_json(resp, secrets), on_raw, resp, secrets)
            decoder = self.wire.decoder(self.idle_timeout, self.first_byte_timeout, secrets)
            return await BackendStream.reading(resp, decoder, on_raw=on_raw, secrets=secrets)
        except BaseException:
            resp.release()  # kept if the whole body is in, else cut
            raise

    def _whole(
        self,
        raw: bytearray,
        on_raw: Callable[[bytes], None] | None,
        resp: Response | DecodedResponse,
        secrets: tuple[str, ...],
    ) -> BackendStream:
        """A whole JSON answer, decoded; its bytes given back to the budget."""
        try:
            if on_raw is not None:
                on_raw(bytes(raw))
            deltas = self.wire.decode_whole(raw, secrets)
        finally:
            self.json_budget.give(len(raw))
        resp.release()
        return BackendStream.answered(deltas)

    def _secrets_for(self, headers: dict[str, str] | None) -> tuple[str, ...]:
        """This request's secrets: the gateway's, and the client's forwarded bearer token."""
        token = bearer_token(headers)
        return secrets_of((*self.secrets, token)) if token else self.secrets

    async def _read_json(
        self, resp: Response | DecodedResponse, secrets: tuple[str, ...]
    ) -> bytearray:
        """A whole JSON body, its bytes taken from `json_budget` (the caller gives them back).

        Past `max_json_body` the turn fails with a 502, past the shared budget with a 503;
        either way the rest is not read and the connection is cut (`release`).
        """
        budget, cap, failures = self.json_budget, self.max_json_body, self.failures
        declared = resp.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise failures.too_large(cap)
        raw = bytearray()  # grown in place and decoded as it is: the body is not copied
        try:
            while data := await resp.read():
                if len(raw) + len(data) > cap:
                    raise failures.too_large(cap)
                if not budget.take(len(data)):
                    raise failures.over_budget(budget.limit)
                raw += data
        except TimeoutError:
            budget.give(len(raw))
            raise failures.timed_out() from None
        except ContentCodingError as exc:  # before ProtocolError: it is one
            budget.give(len(raw))
            raise failures.undecodable(exc, secrets) from None
        except ProtocolError as exc:
            budget.give(len(raw))
            raise failures.invalid(exc, secrets) from None
        except (HTTPClientError, OSError):
            budget.give(len(raw))
            raise failures.closed_early("sending its answer") from None
        except BaseException:
            budget.give(len(raw))
            raise
        return raw

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """The backend's `GET /models`, status and body as they came (`headers`: as `open`)."""
        raw_resp = await self._get_models(min(self.idle_timeout, 30), headers)
        return await self._whole_answer(raw_resp, "listing its models")

    async def _whole_answer(self, raw_resp: Response, doing: str) -> tuple[int, bytes]:
        """Status and body (at most `JSON_BODY_LIMIT` bytes) of an answer that is not a turn;
        its failures in the turn's terms."""
        resp: Response | DecodedResponse = raw_resp
        try:
            resp = self._decoding(raw_resp, self.secrets)
            return resp.status, await resp.read_all(JSON_BODY_LIMIT)
        except TimeoutError:
            raise self.failures.timed_out() from None
        except ContentCodingError as exc:
            raise self.failures.undecodable(exc, self.secrets) from None
        except (HTTPClientError, OSError):
            raise self.failures.closed_early(doing) from None
        finally:
            resp.release()  # kept if the whole body is in, else cut

    async def models_answer(self, limit: int) -> tuple[int, dict[str, str], bytes]:
        """`GET /models` as the startup profile probe reads it: status, headers, and the
        body up to `limit` bytes (as the probe's pool asks, without client headers)."""
        raw_resp = await self._get_models(self.connect_timeout)
        resp: Response | DecodedResponse = raw_resp
        try:
            resp = self._decoding(raw_resp, self.secrets)
            body = await resp.read_all(limit)
            return raw_resp.status, {k: v for k, v in raw_resp.headers.items()}, body
        finally:
            resp.release()  # kept if the whole body is in, else cut

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        client: str = "",
    ) -> tuple[int, bytes]:
        """POST `body` to `path` from the server's root (the base URL less a trailing `/v1`):
        a backend's own routes such as `/tokenize`. Status and body (at most
        `JSON_BODY_LIMIT` bytes) as they came; bounded by the idle timeout."""
        root = self._path[:-3] if self._path.endswith("/v1") else self._path
        data = orjson.dumps(body)
        pool = self.pool_for(client)
        asked = {**dict(self.wire.headers), "Accept": "application/json", **(headers or {})}
        merged = self._headers(asked, pool)
        head = pool.head("POST", root + path, merged, len(data))
        timeout = min(self.idle_timeout, 30)
        raw_resp = await self._request(pool, head + data, timeout, timeout)
        return await self._whole_answer(raw_resp, "answering")

    async def ping(self) -> bool:
        """Readiness: the backend answers `GET /models` with anything but a 5xx."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                resp = await self._get_models(self.connect_timeout)
        except (RequestError, TimeoutError):
            return False
        resp.release()  # the body is not needed: kept if it is all there, else cut
        return resp.status < 500

    async def close(self) -> None:
        if self._pools is not None:
            await self._pools.close()
        self._pools = None

    def _headers(self, headers: dict[str, str], pool: ConnectionPool) -> list[tuple[str, str]]:
        """Headers merged case-insensitively, the later winning; the key added if none came."""
        merged = {k.lower(): (k, v) for k, v in headers.items()}
        forwarded = merged.get("authorization")
        if forwarded is not None and self.wire.auth is not bearer:
            # a client's forwarded bearer token goes where this kind takes its key (x-api-key)
            del merged["authorization"]
            name, value = self.wire.auth(bearer_token({"authorization": forwarded[1]}) or "")
            merged[name.lower()] = (name, value)
        elif forwarded is None:
            if self._api_key:
                name, value = self.wire.auth(self._api_key)
                merged.setdefault(name.lower(), (name, value))
            elif pool.basic_auth:  # credentials in the base URL
                merged["authorization"] = ("Authorization", pool.basic_auth)
        return list(merged.values())

    async def _get_models(self, timeout: float, headers: dict[str, str] | None = None) -> Response:
        # a forwarded Authorization names the client, as it does for its turns
        auth = headers.get("Authorization") if headers else None
        pool = self.pool_for(client_identity(auth) if auth else PROBE)
        asked = {k: v for k, v in self.wire.headers if k.lower() not in _TURN_ONLY}
        head = pool.head(
            "GET", self._path + "/models", self._headers({**asked, **(headers or {})}, pool), None
        )
        return await self._request(pool, head, timeout)

    async def _request(
        self,
        pool: ConnectionPool,
        payload: Payload,
        timeout: float,
        idle: float | None = None,
        secrets: tuple[str, ...] | None = None,
    ) -> Response:
        failures = self.failures
        try:
            return await pool.request(payload, timeout, idle)
        except ConnectError as exc:
            raise failures.unreachable(exc.reason) from None
        except ReadTimeout:
            raise failures.timed_out() from None
        except ProtocolError as exc:
            raise failures.invalid(exc, self.secrets if secrets is None else secrets) from None
        except (HTTPClientError, OSError):
            raise failures.closed_early("answering") from None

    def _decoding(self, resp: Response, secrets: tuple[str, ...]) -> Response | DecodedResponse:
        """`resp`, or its body decoded if a `Content-Encoding` came (a proxy compressed it)."""
        try:
            decoder = decoder_for(_content_encoding(resp))
        except UnsupportedCoding as exc:
            raise self.failures.undecodable(exc, secrets) from None
        return resp if decoder is None else DecodedResponse(resp, decoder)

    async def _http_error(
        self, resp: Response, secrets: tuple[str, ...], sent: dict[str, Any] | None = None
    ) -> RequestError:
        """A non-2xx answer; the forward proxy's own 407 is a 502 that names it. With
        `sent`, a 400 that names optional parameters of it is `Rejected`."""
        if resp.status == 407 and self._forward_proxy and self._proxy is not None:
            return self.failures.proxy_refused(self._proxy.where)
        wire = self.wire
        try:
            decoder = decoder_for(_content_encoding(resp))
        except UnsupportedCoding as exc:  # the status matters more than the body's text
            error = wire.http_error(resp.status, b"", resp.headers, secrets)
            coding = excerpt(exc.coding, 40, secrets)
            error.message += f" (its body is in Content-Encoding {coding!r}, not decoded)"
            return error
        body = resp if decoder is None else DecodedResponse(resp, decoder)
        return await read_http_error(body, wire.http_error, wire.rejected_params, secrets, sent)

    def _where(self) -> str:
        # host and port only: a base URL may carry credentials in its userinfo
        return f"{self._host}:{self._port}"


# what a `GET /models` does not send of a turn's headers (it has no body, wants JSON)
_TURN_ONLY = ("content-type", "accept", "accept-encoding")


def _content_encoding(resp: Response) -> str | None:
    values = resp.headers.getall("Content-Encoding", None)
    return ",".join(values) if values else None
