"""services/tenancy/console_sessions.py on each database: opening, finding by the secret,
idle and absolute expiry on the context's clock, revocation."""

from __future__ import annotations

from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal, Scope, issue_key
from gpuyard.services.tenancy.console_sessions import (
    IDLE_LIMIT,
    MAX_AGE,
    TOUCH_EVERY,
    find_session,
    open_session,
    revoke_session,
    session_count,
)


def _key(ctx: Context, alice: Principal) -> tuple[int, str]:
    with ctx.transaction() as s:
        issued = issue_key(
            s, user_id=alice.user_id, account_id=alice.account_id, name="c", scope=Scope.WRITE
        )
    return issued.id, issued.key


def test_a_session_is_found_by_its_secret_and_gives_back_the_key(
    ctx: Context, alice: Principal
) -> None:
    key_id, key = _key(ctx, alice)
    opened = open_session(ctx, api_key_id=key_id, key=key)
    live = find_session(ctx, opened.secret)
    assert live is not None and live.key == key and live.csrf_token == opened.csrf_token
    assert find_session(ctx, opened.secret + "x") is None
    assert find_session(ctx, "") is None


def test_an_unused_session_ends_after_the_idle_limit_and_use_extends_it(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    key_id, key = _key(ctx, alice)
    opened = open_session(ctx, api_key_id=key_id, key=key)
    for _ in range(3):  # used every 11 h: alive after 33 h
        clock.advance(11 * 3600)
        assert find_session(ctx, opened.secret) is not None
    clock.advance(IDLE_LIMIT.total_seconds() + 1)
    assert find_session(ctx, opened.secret) is None


def test_last_use_is_written_at_most_once_a_minute(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    key_id, key = _key(ctx, alice)
    opened = open_session(ctx, api_key_id=key_id, key=key)
    start = clock.now()
    clock.advance(TOUCH_EVERY.total_seconds() / 2)
    live = find_session(ctx, opened.secret)
    assert live is not None and live.last_seen_at == start
    clock.advance(TOUCH_EVERY.total_seconds())
    live = find_session(ctx, opened.secret)
    assert live is not None and live.last_seen_at == clock.now()


def test_a_session_ends_at_its_absolute_age_however_used(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    key_id, key = _key(ctx, alice)
    opened = open_session(ctx, api_key_id=key_id, key=key)
    hours = int(MAX_AGE.total_seconds() // 3600)
    for _ in range(hours // 6):
        clock.advance(6 * 3600)
        find_session(ctx, opened.secret)
    clock.advance(6 * 3600)
    assert find_session(ctx, opened.secret) is None


def test_revoking_ends_the_session_and_only_it(ctx: Context, alice: Principal) -> None:
    key_id, key = _key(ctx, alice)
    first = open_session(ctx, api_key_id=key_id, key=key)
    second = open_session(ctx, api_key_id=key_id, key=key)
    assert session_count(ctx, key_id) == 2
    assert revoke_session(ctx, first.secret) is True
    assert revoke_session(ctx, first.secret) is False
    assert find_session(ctx, first.secret) is None
    assert find_session(ctx, second.secret) is not None
    # Ended rows of the key are cleared when it opens the next session.
    open_session(ctx, api_key_id=key_id, key=key)
    assert session_count(ctx, key_id) == 2
