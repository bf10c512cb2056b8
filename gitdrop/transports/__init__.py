"""A hub across machines: the client of a hub at a git URL (remote), the SSH forced command (shell) and smart HTTP (httpd)."""
