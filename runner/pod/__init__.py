"""The programs of the pods the operator creates, together: the harness pod's entry (`tracefleet run
--in-pod`, .harness), the evaluator Job (.evaluate) and the sealer Job (.seal), run as
`python -m tracefleet.runner.pod seal|evaluate` (tracefleet.operator.names.POD_PROGRAMS). They run one
session's lifecycle with the same functions as local mode (tracefleet.runner.session / tracing).
"""
