"""Building tracefleet's own images (`tracefleet images build`, `make images`): the names are in
tracefleet.contract.images, the Dockerfiles in the repository's images/ folder, the build in `build`."""
