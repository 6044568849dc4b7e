"""`sasflow dead-letters list|show ID|purge [--json]` on the embedded default (SPEC R3).

The in-process transport's dead letters are kept in the store (its queues die
with the worker), so the command reads them from there, from any process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid

import pytest

from sasflow.store import open_store
from sasflow.transport import DeadLetter, MalformedMessage, open_transport
from support.cli import WAIT, Cli

BODY = b'{"task_id": "t-1", "oops": "' + b"x" * 300 + b'"}'


def seed(cli: Cli) -> list[DeadLetter]:
    """Two dead letters, as the in-process transport keeps them."""
    letters = [
        DeadLetter(id="0190000000001aaaa", queue="sasflow.reply.w-1", deliveries=1,
                   reason="MalformedMessage: not a reply: JSON is malformed",
                   first_seen=1_700_000_000.0, at=1_700_000_000.0, body=b"{not json"),
        DeadLetter(id="0190000000002bbbb", queue="sasflow.agent.payments", deliveries=5,
                   reason="TransportError: cannot publish the reply", first_seen=1_700_000_010.0,
                   at=1_700_000_020.0, body=BODY)]

    async def write() -> None:
        store = open_store(cli.store)
        try:
            for letter in letters:
                await store.add_dead_letter(letter)
        finally:
            await store.close()

    asyncio.run(write())
    return letters


def test_list_shows_each_dead_letter_with_its_reason_and_a_cut_body(cli: Cli) -> None:
    seed(cli)
    result = cli("dead-letters", "list")
    assert result.status == 0, result.err
    header, first, second = result.out.splitlines()
    assert header.split() == ["ID", "QUEUE", "DELIVERIES", "FIRST", "SEEN", "AT", "REASON",
                              "BODY"]
    assert first.startswith("0190000000001aaaa") and "sasflow.reply.w-1" in first
    assert "2023-11-14T22:13:20+00:00" in first and "MalformedMessage" in first
    assert "sasflow.agent.payments" in second and " 5 " in second
    assert "x" * 100 not in second and "..." in second  # the body is cut in a list


def test_list_json_and_show_give_every_field_and_the_whole_body(cli: Cli) -> None:
    seed(cli)
    listed = cli("dead-letters", "list", "--json").json()
    assert [d["id"] for d in listed] == ["0190000000001aaaa", "0190000000002bbbb"]
    assert listed[1]["deliveries"] == 5 and listed[1]["body_bytes"] == len(BODY)
    assert listed[1]["first_seen"] == "2023-11-14T22:13:30+00:00"
    shown = cli("dead-letters", "show", "0190000000002bbbb", "--json").json()
    assert shown["body"] == BODY.decode() and shown["reason"].startswith("TransportError")
    text = cli("dead-letters", "show", "0190000000002bbbb")
    assert text.status == 0 and BODY.decode() in text.out and "deliveries: 5" in text.out


def test_purge_forgets_them_all(cli: Cli) -> None:
    seed(cli)
    assert cli("dead-letters", "purge").out.strip() == "purged 2 dead letters"
    assert cli("dead-letters", "list").out.strip() == "no dead letters"
    assert cli("dead-letters", "purge", "--json").json() == {"purged": 0}


def test_bad_input_is_one_clear_line_and_changes_nothing(cli: Cli) -> None:
    seed(cli)
    before = cli.snapshot()
    unknown = cli("dead-letters", "show", "no-such-id")
    assert unknown.status == 1
    assert "no dead letter 'no-such-id'" in unknown.one_error_line()
    usage = cli("dead-letters", "list", "--limit", "0")
    assert usage.status == 2 and "--limit" in usage.one_error_line()
    nowhere = cli("dead-letters", "list", "--store", f"sqlite:///{cli.home / 'absent.db'}")
    assert nowhere.status == 1 and "no SQLite store" in nowhere.one_error_line()
    bad_transport = cli("dead-letters", "list", "--transport", "carrier-pigeon://x")
    assert bad_transport.status == 1 and "unknown transport URL" in bad_transport.one_error_line()
    bad_bound = cli("dead-letters", "list", "--transport", "memory://?max_deliveries=0")
    assert bad_bound.status == 1
    assert "max_deliveries must be at least 1" in bad_bound.one_error_line()
    assert cli.snapshot() == before


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_brokers_dead_letters_are_read_and_purged_through_transport(
        cli: Cli, broker: str, request: pytest.FixtureRequest) -> None:
    """With --transport (or SASFLOW_TRANSPORT) the command reads the broker's own dead
    letters: a message its consumer could not decode, put there by the transport."""
    server = request.getfixturevalue(f"{broker}_server")
    run = uuid.uuid4().hex[:10]
    url = (f"{server}?prefix=cli-{run}:" if broker == "redis"
           else f"{server}?queue_expires=20&dead_letters=cli-{run}.dead-letters")
    queue = f"cli-{run}.status"
    letter = asyncio.run(dead_letter_on(url, queue, b"\xff not a status"))
    try:
        listed = cli("dead-letters", "list", "--json", env={"SASFLOW_TRANSPORT": url}).json()
        assert [(d["id"], d["queue"], d["deliveries"]) for d in listed] == [
            (letter.id, queue, 1)]
        shown = cli("dead-letters", "show", letter.id, "--json", "--transport", url).json()
        assert shown["body_base64"] == base64.b64encode(b"\xff not a status").decode()
        assert shown["reason"] == "MalformedMessage: not a status"
        assert cli("dead-letters", "purge", "--transport", url).out.strip() == (
            "purged 1 dead letter")
        assert cli("dead-letters", "list", "--transport", url).out.strip() == "no dead letters"
    finally:
        if broker == "rabbitmq":
            asyncio.run(delete_amqp(server, f"cli-{run}.dead-letters", queue))


async def dead_letter_on(url: str, queue: str, body: bytes) -> DeadLetter:
    """Publish `body` to `queue` and consume it with a handler that cannot decode it."""
    transport = open_transport(url)

    async def refuse(body: bytes) -> None:
        raise MalformedMessage("not a status")

    consumer = asyncio.create_task(transport.consume(queue, refuse, prefetch=1))
    try:
        await transport.publish(queue, body)
        async with asyncio.timeout(WAIT):
            while not (letters := await transport.dead_letters()):
                await asyncio.sleep(0.02)
        return letters[0]
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await transport.close()


async def delete_amqp(server: str, *names: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(server)
    async with connection:
        channel = await connection.channel()
        for name in names:
            await channel.queue_delete(name)
        await channel.exchange_delete(names[0])
