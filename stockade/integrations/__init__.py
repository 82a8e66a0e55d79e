"""Stockade where agents are built: a Workspace (workspace.py) that every adapter wraps, the MCP
server (mcp.py) and one module per agent framework. Each framework module imports its framework,
installed with its extra (`pip install stockade[pydantic-ai]`, ...); nothing here is imported by
the rest of Stockade."""
