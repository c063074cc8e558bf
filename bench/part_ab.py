"""One part of `gang_bench.py` (footprint or contention) for this tree against an earlier commit,
run side by side: pairs of `gang_bench.py --parts <part>`, the order alternating (AB, BA, ...),
each run on a fresh cluster. Only the operator differs: side A's runs from a git worktree of the
earlier commit (gang_bench's OPERATOR_PATH_ENV), the cluster, its kwok stages and the benchmark
script are this tree's for both sides.

    python bench/part_ab.py --part footprint --baseline 4c889a8 --pairs 5    # ~16 min
    python bench/part_ab.py --part contention --baseline 1fa5b03 --pairs 5   # ~13 min
Results: bench/results/<part>-ab.json.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gang_bench import OPERATOR_PATH_ENV  # beside this script
from result_file import write_result

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Part:
    metric: str  # the key of gang_bench's part result compared
    unit: str
    what: str
    also: tuple[str, ...]  # keys shown beside it, per run
    arguments: tuple[str, ...] = ()  # gang_bench's, besides --parts


PARTS = {
    "footprint": Part("operator_peak_rss_mib", "MiB", "operator peak RSS with 1,000 two-pod jobs",
                      ("all_running_seconds",)),
    "contention": Part("gpu_utilization", "", "GPU utilization while gangs asking twice the pool's GPUs wait",
                       ("zero_latency_gpu_utilization", "latency"),
                       # its own pool: the main pool's 500 nodes would only slow the start
                       ("--nodes", "8", "--stated-run-times-only")),
}  # fmt: skip


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def part_run(part: str, out: Path, operator_path: str | None) -> dict[str, Any]:
    """gang_bench.py --parts `part` on a fresh cluster; its result for that part."""
    env = {**os.environ}
    if operator_path:
        env[OPERATOR_PATH_ENV] = operator_path
    command = [sys.executable, str(REPO / "bench" / "gang_bench.py"), "--parts", part, *PARTS[part].arguments,
               "--out", str(out)]  # fmt: skip
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    result: dict[str, Any] = json.loads(out.read_text())[part]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=sorted(PARTS), required=True)
    parser.add_argument("--baseline", required=True, help="the commit to compare against (A)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, help="default: bench/results/<part>-ab.json")
    args = parser.parse_args()
    part = PARTS[args.part]
    out: Path = args.out or REPO / "bench" / "results" / f"{args.part}-ab.json"
    # "-dirty" when the tree has changes not committed: side B ran those, not HEAD.
    head = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="phalanx-ab-") as scratch:
        worktree = Path(scratch) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        pairs = []
        try:
            for pair in range(1, args.pairs + 1):
                order = "AB" if pair % 2 else "BA"
                runs: dict[str, dict[str, Any]] = {}
                for side in order:
                    log(f"pair {pair}/{args.pairs} ({order}): side {side}")
                    operator_path = str(worktree / "operator") if side == "A" else None
                    runs[side] = part_run(args.part, Path(scratch) / f"{side}-{pair}.json", operator_path)
                    log(f"  {part.metric} {runs[side][part.metric]} {part.unit}".rstrip())
                a, b = runs["A"][part.metric], runs["B"][part.metric]
                pairs.append({"pair": pair, "order": order, "baseline": a, "this_tree": b,
                              "ratio": round(b / a, 3),
                              **{key: [runs["A"].get(key), runs["B"].get(key)] for key in part.also}})  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)
    ratios = [p["ratio"] for p in pairs]
    result = write_result(out, {
        "what": f"{part.what} (gang_bench.py --parts {args.part}), this tree (B) against a baseline commit (A), "
                "pairs in alternating order, a fresh cluster per run; [A, B] beside each pair",
        "metric": part.metric, "unit": part.unit,
        "baseline": args.baseline, "this_tree": head, "pairs": pairs,
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "baseline_median": statistics.median(p["baseline"] for p in pairs),
        "this_tree_median": statistics.median(p["this_tree"] for p in pairs),
        "command": f"python bench/part_ab.py --part {args.part} --baseline {args.baseline} --pairs {args.pairs}",
    })  # fmt: skip
    print(f"{part.metric} ({part.unit or 'ratio'}), A = {args.baseline}, B = {head}")
    print(f"{'pair':>4} {'order':>5} {'A':>9} {'B':>9} {'B/A':>6}")
    for p in pairs:
        print(f"{p['pair']:>4} {p['order']:>5} {p['baseline']:>9} {p['this_tree']:>9} {p['ratio']:>6}")
    print(f"median B/A {result['ratio_median']} (min {result['ratio_min']}, max {result['ratio_max']}); "
          f"wrote {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
