"""What a run starts and watches: vLLM engines (their logs and CLI), the router, the MPS daemon."""
