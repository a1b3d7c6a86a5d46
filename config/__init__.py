"""Hardware-aware configuration: settings, hardware, model shape and the launch planner.

Data flows one way: hardware + model + workload -> plan (``config.planner``) -> engine.
Modules here import nothing heavier than pydantic, so they load in either environment.
"""
