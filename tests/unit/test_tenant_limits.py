"""The per-tenant concurrent-run limit: its setting, and which runs it admits."""

import pytest

from runbus.settings import SettingsError, load_settings
from runbus_gateway.service import GatewayService
from runbus_gateway.tenants import TenantLimits, admit


def test_overrides_name_tenants_and_the_rest_take_the_default() -> None:
    limits = TenantLimits.parse(3, "acme=1, globex=0")

    assert limits.of("acme") == 1
    assert limits.of("globex") == 0  # no limit for globex
    assert limits.of("initech") == 3
    assert limits.any


def test_no_limit_by_default() -> None:
    assert not TenantLimits.parse(0, "").any


@pytest.mark.parametrize("overrides", ["acme", "acme=", "=4", "acme=-1", "acme=four"])
def test_a_malformed_override_is_refused(overrides: str) -> None:
    with pytest.raises(ValueError, match="tenant=limit"):
        TenantLimits.parse(0, overrides)


def test_a_malformed_override_names_its_variable_at_start() -> None:
    settings = load_settings({"RUNBUS_TENANT_RUN_LIMITS": "acme=lots"})

    with pytest.raises(SettingsError, match="RUNBUS_TENANT_RUN_LIMITS"):
        GatewayService.from_settings(None, settings, None)  # type: ignore[arg-type]


def test_live_leases_fill_the_limit_and_expired_ones_do_not_count() -> None:
    leases = {"r1": 110.0, "r2": 90.0}

    assert admit(leases, "r3", limit=2, now=100.0)  # r2 expired
    assert not admit({**leases, "r2": 120.0}, "r3", limit=2, now=100.0)


def test_a_redelivered_run_keeps_its_slot_when_the_tenant_is_full() -> None:
    assert admit({"r1": 110.0, "r2": 120.0}, "r2", limit=2, now=100.0)
