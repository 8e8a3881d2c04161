"""run.trust's decisions, without Prefect: what a deployment's run may ask beyond its deployment, and
where its worker's allow-lists let it write and send. The same attacks on a real server and worker are in
tests/platform/test_run_trust.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebatch.options import RunOptions, ShardRole
from imagebatch.run.trust import (
    ENV_ALLOWED_BASE_URLS,
    ENV_ALLOWED_OUT,
    Asked,
    Parent,
    Policy,
    Refused,
    policy_from_environment,
    refusal,
    run_only_fields,
)

NAME = "generate_from_manifest/nightly"
SERVICE = "https://images.example.com"


def made(out: str = "/data/out", **flat: object) -> Asked:
    return Asked(out, RunOptions.from_flat(base_url=SERVICE, **flat), ShardRole())


def asked(stored: Asked, out: str | None = None, role: ShardRole | None = None, **flat: object) -> Asked:
    return Asked(out or stored.out, stored.options.with_flat(**flat), role or stored.role)


def test_the_options_only_a_terminal_decides_are_force_and_retry_unknown() -> None:
    assert set(run_only_fields()) == {"force", "retry_unknown"}


@pytest.mark.parametrize("name", ["force", "retry_unknown"])
def test_a_run_may_not_resend_what_its_deployment_was_not_made_to(name: str) -> None:
    stored = made()
    why = refusal(asked(stored, **{name: True}), stored, NAME, Policy())
    assert why == (
        f"options {name}=true but deployment {NAME} was made with {name}=false: it resends what may "
        "already be paid for, which only `imagebatch run` on a terminal decides"
    )
    assert refusal(asked(made(**{name: True}), **{name: True}), made(**{name: True}), NAME, Policy()) is None


def test_other_options_may_change_at_run_time() -> None:
    stored = made()
    assert refusal(asked(stored, concurrency=16, max_images=3, redo="failed"), stored, NAME, Policy()) is None


def test_a_hand_set_role_is_refused_unless_its_running_parent_started_it() -> None:
    stored, shards = made(), made(shards=2)
    shard = ShardRole(shard=0)
    assert "never by hand" in str(refusal(asked(stored, role=shard), stored, NAME, Policy()))
    by_hand = ShardRole(shard_deployment="generate_from_manifest/elsewhere")
    assert "never by hand" in str(refusal(asked(stored, role=by_hand), stored, NAME, Policy()))
    parent_role = ShardRole(shard_deployment=NAME)
    parent = Parent(Asked(shards.out, shards.options, parent_role), "RUNNING")
    assert refusal(asked(shards, role=shard), shards, NAME, Policy(), parent) is None
    other = Parent(Asked(shards.out, shards.options, ShardRole(shard_deployment="x/y")), "RUNNING")
    assert "never by hand" in str(refusal(asked(shards, role=shard), shards, NAME, Policy(), other))
    ended = Parent(parent.asked, "COMPLETED")
    why = refusal(asked(shards, role=shard), shards, NAME, Policy(), ended)
    assert why == "role shard 0: the sharded run that started it is COMPLETED, not running"
    far = asked(shards, role=ShardRole(shard=2))
    assert (
        refusal(far, shards, NAME, Policy(), parent)
        == "role shard 2 is not one of its sharded run's 2 shards"
    )


def test_without_a_worker_list_a_run_writes_only_to_its_deployments_out(tmp_path: Path) -> None:
    stored = made(str(tmp_path / "out"))
    assert refusal(asked(stored, str(tmp_path / "x" / ".." / "out")), stored, NAME, Policy()) is None
    why = refusal(asked(stored, "/etc/imagebatch-probe"), stored, NAME, Policy())
    assert why == (
        f"out /etc/imagebatch-probe is not the output of its deployment ({tmp_path / 'out'}); a "
        f"deployment's run writes elsewhere only inside its worker's {ENV_ALLOWED_OUT}"
    )


def test_the_workers_roots_resolve_dot_dot_and_symlinks(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    policy = Policy(out_roots=(str(root),))
    stored = made(str(root / "nightly"))
    assert refusal(asked(stored, str(root / "other" / "new")), stored, NAME, policy) is None
    for escape in (root / ".." / "outside", root / "link" / "x", Path("/etc/imagebatch-probe")):
        why = refusal(asked(stored, str(escape)), stored, NAME, policy)
        assert why == f"out {escape} is outside this worker's output roots ({ENV_ALLOWED_OUT}={root})"
    assert refusal(asked(stored, f"{root}x"), stored, NAME, policy) is not None  # a sibling, not inside


def test_the_workers_roots_may_be_object_store_prefixes() -> None:
    policy = Policy(out_roots=("s3://bucket/team",))
    stored = made("s3://bucket/team/nightly")
    assert refusal(asked(stored, "s3://bucket/team/other/"), stored, NAME, policy) is None
    for escape in ("s3://bucket/teamx", "s3://other/team", "s3://bucket/team/../x", "/data/team"):
        assert refusal(asked(stored, escape), stored, NAME, policy) is not None, escape


def test_without_a_worker_list_the_key_goes_only_to_the_deployments_service() -> None:
    stored = made()
    assert refusal(asked(stored, base_url=SERVICE + "/"), stored, NAME, Policy()) is None
    why = refusal(asked(stored, base_url="http://127.0.0.1:9"), stored, NAME, Policy())
    assert why == (
        f"base_url http://127.0.0.1:9 is not the service of its deployment ({SERVICE}): this worker's API "
        f"key goes elsewhere only to its {ENV_ALLOWED_BASE_URLS}"
    )
    assert refusal(asked(stored, base_url="embedded"), stored, NAME, Policy()) is not None


def test_the_workers_services_bound_every_run_and_its_own_address() -> None:
    policy = Policy(base_urls=(SERVICE, "embedded"))
    stored = made()
    assert refusal(asked(stored, base_url="HTTPS://Images.Example.com/"), stored, NAME, policy) is None
    assert refusal(asked(stored, base_url="embedded"), stored, NAME, policy) is None
    why = refusal(asked(stored, base_url="http://127.0.0.1:9"), stored, NAME, policy)
    assert why == (
        f"base_url http://127.0.0.1:9 is not one of this worker's services ({ENV_ALLOWED_BASE_URLS}="
        f"{SERVICE},embedded)"
    )
    unset = asked(stored, base_url=None)  # the worker's own IMAGEBATCH_BASE_URL is checked too
    assert refusal(unset, stored, NAME, policy, worker_url="http://elsewhere:1") is not None
    assert refusal(unset, stored, NAME, policy, worker_url=SERVICE) is None


def test_the_workers_lists_come_from_its_environment() -> None:
    env = {ENV_ALLOWED_OUT: " /data/a , s3://b/p ", ENV_ALLOWED_BASE_URLS: f"{SERVICE},embedded"}
    assert policy_from_environment(env) == Policy(("/data/a", "s3://b/p"), (SERVICE, "embedded"))
    assert policy_from_environment({ENV_ALLOWED_OUT: " "}) == Policy()
    with pytest.raises(Refused, match=f"this worker's {ENV_ALLOWED_OUT}: 'relative/dir': not an absolute"):
        policy_from_environment({ENV_ALLOWED_OUT: "relative/dir"})
    with pytest.raises(Refused, match=f"{ENV_ALLOWED_BASE_URLS}: 'ftp://x': base URL must be an http"):
        policy_from_environment({ENV_ALLOWED_BASE_URLS: "ftp://x"})


@pytest.mark.parametrize(
    ("flag", "entry", "why"),
    [
        ("--allow-out", "relative/dir", "not an absolute folder nor an object store prefix"),
        ("--allow-out", "/a,/b", "one entry per flag, without a comma"),
        ("--allow-base-url", "ftp://x", "base URL must be an http(s) address"),
    ],
)
def test_imagebatch_worker_refuses_a_bad_entry_before_it_starts(
    flag: str, entry: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from imagebatch.cli.main import main

    assert main(["worker", "--pool", "p", flag, entry]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"imagebatch worker: {flag} {entry!r}: {why}") and err.count("\n") == 1, err
