"""Budget arithmetic (core/billing/budget.py) and webhook target checks and signatures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.core.billing.budget import (
    POSTPAID,
    PREPAID,
    Standing,
    alert_threshold_micro,
    deadline,
    month_key,
    next_month_start,
    seconds_to_spend,
    usd_to_micro,
)
from gpuyard.core.errors import ValidationFailed
from gpuyard.services.tenancy.webhooks import Resolver, Target, check_target, sign, verify

NOW = datetime(2026, 3, 14, 12, 0, 0, 500_000, tzinfo=UTC)


def test_usd_to_micro_is_exact() -> None:
    assert usd_to_micro("0.000001") == 1
    assert usd_to_micro(0.1) == 100_000
    assert usd_to_micro(12.345678) == 12_345_678
    assert usd_to_micro(-5) == -5_000_000
    for bad in ("0.0000001", "nan", "inf", "1e13", "abc"):
        with pytest.raises(ValueError):
            usd_to_micro(bad)


def test_seconds_to_spend_rounds_up_to_whole_seconds() -> None:
    assert seconds_to_spend(1_000_000, 3_600_000_000) == 1  # $1 at $3600/h: 1 s
    assert seconds_to_spend(1, 3_600_000) == 1  # 1 µ$ at $3.6/h: 0.001 s -> 1 s
    assert seconds_to_spend(1_000_000, 1_000_000) == 3600
    assert seconds_to_spend(0, 5) == 0
    assert seconds_to_spend(-3, 5) == 0
    assert seconds_to_spend(10, 0) is None
    assert deadline(NOW, 500_000, 1_000_000) == NOW + timedelta(minutes=30)


def test_alert_threshold_rounds_up() -> None:
    assert alert_threshold_micro(10_000_000, 80) == 8_000_000
    assert alert_threshold_micro(3, 50) == 2
    assert alert_threshold_micro(7, 100) == 7


def test_postpaid_standing() -> None:
    s = Standing(POSTPAID, 10_000_000, 6_000_000, 1_000_000, alert_percent=80)
    assert s.remaining_micro == 4_000_000 and not s.exhausted and not s.alerting()
    assert s.alert_at(NOW) == NOW + timedelta(hours=2)
    assert s.exhausts_at(NOW) == NOW + timedelta(hours=4)
    assert s.hours_left() == 4
    spent = Standing(POSTPAID, 10_000_000, 10_000_000, 0)
    assert spent.exhausted and spent.alerting() and spent.exhausts_at(NOW) == NOW
    none = Standing(POSTPAID, None, 123, 1_000)
    assert not none.limited and none.remaining_micro is None
    assert none.exhausts_at(NOW) is None and none.alert_at(NOW) is None


def test_prepaid_low_balance() -> None:
    # $10 left at $1/h with a 4 h warning: low after 6 h (strictly under 4 h left).
    s = Standing(PREPAID, 10_000_000, 0, 1_000_000, low_balance_hours=4)
    assert not s.alerting()
    at = s.alert_at(NOW)
    assert at is not None and timedelta(hours=6) < at - NOW <= timedelta(hours=6, seconds=1)
    low = Standing(PREPAID, 10_000_000, 7_000_000, 1_000_000, low_balance_hours=4)
    assert low.alerting() and low.alert_at(NOW) == NOW
    idle = Standing(PREPAID, 10_000_000, 0, 0, low_balance_hours=4)
    assert not idle.alerting() and idle.alert_at(NOW) is None and idle.exhausts_at(NOW) is None
    negative = Standing(PREPAID, 1_000_000, 1_500_000, 10)
    assert negative.exhausted and negative.remaining_micro == -500_000


def test_months() -> None:
    assert month_key(NOW) == "2026-03"
    assert next_month_start(NOW) == datetime(2026, 4, 1, tzinfo=UTC)
    assert next_month_start(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == datetime(
        2027, 1, 1, tzinfo=UTC
    )


def _resolver(addresses: list[str]) -> Resolver:
    return lambda host, port: addresses


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::",
    ],
)
def test_non_public_targets_are_refused(address: str) -> None:
    with pytest.raises(ValidationFailed) as exc:
        check_target("https://hooks.example/x", allow_private=False, resolver=_resolver([address]))
    assert exc.value.details["field"] == "webhook_url"
    # The operator may allow them.
    target = check_target(
        "https://hooks.example/x", allow_private=True, resolver=_resolver([address])
    )
    assert target.address == address


def test_one_private_address_among_public_ones_is_refused() -> None:
    with pytest.raises(ValidationFailed):
        check_target(
            "http://hooks.example/",
            allow_private=False,
            resolver=_resolver(["8.8.8.8", "10.0.0.1"]),
        )


def test_real_loopback_is_refused_by_default() -> None:
    with pytest.raises(ValidationFailed):
        check_target("http://127.0.0.1:9/hook", allow_private=False)
    with pytest.raises(ValidationFailed):
        check_target("http://localhost:9/hook", allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example/",
        "file:///etc/passwd",
        "hooks.example/x",
        "http://user:pw@hooks.example/",
        "http:///nohost",
        "http://hooks.example:99999/",
        "http://hooks.example/a b",
        "http://hooks.example/#frag",
        "",
    ],
)
def test_malformed_targets_are_refused(url: str) -> None:
    with pytest.raises(ValidationFailed):
        check_target(url, allow_private=True, resolver=_resolver(["93.184.216.34"]))


def test_public_target_connects_to_the_checked_address() -> None:
    t = check_target(
        "https://hooks.example:8443/in?x=1",
        allow_private=False,
        resolver=_resolver(["93.184.216.34"]),
    )
    assert t.connect_url() == "https://93.184.216.34:8443/in?x=1"
    assert t.host_header() == "hooks.example:8443"
    v6 = Target("http://h.example/", "h.example", "2001:db8::1")
    assert v6.connect_url() == "http://[2001:db8::1]/"


def test_signature_round_trip() -> None:
    body = b'{"a":1}'
    header = sign("whsec_x", body, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify("whsec_x", body, header)
    assert not verify("whsec_y", body, header)
    assert not verify("whsec_x", body + b" ", header)
    assert not verify("whsec_x", body, "garbage")
