"""The MCP server: tool bodies (tools.py) and their transport (server.py)."""
