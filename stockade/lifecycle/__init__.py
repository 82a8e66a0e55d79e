"""Lifecycle: the durable state that makes Stockade trustworthy over time, not just per launch.

`statedir` (where durable state lives), `ledger` (write-ahead records of durable launch
resources, crash reconciliation), `removers` (how each kind of resource is named and removed),
`facts` (what each observation of the readiness probe must be), `changes` (the change sets of
copy-on-write runs). A layer below `stockade.launch`, which it never imports
(tests/test_import_graph.py): the readiness probe and the enforcement report, which launch
through a backend, are stockade/launch/probe.py and report.py.
"""
