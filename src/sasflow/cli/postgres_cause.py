"""Why a PostgreSQL store does not answer, in the words an operator acts on.

The store's connection pool reports only that it gave up; a probe needs the
cause: a refused port, a wrong password, a missing database and a silent host
each call for a different fix. One direct connection attempt finds it.
"""

from __future__ import annotations

import asyncio
import re

__all__ = ["classify", "postgres_cause"]

# libpq's messages, most specific first: (pattern, what the operator is told)
_CAUSES = (
    (re.compile(r"password authentication failed|authentication failed"
                r"|no password supplied|pg_hba\.conf", re.I), "authentication failed"),
    (re.compile(r'(database|role) "([^"]*)" does not exist'), None),  # named as it is
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"timeout expired|timed out", re.I), "timed out"),
    (re.compile(r"could not translate host name|name or service not known", re.I),
     "unknown host"),
)


def classify(message: str) -> str | None:
    """The cause a libpq connection error names, or None if it is none of the known ones."""
    for pattern, cause in _CAUSES:
        found = pattern.search(message)
        if found:
            return cause or found.group(0)
    return None


async def postgres_cause(url: str, within: float) -> str | None:
    """Try one connection to `url` for `within` seconds; the cause if it fails, None if
    it succeeds."""
    import psycopg  # the postgres extra is there: the store was opened with it

    try:
        async with asyncio.timeout(within):
            # libpq counts whole seconds, and takes fewer than 2 as 2
            conn = await psycopg.AsyncConnection.connect(
                url, connect_timeout=max(2, int(within)))
    except TimeoutError:
        return "timed out"
    except psycopg.Error as error:
        return classify(str(error)) or "connection failed"
    await conn.close()
    return None
