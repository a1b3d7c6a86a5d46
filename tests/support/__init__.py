"""Test helpers: the services tests start (engine, page) and a browser-like socket client."""
