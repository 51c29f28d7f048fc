"""Timestamped log lines and the cursor that resumes a log stream without loss or
duplicates.

Engines stamp each line of a container's output; Podman 4.3's Docker API does so to
the second only, so many lines share one timestamp. A position in a container's output
is therefore ``(ts_ns, n)``: every line stamped before ``ts_ns`` and the first ``n``
lines stamped ``ts_ns`` (in the engine's order, which is the order they were written).
Whoever computes positions must read from the first line of a timestamp on, so every
reader counts the same lines (runtimes' ``log_lines`` never start inside a timestamp).

A cluster's log stream merges container lines (its archived containers' and its live
one's) with gpuyard's own events (``system`` lines, by event id). Its cursor holds both
positions, ``<ts_ns>-<n>-<event_id>`` (:class:`Cursor`): the two sources are delivered
live in whatever order they arrive, so one position could not say what was sent.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# At most this many lines in one answer (``tail``), and kept of each container.
MAX_TAIL = 5000
# A longer line is cut to this many characters (archived and answered alike).
MAX_LINE_CHARS = 16_384

_NS = 1_000_000_000
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?(Z|z|[+-][0-9]{2}:[0-9]{2})"
)
_CURSOR = re.compile(r"([0-9]{1,19})-([0-9]{1,9})-([0-9]{1,19})")
_UNIX = re.compile(r"([0-9]{1,12})(?:\.([0-9]{1,9}))?")
_AGO = re.compile(r"([0-9]{1,9})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}

# What ``since`` takes, for OpenAPI (parse_since decides; this only documents it).
SINCE_PATTERN = (
    r"^([0-9]{1,12}(\.[0-9]{1,9})?|[0-9]{1,9}[smhd]|[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|z|[+-][0-9]{2}:[0-9]{2}))$"
)
CURSOR_PATTERN = r"^[0-9]{1,19}-[0-9]{1,9}-[0-9]{1,19}$"


@dataclass(frozen=True)
class LogLine:
    """One line of a container's output: the engine's timestamp (ns since the epoch)
    and the text, without its line break."""

    ts_ns: int
    text: str


def parse_rfc3339_ns(value: str) -> int | None:
    """An RFC 3339 time (fraction of up to 9 digits, ``Z`` or an offset) as ns since
    the epoch, or None when it is not one (or not a real date)."""
    m = _RFC3339.fullmatch(value)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, zone = m.groups()
    try:
        dt = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError:
        return None
    offset = 0
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    seconds = int((dt.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
    return (seconds - offset) * _NS + int((frac or "").ljust(9, "0"))


def parse_since(value: str, now_ns: int) -> int:
    """``since`` as ns since the epoch: an RFC 3339 time, Unix seconds (``1767225600``,
    fraction allowed) or a duration before ``now_ns`` (``30s``, ``10m``, ``2h``,
    ``1d``). Raises ValueError naming the accepted forms; never answers below 0."""
    text = value
    unix = _UNIX.fullmatch(text)
    if unix is not None:
        return int(unix.group(1)) * _NS + int((unix.group(2) or "").ljust(9, "0"))
    ago = _AGO.fullmatch(text)
    if ago is not None:
        return max(now_ns - int(ago.group(1)) * _UNIT_S[ago.group(2)] * _NS, 0)
    ts = parse_rfc3339_ns(text)
    if ts is None:
        raise ValueError(
            "must be an RFC 3339 time (2026-01-01T00:00:00Z), Unix seconds, "
            "or a duration ago such as 30s, 10m, 2h, 1d"
        )
    return max(ts, 0)


def rfc3339(ts_ns: int) -> str:
    """``ts_ns`` as RFC 3339 in UTC with the fraction Go's RFC3339Nano gives (trailing
    zeros dropped, none when whole): ``2026-01-01T00:00:00.5Z``."""
    seconds, frac = divmod(ts_ns, _NS)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{frac:09d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"


def datetime_ns(t: datetime) -> int:
    """A (UTC when naive) datetime as ns since the epoch, to the microsecond."""
    aware = t if t.tzinfo else t.replace(tzinfo=UTC)
    delta = aware - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * _NS + delta.microseconds * 1000


def ns_datetime(ts_ns: int) -> datetime:
    """``ts_ns`` as an aware UTC datetime (to the microsecond, rounded down)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ts_ns // 1000)


def parse_timestamped(text: str) -> list[LogLine]:
    """Lines as engines write them with timestamps (``<RFC 3339> <text>`` each; also
    the archive format). A line without a readable stamp takes its predecessor's (the
    second part of a line the engine split), or 0 first."""
    out: list[LogLine] = []
    last = 0
    for raw in text.split("\n"):
        if not raw:
            continue
        stamp, sep, rest = raw.partition(" ")
        ts = parse_rfc3339_ns(stamp)
        if ts is None:
            ts, rest = last, raw
        elif not sep:
            rest = ""
        last = ts
        out.append(LogLine(ts, rest))
    return out


