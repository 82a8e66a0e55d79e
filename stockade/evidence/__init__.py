"""`stockade evidence`: real malicious children attack the real sandbox, one row per attack.

Each row runs a small program from `attacks/` through the production path (compile, the
backend's check, `execute`) and is judged twice: by what the child observed, and by a host-side
check that nothing changed outside (files, servers, processes, mounts, terminal, liveness).
`rows.py` is the table, `runner.py` runs it, `report.py` renders it.
"""
