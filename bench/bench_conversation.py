"""What keeping each native answer's conversation costs (issue 24, `work.conversation`): its bytes on
disk, kept whole and as kept (images as references to their files), and the CPU time of keeping it and of
putting it back for an edit.

    uv run python bench/bench_conversation.py                  # 1K, 2K, 4K; 6 answers each
    uv run python bench/bench_conversation.py --sizes 1K --answers 20 --thought-image-rate 1

Each answer comes from the embedded emulator over HTTP (a 1 MB reference image in the user turn, as a
catalog's product photo), goes through the run's own code (`build_request`, `records.plan_files`,
`OutputStore.write_file`, `conversation.keeper`), and the kept file is compared with the same
conversation kept whole (`json.dumps` of the user turn and the model content as returned). The
emulator's images are flat placeholders, far smaller than the service's (a 1K PNG of the service is
about 1.5 MB): what is kept does not grow with the image, the whole form grows with it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

from imagebatch.emulator import EmulatorServer, EmulatorSettings
from imagebatch.gateway import GatewayClient
from imagebatch.manifest import load_manifest, plan
from imagebatch.work import conversation, records
from imagebatch.work.build import build_request
from imagebatch.work.store import OutputStore


def noise_png(side: int) -> bytes:
    """A PNG of random pixels (incompressible: about 3 bytes a pixel)."""
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, "PNG")
    return out.getvalue()


def measure(size: str, answers: int, thought_rate: float, tmp: Path) -> dict[str, float]:
    ref = tmp / "product.png"
    ref.write_bytes(noise_png(600))
    manifest = tmp / f"m-{size}.jsonl"
    rows = [
        {"id": f"{size}-{i}", "prompt": f"product {i}", "image_size": size, "reference_images": [ref.name]}
        for i in range(answers)
    ]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = OutputStore(tmp / f"out-{size}")
    store.backend.prepare()
    whole, kept, keep_s, inline_s = [], [], [], []
    settings = EmulatorSettings(api_key="bench", jpeg_rate=0.0, thought_image_rate=thought_rate)
    with EmulatorServer(settings) as server, GatewayClient(server.url, "bench") as client:
        for req in plan(load_manifest(manifest)):
            request = build_request(req)
            result = client.send(request, idempotency_key=req.idempotency_key)
            record, files = records.plan_files(req, result, chain=False)
            for name, data in files:
                store.write_file(name, data)
            sent = request.json["contents"][-1] if request.json else {}
            started = time.perf_counter()
            conversation.keeper(store, req, conversation.History(), sent)(result, record)
            keep_s.append(time.perf_counter() - started)
            whole.append(len(json.dumps([sent, result.model_content]).encode()))  # type: ignore[union-attr]
            kept.append(len(json.dumps(store.load_conversation(req), separators=(",", ":"))))
            started = time.perf_counter()
            conversation.kept(store, req).sent(store, req)
            inline_s.append(time.perf_counter() - started)
    return {
        "whole": statistics.median(whole),
        "kept": statistics.median(kept),
        "keep_ms": statistics.median(keep_s) * 1000,
        "inline_ms": statistics.median(inline_s) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1K", "2K", "4K"])
    parser.add_argument("--answers", type=int, default=6)
    parser.add_argument("--thought-image-rate", type=float, default=0.3)
    args = parser.parse_args()
    print("| size | kept whole (median) | kept as references | keeping it | putting it back |")
    print("|-|-|-|-|-|")
    with tempfile.TemporaryDirectory(prefix="bench-conversation-") as tmp:
        for size in args.sizes:
            m = measure(size, args.answers, args.thought_image_rate, Path(tmp))
            print(
                f"| {size} | {m['whole'] / 1024:,.0f} KiB | {m['kept'] / 1024:,.1f} KiB | "
                f"{m['keep_ms']:.1f} ms | {m['inline_ms']:.1f} ms |"
            )


if __name__ == "__main__":
    main()
