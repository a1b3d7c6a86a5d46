"""Engine runtime: start vLLM from a plan, watch it, warm it up, measure it.

Kept import-light: ``backend.demo.checkpoint`` runs inside the engine's own virtual
environment, which has torch and transformers but not the app's packages.
"""
