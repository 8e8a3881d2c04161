"""The account-wide limit (issue 11, item 3): `imagebatch limits` creates Prefect global concurrency limits,
and a run that names one holds a slot of it for each request on the wire, so the service never sees more
requests at once than the limit, whatever the run's own --concurrency."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from flow_helpers import cli, peak_in_flight

from imagebatch.flows.batch import RunHooks, UsageError, generate_from_manifest, run_hooks
from imagebatch.flows.limits import rate_limit_name


def read_limit(name: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None


def catalog(path: Path, rows: int) -> Path:
    path.write_text("id,prompt\n" + "".join(f"p{i},photo {i}\n" for i in range(rows)))
    return path


def run(manifest: Path, out: Path, **kw: Any) -> dict[str, Any]:
    with run_hooks(RunHooks(sleep=lambda _s: None)):
        return generate_from_manifest(manifest=str(manifest), out=str(out), adaptive=False, **kw)


def test_limits_creates_updates_and_removes_the_limits(capsys: Any) -> None:
    code, out, _ = cli(capsys, "limits", "--name", "t-create", "--concurrency", "3", "--per-minute", "120")
    assert code == 0 and "t-create: 3 requests on the wire at once" in out and "120 a minute" in out
    assert read_limit("t-create").limit == 3
    rate = read_limit(rate_limit_name("t-create"))
    assert rate.limit == 120 and rate.slot_decay_per_second == pytest.approx(2.0)
    code, _, _ = cli(capsys, "limits", "--name", "t-create", "--concurrency", "5", "--per-minute", "0")
    assert code == 0 and read_limit("t-create").limit == 5 and read_limit(rate_limit_name("t-create")) is None


def test_a_global_limit_bounds_requests_on_the_wire_below_the_runs_concurrency(
    service_env: Any, tmp_path: Path, capsys: Any
) -> None:
    assert cli(capsys, "limits", "--name", "t-wire", "--concurrency", "2")[0] == 0
    service_env.configure(latency=0.05)
    manifest = catalog(tmp_path / "m.csv", 24)
    info = run(manifest, tmp_path / "limited", concurrency=8, global_limit="t-wire")
    assert info["counts"]["succeeded"] == 24 and info["options"]["global_limit"] == "t-wire"
    assert peak_in_flight(service_env.requests()) <= 2
    assert set(Counter(r["idempotency_key"] for r in service_env.requests()).values()) == {1}
    assert read_limit("t-wire").active_slots == 0  # every slot given back

    service_env.reset()
    service_env.configure(latency=0.05, jpeg_rate=0.0)
    run(manifest, tmp_path / "unlimited", concurrency=8)
    assert peak_in_flight(service_env.requests()) > 2  # the same run without it: the limit did the bounding


def test_a_limit_the_server_does_not_have_is_refused_before_anything_is_sent(
    service_env: Any, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match=r"no global concurrency limit 't-missing'.*imagebatch limits"):
        run(catalog(tmp_path / "m.csv", 2), tmp_path / "out", global_limit="t-missing")
    assert service_env.requests() == []
