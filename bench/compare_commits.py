"""One bench, two source trees, alternating rounds in one run: is the new tree slower than the old?

Each tree is a checkout with its own virtual env (`./dev setup` in it), e.g. a second worktree of
an older commit:

    git worktree add --detach ../base <commit> && (cd ../base && ./dev setup)
    .venv/bin/python bench/compare_commits.py --old ../base --new . --bench throughput \\
        --rounds 5 -- --records 200000 --sizes 100,1024

Every round runs `<tree>/.venv/bin/python <tree>/bench/<bench>.py ARGS` once for each tree, the
order swapping each round (old, new; new, old; ...) so that both see the same machine load on
average. Each tree runs its own copy of the bench (its imports, its local-cluster harness); the
bench must exist in both with the same arguments. The bench's JSON lines are matched by position
(and labelled by `record_bytes`, `acks` or `brokers` where they have them); every numeric field
that varies between runs is reported with each tree's runs, their medians and the ratio
new/old of the medians. For throughput (`*_per_s`) a ratio below 1 means the new tree is slower;
for durations and latencies (`seconds`, `*_ms`, `p50`, ...) above 1 does. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LABEL_FIELDS = ("record_bytes", "acks", "brokers", "replication_factor")


def git_commit(tree: Path) -> str:
    result = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.stdout.strip() or "?"


def run_bench(tree: Path, bench: str, args: list[str], timeout: float) -> list[dict[str, Any]]:
    """Run the bench of `tree` once; its JSON lines (a failed run raises with its output)."""
    python = tree / ".venv" / "bin" / "python"
    script = tree / "bench" / f"{bench}.py"
    for path in (python, script):
        if not path.exists():
            raise SystemExit(f"compare_commits: {path} does not exist (./dev setup in {tree}?)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(python), str(script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise SystemExit(
            f"compare_commits: {script} exited {result.returncode}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    lines = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            lines.append(json.loads(line))
    if not lines:
        raise SystemExit(f"compare_commits: {script} printed no JSON\n{result.stderr[-4000:]}")
    return lines


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value by dotted path (booleans are not numbers here)."""
    if isinstance(value, dict):
        out: dict[str, float] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {prefix: float(value)}
    return {}


def label(index: int, line: dict[str, Any]) -> str:
    parts = [f"{field}={line[field]}" for field in LABEL_FIELDS if field in line]
    return f"{index}:" + ",".join(parts) if parts else str(index)


def metrics_of(run: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for index, line in enumerate(run):
        for key, value in flatten(line).items():
            out[f"{label(index, line)} {key}"] = value
    return out


def compare(old_runs: list[dict[str, float]], new_runs: list[dict[str, float]]) -> dict[str, Any]:
    keys = [k for k in old_runs[0] if all(k in run for run in old_runs + new_runs)]
    result: dict[str, Any] = {}
    for key in keys:
        old = [run[key] for run in old_runs]
        new = [run[key] for run in new_runs]
        if len(set(old + new)) == 1:
            continue  # a setting (records, partitions), not a measurement
        old_median, new_median = statistics.median(old), statistics.median(new)
        result[key] = {
            "old": [round(v, 3) for v in old],
            "new": [round(v, 3) for v in new],
            "old_median": round(old_median, 3),
            "new_median": round(new_median, 3),
            "ratio_new_old": round(new_median / old_median, 3) if old_median else None,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="the older source tree")
    parser.add_argument("--new", type=Path, default=Path("."), help="the newer tree (default .)")
    parser.add_argument("--bench", default="throughput", help="bench/<name>.py in both trees")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each tree")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one run")
    parser.add_argument("args", nargs="*", help="arguments for the bench (after --)")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    started = time.monotonic()
    for round_index in range(args.rounds):
        order = ("old", "new") if round_index % 2 == 0 else ("new", "old")
        for which in order:
            lines = run_bench(trees[which], args.bench, args.args, args.timeout)
            runs[which].append(metrics_of(lines))
            print(
                f"compare_commits: round {round_index + 1}/{args.rounds} {which} done",
                file=sys.stderr,
                flush=True,
            )
    print(
        json.dumps(
            {
                "bench": "compare_commits",
                "compared_bench": args.bench,
                "bench_args": args.args,
                "rounds": args.rounds,
                "old": {"tree": str(trees["old"]), "commit": git_commit(trees["old"])},
                "new": {"tree": str(trees["new"]), "commit": git_commit(trees["new"])},
                "load_average": os.getloadavg(),
                "seconds": round(time.monotonic() - started, 1),
                "metrics": compare(runs["old"], runs["new"]),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
