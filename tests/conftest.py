"""Shared pytest configuration: fixtures live in tests/fixtures/ as plugins."""

pytest_plugins = [
    "tests.fixtures.zookeeper",
    "tests.fixtures.cluster",
    "tests.fixtures.secure",
]