def format_timestamped(lines: Iterable[LogLine]) -> str:
    """The archive text of ``lines``: ``<RFC 3339 ns> <text>\\n`` each (line breaks in
    a text become spaces so each line stays one)."""
    return "".join(f"{rfc3339(line.ts_ns)} {line.text.replace(chr(10), ' ')}\n" for line in lines)


def clip(text: str) -> str:
    """``text`` cut to :data:`MAX_LINE_CHARS`."""
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


def extend_to_boundary(lines: list[LogLine], everything_since: list[LogLine]) -> list[LogLine]:
    """``lines`` (a tail) widened to start at the first line of its first timestamp:
    ``everything_since`` is a re-read from that timestamp's second on."""
    if not lines:
        return lines
    first = lines[0].ts_ns
    return [line for line in everything_since if line.ts_ns >= first]


def cap_to_boundary(lines: Sequence[LogLine], limit: int) -> list[LogLine]:
    """The last lines of ``lines``, at most ``limit``, starting at a timestamp's first
    line: whole leading timestamps are dropped (one timestamp with more than ``limit``
    lines is cut instead, the only case where the result starts inside one)."""
    if len(lines) <= limit:
        return list(lines)
    start = len(lines) - limit
    if start < len(lines) and start > 0 and lines[start].ts_ns == lines[start - 1].ts_ns:
        ts = lines[start].ts_ns
        while start < len(lines) and lines[start].ts_ns == ts:
            start += 1
        if start == len(lines):
            start = len(lines) - limit
    return list(lines[start:])


@dataclass(frozen=True)
class Cursor:
    """A position in a cluster's log stream: container lines up to ``(ts_ns, n)`` and
    events up to id ``event_id`` have been delivered. ``Cursor()``: nothing yet."""

    ts_ns: int = 0
    n: int = 0
    event_id: int = 0

    def __str__(self) -> str:
        return f"{self.ts_ns}-{self.n}-{self.event_id}"

    @classmethod
    def parse(cls, value: str) -> Cursor:
        """The cursor ``value`` names; ValueError unless it is ``<ts>-<n>-<event>``."""
        m = _CURSOR.fullmatch(value)
        if m is None:
            raise ValueError("must be a log event id: <ts_ns>-<n>-<event_id>")
        ts, n, event = (int(g) for g in m.groups())
        if ts >= 2**63 or event >= 2**63:
            raise ValueError("out of range")
        return cls(ts, n, event)

    def after_line(self, ts_ns: int, index_at_ts: int) -> Cursor:
        """This cursor once the line ``index_at_ts`` (1-based) of ``ts_ns`` is sent."""
        return Cursor(ts_ns, index_at_ts, self.event_id)

    def after_event(self, event_id: int) -> Cursor:
        return Cursor(self.ts_ns, self.n, max(self.event_id, event_id))


def indexed(lines: Sequence[LogLine]) -> list[tuple[LogLine, int]]:
    """Each line with its 1-based index among the lines of its timestamp (``lines``
    start at a timestamp's first line and are in order)."""
    out: list[tuple[LogLine, int]] = []
    prev, count = None, 0
    for line in lines:
        count = count + 1 if line.ts_ns == prev else 1
        prev = line.ts_ns
        out.append((line, count))
    return out


def is_after(ts_ns: int, index_at_ts: int, cursor: Cursor) -> bool:
    """Whether the line ``index_at_ts`` of ``ts_ns`` comes after ``cursor``."""
    return ts_ns > cursor.ts_ns or (ts_ns == cursor.ts_ns and index_at_ts > cursor.n)


class LivePositioner:
    """Places the lines of a live container's followed output after a cursor.

    The follow is read from the second of ``cursor.ts_ns`` on; ``archived_at_ts``
    lines stamped ``cursor.ts_ns`` came before this container (archived ones), so
    they count first. :meth:`admit` answers a new line's index among its stamp's
    lines (``Cursor.after_line``), or None for one already delivered."""

    def __init__(self, cursor: Cursor, archived_at_ts: int = 0) -> None:
        self._at = Cursor(cursor.ts_ns, cursor.n)
        self._ts = cursor.ts_ns
        self._before = archived_at_ts
        self._seen = 0

    def admit(self, line: LogLine) -> int | None:
        if line.ts_ns < self._ts:
            return None
        if line.ts_ns > self._ts:
            self._ts, self._before, self._seen = line.ts_ns, 0, 0
        self._seen += 1
        index = self._before + self._seen
        if not is_after(line.ts_ns, index, self._at):
            return None
        self._at = self._at.after_line(line.ts_ns, index)
        return index
