"""Building tracefleet's own images (`tracefleet images build`, `make images`): the names are in
tracefleet.contract.images, the Dockerfiles beside this module (`images/tracefleet/`, `images/harness/`), the build in `build`."""
