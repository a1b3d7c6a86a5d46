"""Measures: prompts, statistics, load generation, the page client, plots, bench, start-up bench, verify and tune."""
