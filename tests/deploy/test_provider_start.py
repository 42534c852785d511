"""In a deployed Muster (``muster run``) providers come from the registry when a pool first
needs them; they must be started then, or the fake provider never heartbeats its nodes and a
real node lifecycle controller marks them NotReady."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.acquire.providers import ProviderSet
from providers import registry
from providers.registry import ProviderContext


class _Recorder:
    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def start(self) -> None:
        self.started.set()


async def test_a_provider_created_while_running_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[_Recorder] = []

    def factory(_: ProviderContext) -> Any:
        made.append(_Recorder())
        return made[-1]

    monkeypatch.setitem(registry._FACTORIES, "test-start-recorder", factory)
    providers = ProviderSet(ProviderContext(kube=None))  # type: ignore[arg-type]
    providers.get("test-start-recorder")
    await asyncio.sleep(0)
    assert not made[0].started.is_set(), "before start-up the controller starts them itself"

    providers = ProviderSet(ProviderContext(kube=None))  # type: ignore[arg-type]
    providers.running = True
    provider = providers.get("test-start-recorder")
    assert providers.get("test-start-recorder") is provider, "created once"
    await asyncio.wait_for(made[-1].started.wait(), timeout=2)
    assert len(made) == 2
