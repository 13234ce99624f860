module tracefleet.io/hack/node/pause

go 1.25.0
