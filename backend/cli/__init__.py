"""Command line: one command table (``main.COMMANDS``); each command a small module that parses
its flags and calls the library."""
