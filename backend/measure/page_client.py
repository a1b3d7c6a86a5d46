"""Where ``backend.runtime.up`` still finds the page client; it lives in ``backend.page_client``."""

from backend.page_client import PageSession, loopback_sources

__all__ = ["PageSession", "loopback_sources"]
