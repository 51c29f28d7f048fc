from __future__ import annotations

from gpuyard.api.state import PrincipalCache
from gpuyard.services.tenancy.auth import Principal, Scope

P = Principal(key_id=1, user_id=1, account_id=1, scope=Scope.WRITE, default_project_id=1)


def test_fresh_hit_then_single_refresh_of_a_stale_entry() -> None:
    cache = PrincipalCache(ttl_s=60)
    assert cache.lookup("h") is None  # unknown: the caller reads the key
    cache.put("h", P)
    assert cache.lookup("h") == P
    cache.ttl_s = -1
    cache.put("h", P)  # already stale
    assert cache.lookup("h") is None  # the first caller refreshes...
    assert cache.lookup("h") == P  # ...the others keep the old entry meanwhile
    cache.put("h", P)
    assert cache.lookup("h") is None  # stale again: a new refresh is owed


def test_a_failed_refresh_forgets_the_key() -> None:
    cache = PrincipalCache(ttl_s=-1)
    cache.put("h", P)
    assert cache.lookup("h") is None
    cache.put("h", None)  # the key was revoked
    assert cache.lookup("h") is None
    assert cache.lookup("h") is None  # nobody is served the revoked principal
