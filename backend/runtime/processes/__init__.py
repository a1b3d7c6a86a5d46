"""Process hygiene: child process groups, their temporary directories, leftovers of killed starts, one start per run directory and port."""
