"""Runs engines: process groups, serve (launch, health, priority, warm-up), status and its run
directory, up, clusters, model resolution, the demo model."""
