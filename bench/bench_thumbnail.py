"""The memory a report thumbnail costs, by image size (issue 21): each image is thumbnailed in a fresh
process, and the process's peak RSS (ru_maxrss) is read before and after, so the delta is what decoding
that one image cost.

    uv run python bench/bench_thumbnail.py            # 1024, 4096, 4896 and 13000 px RGBA PNGs

The PNGs are transparent black RGBA (tests/helpers/images.py `blank_png`): the 13000 x 13000 one is the
660 KB file of issue 21 whose pixels take 676 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.images import blank_png

CHILD = """
import json, resource, sys, time
from pathlib import Path
from imagebatch.work import thumbnails
source, out = Path(sys.argv[1]), Path(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    result = thumbnails.ensure_thumbnail(out, source, source.stem)
except Exception as exc:
    result = f"{type(exc).__name__}: {exc}"
seconds = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before": before, "after": after, "seconds": seconds, "result": result}))
"""


def measure(source: Path, out: Path) -> dict[str, object]:
    """Thumbnail `source` in a new process; its peak RSS before and after (KiB), time and result."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(source), str(out)], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[1024, 4096, 4896, 13000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-thumbnail-") as tmp:
        print("| image | file | peak RSS before | after | delta | time | result |")
        print("|-|-|-|-|-|-|-|")
        for side in args.sides:
            source = Path(tmp) / f"rgba-{side}.png"
            source.write_bytes(blank_png(side, side))
            m = measure(source, Path(tmp) / "out")
            before, after = int(str(m["before"])) // 1024, int(str(m["after"])) // 1024
            size = source.stat().st_size // 1024
            print(
                f"| {side} x {side} RGBA PNG | {size} KiB | {before} MiB | {after} MiB | {after - before} MiB"
                f" | {float(str(m['seconds'])):.2f} s | {m['result']} |"
            )


if __name__ == "__main__":
    main()
