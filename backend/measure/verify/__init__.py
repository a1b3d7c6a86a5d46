"""``verify``: the deployment checks (checks), GPU readings (nvml) and the run against a live engine (run)."""
