"""Test helpers: the services tests start (engine, page), a browser-like socket client, a stand-in for
pynvml, and the script that checks plans against vLLM's own config classes in the engine's environment."""
