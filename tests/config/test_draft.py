"""The rules hand values to each other through the draft by name: every name must be a field of
``Plan``, or the value is lost when the draft becomes a plan (pydantic drops unknown keys).

Checked three ways: the draft refuses any other name when a rule runs; every rule on every shipped
profile runs; and the rules' source is read for every name they give the draft, so a name on a
branch no profile reaches is caught too."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from config.draft import PINNED_BY_YOU, Draft, Work
from config.hardware import list_profiles, load_profile
from config.model import read_model
from config.plan import Plan
from config.planner import PlanError, make_plan
from config.rules.cpu import CpuWork
from config.rules.gpu import GpuWork
from config.rules.order import CPU_STEPS, GPU_STEPS
from config.settings import WorkloadSettings

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "tests" / "data").glob("*.json"))
RULE_SOURCES = [*sorted((ROOT / "config" / "rules").glob("*.py")), ROOT / "config" / "planner.py"]
DRAFT_DICTS = frozenset({"values", "pins", "reasons"})
DICT_METHODS = frozenset({"get", "pop", "setdefault"})


def _is_draft(node: ast.expr) -> bool:
    """``draft`` or ``<anything>.draft``: how the rules name the planner's draft."""
    return (isinstance(node, ast.Name) and node.id == "draft") or (
        isinstance(node, ast.Attribute) and node.attr == "draft"
    )


def _is_draft_dict(node: ast.expr) -> bool:
    """The draft's values, pins or reasons; a bare ``pins`` is the draft's pins handed to a helper."""
    if isinstance(node, ast.Name):
        return node.id == "pins"
    return isinstance(node, ast.Attribute) and node.attr in DRAFT_DICTS and _is_draft(node.value)


def _key_expressions(tree: ast.AST) -> list[ast.expr]:
    """Every expression a rule uses as a name on the draft: ``draft.set(KEY, ...)``,
    ``draft.pins[KEY]``, ``draft.pins.get(KEY)`` (and pop, setdefault), ``KEY in draft.pins``."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            method, owner = node.func.attr, node.func.value
            if (method == "set" and _is_draft(owner)) or (method in DICT_METHODS and _is_draft_dict(owner)):
                found.append(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_draft_dict(node.value):
            found.append(node.slice)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _is_draft_dict(node.comparators[0])
        ):
            found.append(node.left)
    return found


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def draft_names(source: str) -> set[str]:
    """The names ``source`` reads or writes on the draft: the strings in each key expression, and for
    a variable (``for key in ("a", "b")``, ``key = ...``) the strings it is bound from in its function."""
    tree = ast.parse(source)
    names: set[str] = set()
    functions: list[ast.AST] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.Lambda)] or [tree]
    for function in functions:
        bound: dict[str, set[str]] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                bound.setdefault(node.target.id, set()).update(_strings(node.iter))
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is not None:
                    for target in targets:
                        if isinstance(target, ast.Name):
                            bound.setdefault(target.id, set()).update(_strings(node.value))
        for key in _key_expressions(function):
            names |= bound.get(key.id, set()) if isinstance(key, ast.Name) else _strings(key)
    return names


def test_rules_source_names_only_plan_fields() -> None:
    """Every name any rule or the planner gives the draft, on every branch, is a field of ``Plan``."""
    unknown = {path.name: sorted(draft_names(path.read_text()) - set(Plan.model_fields)) for path in RULE_SOURCES}
    assert not {name: keys for name, keys in unknown.items() if keys}


def test_rules_source_scan_sees_what_the_rules_set() -> None:
    """The scan is not blind: it finds every value a plan has a reason for, on every shipped profile."""
    scanned = set().union(*(draft_names(path.read_text()) for path in RULE_SOURCES))
    model = read_model(ROOT / "tests" / "data" / "qwen2.5-0.5b.json")
    for profile in list_profiles():
        plan = make_plan(load_profile(profile), model, WorkloadSettings(users=256))
        assert set(plan.reasons) <= scanned, profile


def test_rules_source_scan_finds_a_made_up_name() -> None:
    """A name that is not a field of ``Plan`` in each form a rule may use is found."""
    source = """
def rule(work, draft, pins):
    work.draft.set("max_num_seq", 8, "typo")
    for key in ("tensor_parallel", "dtype"):
        work.draft.pins.get(key, 1)
    name = "pipeline_parallel" if draft else "nodes"
    draft.values[name] = 2
    if "kv_cache_gib" in draft.pins or "gpu_memory_utilisation" in pins:
        draft.reasons["node"] = "typo"
    draft.values.pop("gpu", None)
"""
    assert draft_names(source) - set(Plan.model_fields) == {
        "max_num_seq",
        "tensor_parallel",
        "pipeline_parallel",
        "kv_cache_gib",
        "gpu_memory_utilisation",
        "node",
        "gpu",
    }


@pytest.mark.parametrize("users", [8, 256])
@pytest.mark.parametrize("profile", list_profiles())
def test_rules_use_only_plan_fields(profile: str, users: int) -> None:
    """Every rule on every shipped profile and published model reads and writes only Plan's fields
    (the draft raises KeyError on any other name); a model with no plan there says why instead."""
    planned = 0
    for config in MODELS:
        try:
            plan = make_plan(load_profile(profile), read_model(config), WorkloadSettings(users=users))
        except PlanError:
            continue
        planned += 1
        assert set(plan.reasons) <= set(type(plan).model_fields)
    assert planned, f"no model has a plan on {profile}"


@pytest.mark.parametrize(
    "use",
    [
        lambda d: d.set("max_num_seq", 8, "typo"),
        lambda d: d.values["tensor_parallel"],
        lambda d: d.values.get("executor_backend"),
        lambda d: "kv_cache_gib" in d.pins,
        lambda d: d.pins.get("max_len", 0),
        lambda d: d.reasons.__setitem__("node", "typo"),
        lambda d: d.values.pop("gpu", None),
    ],
)
def test_draft_refuses_names_not_in_plan(use: Any) -> None:
    with pytest.raises(KeyError, match="is not a field of Plan"):
        use(Draft())


def test_draft_pin_wins() -> None:
    draft = Draft(pins={"max_num_seqs": 4})
    assert draft.set("max_num_seqs", 64, "derived") == 4
    assert draft.values["max_num_seqs"] == 4 and draft.reasons["max_num_seqs"] == PINNED_BY_YOU
    with pytest.raises(KeyError):
        Draft(pins={"max_num_seq": 4})


@pytest.mark.parametrize(
    ("profile", "work", "steps", "moved", "unwritten"),
    [
        ("cpu-only", CpuWork, CPU_STEPS, "set_kv_cache", "pp"),
        ("1xH100", GpuWork, GPU_STEPS, "set_parallel", "usable"),
        ("1xH100", GpuWork, GPU_STEPS, "add_memory", "smallest|gpus"),
    ],
)
def test_a_step_moved_before_the_one_it_reads_from_fails(
    profile: str, work: type[Work], steps: tuple[Any, ...], moved: str, unwritten: str
) -> None:
    """The listed order is the only one: a step moved to the front raises at once on the work field
    no step has written yet, instead of planning with a default."""
    hardware, model = load_profile(profile), read_model(ROOT / "tests" / "data" / "qwen2.5-0.5b.json")
    first = next(step for step in steps if step.__name__ == moved)
    state = work(Draft(), hardware, model, WorkloadSettings())
    with pytest.raises(AttributeError, match=f"has no attribute '({unwritten})'"):
        for step in (first, *(step for step in steps if step is not first)):
            step(state)
