"""Test ports for servers that take a run of them (a routed ``serve`` on P: router P, engines P + 1 ..,
router metrics after them): the product's own, drawn below the kernel's ephemeral range."""

from backend.runtime.processes.process import free_port, free_run

__all__ = ["free_port", "free_run"]
