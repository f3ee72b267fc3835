"""The mixed-fault soak (`./dev soak`; skipped unless ODRADEK_SOAK=1): ODRADEK_SOAK_FAULTS
(default 1,000) network, ZooKeeper and process faults on the namespaced cluster, in rounds of
100 on fresh topics, each round's history checked (`tests.faults.soak`). The JSON summary goes
to ODRADEK_SOAK_RESULTS (default `soak-faults.json` in the working directory), rewritten after
every round so that an interrupted soak still reports what it ran. A round that fails (an anomaly,
or a cluster that does not converge) is recorded with the cluster's logs copied beside the
summary, and the soak goes on with the next round; the test fails at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.lab import LabCluster, restart_stopped_brokers, run_scenario
from tests.faults.soak import FAULTS_PER_ROUND, SoakReport, keep_logs, mixed_faults
from tests.faults.test_partitions import lab  # noqa: F401  (the shared namespaced cluster)

SOAK = os.environ.get("ODRADEK_SOAK") == "1"
FAULTS = int(os.environ.get("ODRADEK_SOAK_FAULTS", "1000"))


@pytest.mark.soak
@pytest.mark.timeout(0)  # hours, not the suite's per-test limit
@pytest.mark.skipif(not SOAK, reason="the soak runs only with ODRADEK_SOAK=1 (./dev soak)")
def test_mixed_fault_soak(
    lab: LabCluster,  # noqa: F811
    fault_seed: int,
    fault_summary: list[str],
) -> None:
    results = Path(os.environ.get("ODRADEK_SOAK_RESULTS", "soak-faults.json"))
    report = SoakReport()
    remaining = FAULTS
    round_number = 0
    failures: list[str] = []
    while remaining > 0:
        count = min(FAULTS_PER_ROUND, remaining)
        seed = fault_seed + round_number
        row: dict[str, object] = {"round": round_number, "seed": seed, "faults": count}
        try:
            checks = run_scenario(
                lab, f"soak-{round_number}", mixed_faults(lab, report, count), seed, fault_summary
            )
        except Exception as e:  # an anomaly, or the harness giving up
            # The minimal re-run: this round alone, from its own seed.
            rerun = (
                f"ODRADEK_SOAK=1 ODRADEK_FAULT_SEED={seed} ODRADEK_SOAK_FAULTS={count} "
                ".venv/bin/python -m pytest tests/faults/test_soak_mixed.py"
            )
            kept = keep_logs(lab, results.parent / f"round-{round_number}-logs")
            row.update(
                acknowledged=0,
                anomalies=1,
                failure=f"{type(e).__name__}: {e}"[:2000],
                rerun=rerun,
                logs=str(kept),
            )
            report.rounds.append(row)
            report.write(results)
            failures.append(f"round {round_number} (seed {seed}): {e}"[:3000])
            # A broker that crashed is started again: the next round tests a whole cluster.
            lab.heal()
            try:
                restart_stopped_brokers(lab, wait_s=120)
            except Exception as restart_error:  # the next round then records what follows
                report.nemesis_errors.append(f"after round {round_number}: {restart_error}"[:300])
            # Jepsen-style: record it and go on, so that one finding does not hide the next;
            # the test fails at the end.
            remaining -= count
            round_number += 1
            continue
        line = fault_summary[-1]
        acknowledged = int(line.split(" sent, ")[1].split(" acknowledged")[0])
        row.update(
            acknowledged=acknowledged,
            anomalies=0,
            checks={c.name: c.checked for c in checks},
        )
        report.rounds.append(row)
        report.write(results)
        remaining -= count
        round_number += 1
    assert not failures, "\n\n".join(failures)
