"""The programs of the pods the operator creates, together: the harness pod's entry (`tracefleet run
--in-pod`, .harness), the evaluator Job (.evaluate) and the sealer Job (.seal), run as
`python -m tracefleet.runner.pod seal|evaluate` (tracefleet.operator.names.POD_PROGRAMS). They are thin
adapters of the one session program (tracefleet.runner.session: the harness pod is its place `PodPlace`,
the evaluator Job runs its judging, the sealer its outcome and traces), reading what the pods uploaded
through the contract's models (tracefleet.contract.session) in .evidence.
"""
