"""What the planner needs to know about a model, read from its ``config.json`` alone.

Planning must work before any weights are downloaded, so everything here (layer count,
heads, experts, dtype, parameter count, KV bytes per token) is derived from the shape in
``config.json``: a local directory, a path to the file, or a Hugging Face id read through
the local cache (``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``).

- ``spec``: ``ModelSpec``, the shape and its byte counts (weights, KV per token, parameters).
- ``config_json``: a parsed config.json -> ``ModelSpec`` (``model_from_config``).
- ``reading``: find and read the file (``read_model``); ``hub``: the Hugging Face cache and hub.
"""

from config.errors import ModelReadError
from config.model.config_json import model_from_config
from config.model.hub import hub_reachable
from config.model.reading import read_model
from config.model.spec import Dtype, ModelSpec

__all__ = ["Dtype", "ModelReadError", "ModelSpec", "hub_reachable", "model_from_config", "read_model"]
