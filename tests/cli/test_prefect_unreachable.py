"""`imagebatch run` with `PREFECT_API_URL` naming a server that does not answer (nothing listens on its
port): one line naming the setting and the address, exit 2, nothing sent, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.prefect_server import base_environment, free_port
from helpers.runs import write_jsonl


def test_a_prefect_api_url_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "prompt": "a cat"}])
    api = f"http://127.0.0.1:{free_port()}/api"  # free a moment ago: nothing listens there
    env = {k: v for k, v in base_environment().items() if not k.startswith("IMAGEBATCH_")}
    env |= {"PREFECT_API_URL": api, "PREFECT_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Prefect's API at {api} (PREFECT_API_URL) does not answer ("), last
    assert last.endswith(
        "): start that server, or unset PREFECT_API_URL to run on a temporary one; nothing was sent."
    ), last
    assert not (tmp_path / "out" / "results.csv").exists()
