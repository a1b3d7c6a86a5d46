"""``bench-startup``: start-up time and every request path's first request against later ones."""
