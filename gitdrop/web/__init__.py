"""`gitdrop web`: the web board, a face of its own (Starlette and uvicorn, which
the MCP server already brings). app.py has the routes, pages.py the HTML,
charts.py the SVG pictures."""
