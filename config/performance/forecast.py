"""A plan's predictions as a run keeps and shows them: at the planned load and at one user, beside what
``vllm serve`` with vLLM's defaults would give on the same hardware (and on a GPU with
``VLLM_USE_RUST_FRONTEND=1``, as users run it too), with the inputs to predict again (``bench`` predicts each
of its levels from them)."""

from __future__ import annotations

from pydantic import BaseModel

from config.hardware import Hardware
from config.model import ModelSpec
from config.performance.costs import HostCosts
from config.performance.layout import layout_of, vllm_defaults
from config.performance.prediction import Load, Path, Prediction, predict
from config.plan import Plan


class Forecast(BaseModel):
    """What the plan is expected to deliver, and what it was predicted from."""

    hardware: Hardware
    model: ModelSpec
    costs: HostCosts
    at_load: Prediction
    at_one: Prediction
    defaults_at_load: Prediction
    defaults_at_one: Prediction
    rust_at_load: Prediction | None = None
    """``vllm serve`` with ``VLLM_USE_RUST_FRONTEND=1`` and nothing else (None on the CPU engine, which has none)."""
    rust_at_one: Prediction | None = None

    def again(self, plan: Plan, load: Load) -> Prediction:
        """The plan under another load, from the same inputs."""
        return predict(layout_of(plan, self.hardware), self.model, load, self.costs)

    @property
    def gain(self) -> float | None:
        """The plan's tokens/s over vLLM's defaults' at the planned load."""
        return self.gain_over(self.defaults_at_load)

    @property
    def rust_gain(self) -> float | None:
        """The plan's tokens/s over ``vllm serve`` with the Rust frontend's at the planned load."""
        return self.gain_over(self.rust_at_load) if self.rust_at_load else None

    def gain_over(self, other: Prediction) -> float | None:
        base = other.output_tokens_per_s.point
        return self.at_load.output_tokens_per_s.point / base if base > 0 else None


def forecast(
    plan: Plan,
    hardware: Hardware,
    model: ModelSpec,
    costs: HostCosts,
    *,
    users: int,
    prompt_tokens: int,
    reply_tokens: int,
    path: Path = "api",
    sampled: bool = True,
) -> Forecast:
    """The plan and vLLM's defaults at ``users`` and at one user, prompts and replies as the workload says;
    ``sampled``: the users' tokens drawn at random (the page's temperature above 0)."""
    ours, theirs = layout_of(plan, hardware), vllm_defaults(hardware, model, plan.dtype)
    rust = vllm_defaults(hardware, model, plan.dtype, rust_frontend=True) if hardware.has_gpu else None
    at = Load(users, (prompt_tokens,), reply_tokens, path=path, sampled=sampled)
    one = Load(1, (prompt_tokens,), reply_tokens, path=path, sampled=sampled)
    return Forecast(
        hardware=hardware,
        model=model,
        costs=costs,
        at_load=predict(ours, model, at, costs),
        at_one=predict(ours, model, one, costs),
        defaults_at_load=predict(theirs, model, at, costs),
        defaults_at_one=predict(theirs, model, one, costs),
        rust_at_load=predict(rust, model, at, costs) if rust else None,
        rust_at_one=predict(rust, model, one, costs) if rust else None,
    )
