"""Process hygiene: child process groups and their temporary directories, what a killed start left
running, one start per run directory and port."""
