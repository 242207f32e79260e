"""Authentication, roles, origins and connection limits (docs/protocol.md §1, §4, §11, §12).

Every test runs a real broker with tokens configured and talks to it with raw clients.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from conveyor.broker.admission import host_allowed
from conveyor.broker.server import Broker
from conveyor.sdk._wire import OPS, Role

from .conftest import ClientFactory, RawClient, http_get, with_config

PUBLISH = "pub-7f3a9c1e-secret"
WORK = "work-2b8d4e6f-secret"
READ = "read-9c1a5b3d-secret"
ADMIN = "admin-4e6f8a2c-secret"
TOKENS = {
    PUBLISH: frozenset({Role.PUBLISH}),
    WORK: frozenset({Role.WORK}),
    READ: frozenset({Role.READ}),
    ADMIN: frozenset({Role.ADMIN}),  # the admin role alone grants everything
}
TOKEN_OF = {Role.PUBLISH: PUBLISH, Role.WORK: WORK, Role.READ: READ, Role.ADMIN: ADMIN}

secured = with_config(tokens=TOKENS)

# One valid request per operation (hello and ping need no role), in an order in which
# the admin's whole run succeeds: the queue exists before resume, subscribe comes
# before unsubscribe.
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("enqueue", {"queue": "q", "payload": 1}),
    ("enqueue_batch", {"queue": "q", "jobs": [{"payload": 2}]}),
    ("enqueue_each", {"jobs": [{"queue": "q", "payload": 3}]}),
    ("enqueue_group", {"jobs": [{"queue": "q", "payload": 4}]}),
    ("dependency_results", {"id": "no-such-job"}),
    ("get_job", {"id": "no-such-job"}),
    ("wait", {"id": "no-such-job", "timeout_s": 0}),
    ("cancel", {"id": "no-such-job"}),
    ("cancel_batch", {"ids": ["no-such-job"]}),
    ("stats", {}),
    ("list_jobs", {"queue": "q", "state": "ready"}),
    ("subscribe", {"worker_id": "w", "queues": ["other"], "prefetch": 1}),
    ("unsubscribe", {}),
    ("ack", {"id": "x", "lease": "y"}),
    ("retry", {"id": "x", "lease": "y"}),
    ("fail", {"id": "x", "lease": "y"}),
    ("heartbeat", {"id": "x", "lease": "y"}),
    ("ack_batch", {"items": [{"id": "x", "lease": "y"}]}),
    ("heartbeat_batch", {"items": [{"id": "x", "lease": "y"}]}),
    ("pause", {"queue": "q"}),
    ("resume", {"queue": "q"}),
    ("redrive", {"id": "x"}),
    ("redrive_all", {"queue": "q"}),
    ("purge_dead", {"queue": "q"}),
    ("sweep", {}),
    ("set_limits", {"queue": "q", "concurrency": 5}),
    ("back_off", {"id": "x", "lease": "y", "delay_s": 1}),
    ("set_schedule", {"schedule": {"id": "s", "queue": "q", "every_s": 60}}),
    ("pause_schedule", {"id": "s"}),
    ("resume_schedule", {"id": "s"}),
    ("run_schedule", {"id": "s"}),
    ("delete_schedule", {"id": "s"}),
    ("list_schedules", {}),
    ("watch", {}),
    ("progress", {"items": [{"id": "x", "lease": "y", "progress": 0.5}]}),
    ("watch_job", {"id": "no-such-job"}),
    ("unwatch_job", {"id": "no-such-job"}),
]

# docs/protocol.md §4, "Roles".
ALLOWED = {
    Role.PUBLISH: {
        "enqueue",
        "enqueue_batch",
        "enqueue_each",
        "enqueue_group",
        "dependency_results",
        "get_job",
        "wait",
        "watch_job",
        "unwatch_job",
        "cancel",
        "cancel_batch",
        "stats",
        "list_jobs",
        "list_schedules",
    },
    Role.WORK: {
        "subscribe",
        "unsubscribe",
        "ack",
        "retry",
        "fail",
        "heartbeat",
        "ack_batch",
        "heartbeat_batch",
        "back_off",
        "progress",
        "get_job",
        "dependency_results",
    },
    Role.READ: {
        "get_job",
        "wait",
        "watch_job",
        "unwatch_job",
        "stats",
        "list_jobs",
        "list_schedules",
        "watch",
        "dependency_results",
    },
    Role.ADMIN: {op for op, _ in REQUESTS},
}


def error_code(reply: dict[str, Any]) -> str | None:
    return None if reply["ok"] else reply["error"]["code"]


def test_every_operation_is_in_the_role_matrix() -> None:
    assert {op for op, _ in REQUESTS} == set(OPS) - {"hello", "ping"}


@secured
@pytest.mark.parametrize("role", list(Role))
async def test_each_role_may_call_only_its_operations(client: ClientFactory, role: Role) -> None:
    conn = await client()
    hello = await conn.call("hello", token=TOKEN_OF[role], client="test/1")
    assert hello["roles"] == [role.value]
    for op, fields in REQUESTS:
        reply = await conn.request(op, **fields)
        if op in ALLOWED[role] and role is Role.READ and op == "list_jobs":
            # Allowed: the queue is not found, as a reader cannot make one.
            assert error_code(reply) == "not_found", (role, op, reply)
        elif op in ALLOWED[role]:
            assert reply["ok"] is True, (role, op, reply)
        else:
            assert error_code(reply) == "forbidden", (role, op, reply)
            assert reply["error"]["field"] == "op"
            # The refusal names the op and a role that would grant it.
            message = reply["error"]["message"]
            assert message.startswith(f"op: this connection may not call {op!r}: it needs the ")
            assert any(r.value in message for r in OPS[op].roles), message
    if role is Role.READ:
        # Nothing it was refused took effect: no queue was created by enqueue, pause
        # or subscribe.
        assert (await conn.call("stats"))["queues"] == {}


@secured
async def test_without_a_token_only_hello_and_ping_are_allowed(client: ClientFactory) -> None:
    conn = await client()
    for op, fields in REQUESTS:
        reply = await conn.request(op, **fields)
        assert error_code(reply) == "unauthorized", (op, reply)
    assert (await conn.request("ping"))["ok"] is True
    # hello without a token is refused, but the connection stays open so the client
    # can try again with one.
    reply = await conn.request("hello", client="browser")
    assert error_code(reply) == "unauthorized"
    assert reply["error"]["field"] == "token"
    assert (await conn.call("hello", token=PUBLISH))["roles"] == ["publish"]
    assert (await conn.request("enqueue", queue="q", payload=1))["ok"] is True


@secured
async def test_hello_with_a_wrong_token_is_refused_and_closed(client: ClientFactory) -> None:
    conn = await client()
    wrong = "not-a-real-token-5d1c"
    reply = await conn.request("hello", token=wrong)
    assert error_code(reply) == "unauthorized"
    assert wrong not in orjson.dumps(reply).decode()
    assert await conn.closed() == 1008


@secured
async def test_token_in_the_authorization_header(client: ClientFactory) -> None:
    conn = await client(additional_headers={"Authorization": f"Bearer {PUBLISH}"})
    # No hello needed: the header authenticated the connection.
    assert (await conn.request("enqueue", queue="q", payload=1))["ok"] is True
    reply = await conn.request("subscribe", worker_id="w", queues=["q"])
    assert error_code(reply) == "forbidden"
    # hello without a token keeps the header's roles.
    assert (await conn.call("hello"))["roles"] == ["publish"]

    # A token in hello replaces what the header granted.
    other = await client(additional_headers={"Authorization": f"Bearer {PUBLISH}"})
    assert (await other.call("hello", token=WORK))["roles"] == ["work"]
    assert (await other.request("subscribe", worker_id="w2", queues=["q"]))["ok"] is True
    assert error_code(await other.request("enqueue", queue="q", payload=2)) == "forbidden"


@secured
async def test_an_unknown_header_token_is_refused_at_the_handshake(
    client: ClientFactory,
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await client(additional_headers={"Authorization": "Bearer who-knows-8e2f"})
    assert refused.value.response.status_code == 401
    assert b"who-knows-8e2f" not in refused.value.response.body


@with_config(origins=("https://dashboard.example",))
async def test_browser_origins_are_held_to_the_allow_list(
    broker: Broker, client: ClientFactory
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await client(origin="https://evil.example")
    assert refused.value.response.status_code == 403

    port = broker.url.rsplit(":", 1)[1].split("/")[0]
    for origin in (f"http://127.0.0.1:{port}", "https://dashboard.example", None):
        conn = await client(origin=origin)
        assert (await conn.request("ping"))["ok"] is True, origin


@with_config(tokens=TOKENS, max_connections_per_token=1)
async def test_connections_per_token_are_limited(client: ClientFactory) -> None:
    first = await client()
    await first.call("hello", token=PUBLISH)

    # Over the limit by hello: answered limit_exceeded, then closed 1013.
    second = await client()
    reply = await second.request("hello", token=PUBLISH)
    assert error_code(reply) == "limit_exceeded"
    assert reply["error"]["field"] == "token"
    assert await second.closed() == 1013

    # Over the limit by header: closed 1013 at once.
    third = await client(additional_headers={"Authorization": f"Bearer {PUBLISH}"})
    assert await third.closed() == 1013

    # Other tokens have their own count.
    worker = await client()
    await worker.call("hello", token=WORK)

    # The slot frees when the first connection ends.
    await first.ws.close()
    fourth = await client()
    assert (await fourth.call("hello", token=PUBLISH))["roles"] == ["publish"]


@with_config(tokens=TOKENS, handshake_timeout_s=0.3)
async def test_an_unauthenticated_connection_is_closed_after_the_handshake_timeout(
    client: ClientFactory,
) -> None:
    loop = asyncio.get_running_loop()
    by_header = await client(additional_headers={"Authorization": f"Bearer {WORK}"})
    by_hello = await client()
    await by_hello.call("hello", token=READ)
    started = loop.time()
    idle = await client()
    # Even a connection that pings (allowed without a token) must authenticate in time.
    assert (await idle.request("ping"))["ok"] is True
    assert await idle.closed(timeout=5.0) == 1008
    assert loop.time() - started >= 0.29
    # The authenticated connections are past their deadline too, and still served.
    assert (await by_header.request("ping"))["ok"] is True
    assert (await by_hello.request("stats"))["ok"] is True


@with_config(tokens=TOKENS, max_connections_per_token=1)
async def test_tokens_never_appear_in_the_logs(
    caplog: pytest.LogCaptureFixture, client: ClientFactory
) -> None:
    caplog.set_level(logging.DEBUG, logger="conveyor")
    # The CLI silences websockets' own loggers; its INFO-level records are checked anyway.
    caplog.set_level(logging.INFO, logger="websockets.server")
    wrong = "wrong-token-0a9b8c7d"

    conn: RawClient = await client(additional_headers={"Authorization": f"Bearer {ADMIN}"})
    await conn.call("hello", token=ADMIN, client="log-test")
    with pytest.raises(InvalidStatus):
        await client(additional_headers={"Authorization": f"Bearer {wrong}"})
    with pytest.raises(InvalidStatus):
        await client(origin="https://evil.example")
    over = await client()
    await over.request("hello", token=ADMIN)  # over the per-token limit
    await over.closed()
    bad = await client()
    await bad.request("hello", token=wrong)
    await bad.closed()
    typo = await client()
    await typo.request("hello", token=PUBLISH, tokne=PUBLISH)
    await typo.request("hello", token=PUBLISH)
    await conn.call("enqueue", queue="q", payload={"token": "payloads are not secrets"})

    assert caplog.records, "expected the broker to log something while refusing"
    for token in (*TOKENS, wrong):
        assert token not in caplog.text


# --------------------------------------------------------------------- Host (DNS rebinding)


async def test_a_loopback_broker_serves_only_loopback_names_and_addresses(
    broker: Broker, client: ClientFactory
) -> None:
    # A page on evil.example whose name resolves to 127.0.0.1 sends its own name as Host,
    # and an Origin that matches it: refused on every path, the upgrade included.
    port = broker.url.rsplit(":", 1)[1].split("/")[0]
    rebound = f"evil.example:{port}"
    for path in ("/", "/healthz", "/metrics", "/ws"):
        status, _headers, body = await http_get(broker, path, host=rebound)
        assert (status, body) == (403, b"host not allowed\n"), path
    with pytest.raises(InvalidStatus) as refused:
        sock = socket.create_connection(("127.0.0.1", int(port)))
        await connect(f"ws://{rebound}/ws", sock=sock, origin=Origin(f"http://{rebound}"))
    assert refused.value.response.status_code == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LocalHost", "[::1]:8", "app.localhost"):
        status, _headers, _body = await http_get(broker, "/healthz", host=host)
        assert status == 200, host


async def test_a_repeated_host_header_is_refused(broker: Broker, no_errors_logged: None) -> None:
    for name in ("Host", "Origin", "Authorization"):
        status, _, body = await http_get(broker, "/ws", [(name, "127.0.0.1"), (name, "x")])
        assert (status, body) == (400, f"{name}: the header must not repeat\n".encode()), name


@with_config(allowed_hosts=("broker.internal", ".example.com"))
async def test_allowed_hosts_add_names_and_domains(broker: Broker) -> None:
    for host in ("broker.internal:8765", "example.com", "q.example.com"):
        assert (await http_get(broker, "/healthz", host=host))[0] == 200, host
    for host in ("evil.internal", "notexample.com", "example.com.evil.net"):
        assert (await http_get(broker, "/healthz", host=host))[0] == 403, host


def test_the_host_rule() -> None:
    # Beyond loopback with no allow-list the operator's names are unknown: any is served.
    assert host_allowed("queue.corp:8765", bind_host="0.0.0.0", allowed=())
    assert not host_allowed("queue.corp:8765", bind_host="127.0.0.1", allowed=())
    assert not host_allowed("queue.corp", bind_host="0.0.0.0", allowed=("broker.corp",))
    assert host_allowed("anything", bind_host="127.0.0.1", allowed=("*",))
    assert host_allowed("10.0.0.7:8765", bind_host="127.0.0.1", allowed=())
    assert not host_allowed(None, bind_host="0.0.0.0", allowed=())
    assert not host_allowed("", bind_host="0.0.0.0", allowed=())


# ------------------------------------------------------------------------------ /metrics


@secured
async def test_metrics_need_a_bearer_token_with_the_read_role(broker: Broker) -> None:
    status, headers, _ = await http_get(broker, "/metrics")
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert (await http_get(broker, "/metrics", {"Authorization": "Bearer nope"}))[0] == 401
    for token in (PUBLISH, WORK):
        status, _, _ = await http_get(broker, "/metrics", {"Authorization": f"Bearer {token}"})
        assert status == 403, token
    for token in (READ, ADMIN):
        status, _, body = await http_get(broker, "/metrics", {"Authorization": f"Bearer {token}"})
        assert status == 200 and b"conveyor_" in body, token
    # Health checks and the dashboard's files stay open: they hold no job data.
    assert (await http_get(broker, "/healthz"))[0] == 200


async def test_metrics_on_an_open_broker_need_no_token(broker: Broker) -> None:
    assert (await http_get(broker, "/metrics"))[0] == 200


# ------------------------------------------------------------------- connection limits


@with_config(max_connections_per_address=3)
async def test_connections_per_address_are_limited(client: ClientFactory) -> None:
    conns = [await client() for _ in range(3)]
    with pytest.raises(InvalidStatus) as refused:
        await client()
    assert refused.value.response.status_code == 503
    assert refused.value.response.headers["Retry-After"] == "5"
    assert b"per address" in refused.value.response.body
    # The slot frees once one of them ends.
    await conns[0].ws.close()
    await conns[0].ws.wait_closed()
    assert (await (await client()).request("ping"))["ok"] is True


@with_config(max_connections=2)
async def test_connections_in_all_are_limited(broker: Broker, client: ClientFactory) -> None:
    first, _second = await client(), await client()
    with pytest.raises(InvalidStatus) as refused:
        await client()
    assert refused.value.response.status_code == 503
    # Plain HTTP is still served: health checks see a full broker, not a dead one.
    assert (await http_get(broker, "/healthz"))[0] == 200
    await first.ws.close()
    await first.ws.wait_closed()
    assert (await (await client()).request("ping"))["ok"] is True
