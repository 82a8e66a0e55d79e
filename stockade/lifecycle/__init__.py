"""Lifecycle: what makes Stockade trustworthy over time, not just per launch.

`statedir` (where durable state lives), `ledger` (write-ahead records of durable launch
resources, crash reconciliation), `removers` (how each kind of resource is named and removed),
`probe` (the readiness probe and its attestation; `probe_child` runs inside its sandbox,
`facts` says what each observation must be), `report` (the enforcement report, computed from
the probe).
"""
