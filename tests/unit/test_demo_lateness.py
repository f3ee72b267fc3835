"""The demo's allowed lateness covers a leader failover.

While the killed broker's partition has no leader, its records wait in the producer and the other
partitions move Spark's watermark on; records of the stalled partition that arrive after the
watermark passed their window are dropped as late, and the demo's check then (rightly) fails. Once
that happened in about one run in twenty: the job's 30-second default lateness was 5 s of wall-clock
time at the demo's rates, less than the ZooKeeper session timeout alone.
"""

from __future__ import annotations

import pytest

from odradek.demo import EVENT_RATE, allowed_lateness, main
from odradek.testing.cluster_files import development_defaults


def _wall_clock_seconds(lateness: str, rate: float) -> float:
    amount, unit = lateness.split()
    assert unit == "seconds"
    return int(amount) * EVENT_RATE / rate  # event seconds -> seconds of producing at `rate`


@pytest.mark.parametrize("rate", [50, 300, 1000, 2500])
def test_lateness_outlasts_the_session_timeout_and_an_election(rate: float) -> None:
    session_timeout_s = int(development_defaults(3)["zookeeper.session.timeout.ms"]) / 1000
    covered = _wall_clock_seconds(allowed_lateness(rate), rate)
    assert covered >= 5 * session_timeout_s  # the timeout, the election, a loaded machine


def test_lateness_grows_with_the_produce_rate() -> None:
    assert _wall_clock_seconds(allowed_lateness(300), 300) == pytest.approx(
        _wall_clock_seconds(allowed_lateness(3000), 3000), rel=0.01
    )


@pytest.mark.parametrize(
    "argv", [["--rate", "0"], ["--rate", "-5"], ["--events", "0"], ["--rate", "x"]]
)
def test_bad_rates_and_counts_are_refused_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)  # refused before anything starts
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error:" in last and argv[0] in last
