"""Harbor task folders (the format Terminal-Bench 2, SWE-style datasets and the RL frameworks that read Harbor
ship tasks in): `folders` loads and checks one folder, `sources` finds the folders a job names (a directory, a
tarball or an s3:// prefix). The models and names are on the contract floor (tracefleet.contract.harbor); the
container side (images, the verifier) is tracefleet.runner.containers."""
