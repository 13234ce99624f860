"""Shared fixtures: each real part the tests run against has its own module under tests/fixtures/."""

pytest_plugins = [
    "fixtures.controlplane",
    "fixtures.s3",
    "fixtures.engines",
    "fixtures.harnesses",
    "fixtures.vllm",
    "fixtures.drivers",
    "fixtures.containers",
    "fixtures.node",
    "fixtures.node_jobs",
]
