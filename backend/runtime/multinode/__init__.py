"""Several nodes: the head's join point, a worker node's side, and what each node must agree on."""
