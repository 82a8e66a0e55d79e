"""Warm sandboxes: a guest agent inside a sandbox runs many commands for its host.

`protocol` (frames and messages, docs/protocol.md), `agent` and `child` (inside the sandbox;
`serving`, the checks and a command's books, is the Windows Sandbox guest's agent's too),
`boot`, `channel`, `exchange` and `sandbox` (the host's side), `aio` (the asyncio twin),
`daemon` and `client` (sessions owned by `stockade daemon` for other processes).
"""
