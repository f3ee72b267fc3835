"""Shared pytest configuration: fixtures live in tests/fixtures/ as plugins."""

from hypothesis import HealthCheck, settings

pytest_plugins = [
    "tests.fixtures.zookeeper",
    "tests.fixtures.cluster",
    "tests.fixtures.secure",
]

# The suite runs on loaded 2-core machines (brokers, ZooKeeper and JVMs of other tests beside
# it): how long an example takes to generate or run says nothing about the code under test, so
# neither Hypothesis's per-example deadline nor its "input generation is slow" health check may
# fail a test. Each test's own @settings still sets its number of examples.
settings.register_profile(
    "loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("loaded-machine")
