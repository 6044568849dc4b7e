"""The Redis Streams transport's dead letters (R3): how entries carry their count,
and the dead-letter stream.

An entry sent again after failing carries its failed deliveries so far and the
first one's time in fields of its own. Once that count, plus the times Redis
delivered the entry (XPENDING's count, which grows each time a dead consumer's
entry is taken over), reaches the delivery policy's bound, or at once for a
body its handler cannot decode, the entry moves to the dead-letter stream
(``sasflow.dead-letters``, URL option ``dead_letters=NAME``) with its reason,
in one script (`BURY`) that also acks and deletes it.
"""

from __future__ import annotations

from sasflow.transport.dead_letter import DeadLetter

__all__ = ["BURY", "DEAD_LETTERS", "DELIVERIES", "FIELD", "FIRST_SEEN", "PURGE", "as_float",
           "as_int", "letter", "text"]

FIELD = b"body"
# an entry sent again after failing: its failed deliveries so far, and the first one's time
DELIVERIES = b"deliveries"
FIRST_SEEN = b"first_seen"
DEAD_LETTERS = "sasflow.dead-letters"

# Move an entry to the dead-letter stream (KEYS[2]) with its reason; its new id.
BURY = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  local id = redis.call('XADD', KEYS[2], '*', 'queue', ARGV[3], 'reason', ARGV[4],
    'deliveries', ARGV[5], 'first_seen', ARGV[6], 'at', ARGV[7], 'body', ARGV[8])
  redis.call('XDEL', KEYS[1], ARGV[2])
  return id
end
return false
"""

# Forget the dead letters; how many there were (a script: atomic, and no MULTI
# for the ACL of docs/deploy.md to grant).
PURGE = """
local n = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
"""


def as_int(value: bytes | None) -> int:
    """A count field's value; 0 when absent or not a number."""
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def as_float(value: bytes | None) -> float:
    """A time field's value; 0.0 when absent or not a number."""
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def letter(entry_id: bytes | str, fields: dict[bytes, bytes]) -> DeadLetter:
    """A dead letter as the dead-letter stream holds it."""
    at = as_float(fields.get(b"at"))
    return DeadLetter(id=text(entry_id), queue=fields.get(b"queue", b"").decode(errors="replace"),
                      reason=fields.get(b"reason", b"").decode(errors="replace"),
                      deliveries=as_int(fields.get(DELIVERIES)),
                      first_seen=as_float(fields.get(FIRST_SEEN)) or at, at=at,
                      body=fields.get(FIELD, b""))
