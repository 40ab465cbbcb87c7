"""Listing ClusterPolicies for the status view right after the chart's hook created their CRD."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from gpu_operator.statusview import collect


def _answer(code: int) -> httpx2.HTTPStatusError:
    request = httpx2.Request("GET", "https://apiserver/apis/nvidia.com/v1/clusterpolicies")
    return httpx2.HTTPStatusError(str(code), request=request, response=httpx2.Response(code, request=request))


class Lists:
    """Answers `codes` in turn (an HTTP error each), then the policies."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = list(codes)
        self.calls = 0

    def list(self, resource: Any) -> list[dict[str, Any]]:
        self.calls += 1
        if self.codes:
            raise _answer(self.codes.pop(0))
        return [{"metadata": {"name": "cluster-policy"}}]


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpu_operator.statusview.collect.time.sleep", lambda _s: None)


def test_storage_initialising_is_asked_again() -> None:
    client = Lists([429, 429])
    assert collect.list_policies(client) == [{"metadata": {"name": "cluster-policy"}}]  # type: ignore[arg-type]
    assert client.calls == 3


def test_no_crd_is_no_policy_and_other_errors_stay_errors() -> None:
    assert collect.list_policies(Lists([404])) == []  # type: ignore[arg-type]
    with pytest.raises(httpx2.HTTPStatusError) as raised:
        collect.list_policies(Lists([403]))  # type: ignore[arg-type]
    assert raised.value.response.status_code == 403


def test_a_429_that_lasts_past_the_wait_is_raised() -> None:
    client = Lists([429] * 1000)
    with pytest.raises(httpx2.HTTPStatusError) as raised:
        collect.list_policies(client, wait=0.0)  # type: ignore[arg-type]
    assert (raised.value.response.status_code, client.calls) == (429, 1)
