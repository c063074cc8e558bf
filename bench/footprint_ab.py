"""The operator's footprint (1,000 two-pod jobs, peak RSS) of this tree against an earlier commit,
run side by side: pairs of `gang_bench.py --parts footprint`, the order alternating (AB, BA, ...),
each run on a fresh cluster. The earlier commit's operator is a git worktree put first on
PYTHONPATH; the benchmark script itself is this tree's for both sides.

    python bench/footprint_ab.py --baseline 4c889a8 --pairs 5   # ~16 min; bench/results/footprint-ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from result_file import write_result  # beside this script

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "footprint-ab.json"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def footprint_run(out: Path, pythonpath: str | None) -> dict[str, Any]:
    env = {**os.environ}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    command = [
        sys.executable,
        str(REPO / "bench" / "gang_bench.py"),
        "--parts",
        "footprint",
        "--out",
        str(out),
    ]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    result: dict[str, Any] = json.loads(out.read_text())["footprint"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="the commit to compare against (A)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="phalanx-ab-") as scratch:
        worktree = Path(scratch) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        pairs = []
        try:
            for pair in range(1, args.pairs + 1):
                order = "AB" if pair % 2 else "BA"
                peaks: dict[str, dict[str, Any]] = {}
                for side in order:
                    log(f"pair {pair}/{args.pairs} ({order}): side {side}")
                    pythonpath = str(worktree / "operator") if side == "A" else None
                    peaks[side] = footprint_run(Path(scratch) / f"{side}-{pair}.json", pythonpath)
                    log(f"  peak RSS {peaks[side]['operator_peak_rss_mib']} MiB, all running in "
                        f"{peaks[side]['all_running_seconds']} s")  # fmt: skip
                a, b = peaks["A"]["operator_peak_rss_mib"], peaks["B"]["operator_peak_rss_mib"]
                pairs.append({"pair": pair, "order": order, "baseline_mib": a, "this_tree_mib": b,
                              "ratio": round(b / a, 3),
                              "all_running_seconds": [peaks["A"]["all_running_seconds"],
                                                      peaks["B"]["all_running_seconds"]]})  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)
    ratios = [p["ratio"] for p in pairs]
    result = write_result(args.out, {
        "what": "operator peak RSS with 1,000 two-pod jobs (gang_bench.py --parts footprint), this tree (B) "
                "against a baseline commit (A), pairs in alternating order, a fresh cluster per run",
        "baseline": args.baseline, "this_tree": head, "pairs": pairs,
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "baseline_median_mib": statistics.median(p["baseline_mib"] for p in pairs),
        "this_tree_median_mib": statistics.median(p["this_tree_mib"] for p in pairs),
        "command": f"python bench/footprint_ab.py --baseline {args.baseline} --pairs {args.pairs}",
    })  # fmt: skip
    print(f"{'pair':>4} {'order':>5} {'A MiB':>7} {'B MiB':>7} {'B/A':>6}")
    for p in pairs:
        print(
            f"{p['pair']:>4} {p['order']:>5} {p['baseline_mib']:>7} {p['this_tree_mib']:>7} {p['ratio']:>6}"
        )
    print(f"median B/A {result['ratio_median']} (min {result['ratio_min']}, max {result['ratio_max']}); "
          f"wrote {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
