"""The planner's working state, shared by every rule in ``config.rules``: a leaf the rules and the
planner both import, so neither imports the other.

Rules hand values to each other through the draft by name (``frontend`` reads the
``distributed_executor_backend`` the parallel rules set); every name is a field of ``Plan``, and a
name that is not one raises at once instead of being dropped when the draft becomes a ``Plan``.
What is not a plan value (the GPUs used, bytes usable, KV tokens) goes on a ``Work``, as a typed field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from config.hardware import Hardware
from config.model import ModelSpec
from config.plan import Memory, Plan
from config.settings import WorkloadSettings

PINNED_BY_YOU = "pinned by you"
"""A pinned value's reason; the planner adds what it would have picked without the pin."""

PLAN_FIELDS = frozenset(Plan.model_fields)


class PlanFields(dict[str, Any]):
    """A dict whose keys are ``Plan``'s fields: reading or writing any other key is a rule's typo."""

    @staticmethod
    def check(key: object) -> None:
        if key not in PLAN_FIELDS:
            raise KeyError(f"{key!r} is not a field of Plan: a rule reads or writes a value the plan does not have")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key in self:
            self.check(key)

    def __getitem__(self, key: str) -> Any:
        self.check(key)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.check(key)
        super().__setitem__(key, value)

    def __contains__(self, key: object) -> bool:
        self.check(key)
        return super().__contains__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.check(key)
        return super().get(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self.check(key)
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.check(key)
        return super().setdefault(key, default)


@dataclass
class Draft:
    """Mutable working state the rules write to; becomes a frozen ``Plan`` at the end."""

    values: dict[str, Any] = field(default_factory=PlanFields)
    reasons: dict[str, str] = field(default_factory=PlanFields)
    warnings: list[str] = field(default_factory=list)
    pins: dict[str, Any] = field(default_factory=PlanFields)

    def __post_init__(self) -> None:
        self.values, self.reasons, self.pins = PlanFields(self.values), PlanFields(self.reasons), PlanFields(self.pins)

    def set(self, key: str, value: Any, reason: str) -> Any:
        """Record a derived value unless the user pinned it; return the value in force."""
        if key in self.pins:
            self.values[key] = self.pins[key]
            self.reasons[key] = PINNED_BY_YOU  # the planner adds its own pick without the pin
            return self.pins[key]
        self.values[key] = value
        self.reasons[key] = reason
        return value


@dataclass(eq=False, repr=False)
class Work:
    """One planning run: its inputs, the draft, and the memory arithmetic its last step leaves.

    Each device kind's path (``config.rules.cpu``, ``config.rules.gpu``) adds the values its steps hand
    on as fields without a default: a step that reads one before the step that writes it has run
    raises AttributeError, so the order in ``config.rules.order`` cannot be wrong silently.
    """

    draft: Draft
    hardware: Hardware
    model: ModelSpec
    """The checkpoint's shape; the model as served once the dtype step has run."""
    workload: WorkloadSettings
    memory: Memory = field(init=False)

    @property
    def typical(self) -> int:
        """Tokens of one typical request: prompt and reply."""
        return self.workload.prompt_tokens + self.workload.reply_tokens
