"""How many of imagebatch's own calls lie between the flow and the HTTP send: a one-row run on the
session's emulator, its request captured by a transport that reads the stack as the request leaves.

A unit's send crosses threads (the flow's dispatcher starts a Prefect task run, which hands the unit to
a request thread), so each thread pool's `submit` here records the stack of the thread that submits, and
the thread that runs the work starts from it: the chain is the submitters' frames, then the worker's.
Only imagebatch's frames are counted, from the flow function down to the gateway client's `send`."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.runs import run_flow, write_jsonl

import imagebatch
from imagebatch.run.hooks import RunHooks, run_hooks

PACKAGE = str(Path(imagebatch.__file__).parent)
MOST_CALLS = 8

Chain = list[list[traceback.FrameSummary]]
_inherited = threading.local()


def _ours(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    return [f for f in frames if f.filename.startswith(PACKAGE)]


def _chain_here() -> Chain:
    """The submitters' stacks that led to this thread, then this thread's own."""
    return [*getattr(_inherited, "chain", []), traceback.extract_stack()[:-1]]


@pytest.fixture
def traced_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every thread pool's work starts with the chain of the thread that submitted it."""
    submit = ThreadPoolExecutor.submit

    def traced(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        chain = _chain_here()

        def run(*a: Any, **kw: Any) -> Any:
            before = getattr(_inherited, "chain", None)
            _inherited.chain = chain
            try:
                return fn(*a, **kw)
            finally:
                _inherited.chain = before

        return submit(self, run, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", traced)


def call_path(chain: Chain) -> list[str]:
    """imagebatch's calls from `generate_from_manifest` down to `GatewayClient.send`, thread by thread."""
    names: list[str] = []
    for thread, frames in enumerate(chain):
        names += [f"[{thread}] {Path(f.filename).relative_to(PACKAGE)}:{f.name}" for f in _ours(frames)]
    start = next(i for i, n in enumerate(names) if n.endswith(":generate_from_manifest"))
    end = next(i for i, n in enumerate(names) if n.endswith("gateway/client.py:send"))
    return names[start : end + 1]


def test_the_flow_reaches_the_http_send_in_few_calls(
    service_env: Any, tmp_path: Path, out: Path, traced_submit: None
) -> None:
    chains: list[Chain] = []

    with httpx.Client(base_url=service_env.url) as upstream:

        def forward(request: httpx.Request) -> httpx.Response:
            chains.append(_chain_here())
            answer = upstream.send(
                upstream.build_request(
                    request.method, request.url.path, headers=request.headers, content=request.content
                )
            )
            return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

        manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "j0", "route": "images", "prompt": "a vase"}])
        with run_hooks(RunHooks(sleep=lambda _s: None, transport=httpx.MockTransport(forward))):
            info = run_flow(str(manifest), str(out))

    assert info["counts"]["succeeded"] == 1, info
    assert len(chains) == 1
    path = call_path(chains[0])
    threads = len({name.split("]")[0] for name in path})
    shown = "\n".join(path)
    assert len(path) <= MOST_CALLS, f"{len(path)} calls over {threads} threads:\n{shown}"
