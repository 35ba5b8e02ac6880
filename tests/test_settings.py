"""gemma_grpo/config/settings.py: a validated config as frozen per-concern dataclasses."""

import dataclasses
import json
import pathlib

import pytest

from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo.config.defaults import OPEN_SECTIONS

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.py")
                 if p.name != "__init__.py")


def _leaves(node, prefix=""):
  """{"rollout.top_k": 50, ...}: every key of a ConfigDict, open sections as one value."""
  found = {}
  for key in node.keys():
    name = f"{prefix}{key}"
    if name in OPEN_SECTIONS:
      found[name] = node[key].to_dict()
    elif hasattr(node[key], "keys"):
      found.update(_leaves(node[key], f"{name}."))
    else:
      found[name] = node[key]
  return found


def _read(s: settings.Settings, name: str):
  value = s
  for part in name.split("."):
    value = getattr(value, part)
  return value


@pytest.mark.parametrize("path", CONFIGS)
def test_every_shipped_config_converts_and_each_key_lands_in_its_slice(path):
  c = config_lib.load(path)
  config_lib.validate(c, num_devices=1)
  s = settings.from_config(c)
  for name, value in _leaves(c).items():
    assert _read(s, name) == value, name
  assert s.config_json == c.to_json_best_effort(indent=2) + "\n"
  assert json.loads(s.config_json) == json.loads(c.to_json())


def test_the_slices_have_exactly_the_sections_keys():
  """A key added to defaults() needs its field here, and a field its key."""
  c = config_lib.defaults()
  s = settings.from_config(c)
  for section in c.keys():
    slice_ = getattr(s, section)
    assert {f.name for f in dataclasses.fields(slice_)} == set(c[section].keys()), section
  assert {f.name for f in dataclasses.fields(s)} == set(c.keys()) | {"config_json"}
  random = s.model.random
  assert {f.name for f in dataclasses.fields(random)} == set(c.model.random.keys())


def test_lists_become_tuples_and_open_sections_stay_mappings():
  c = config_lib.load("configs/tiny.py")
  with c.unlocked():
    c.data.few_shot = [["1+1?", "one and one", "2"]]
    c.data.reasoning_gym_options = {"min_terms": 2, "values": [1, 2]}
  c.rewards.weights.format_approx = 0.25
  s = settings.from_config(c)
  assert s.data.few_shot == (("1+1?", "one and one", "2"),)
  assert dict(s.data.reasoning_gym_options) == {"min_terms": 2, "values": (1, 2)}
  assert s.rewards.weights["format_approx"] == 0.25
  assert s.rewards.weights["answer_correct"] is None


def test_settings_are_frozen():
  s = settings.from_config(config_lib.defaults())
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.mesh.fsdp = 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.rollout = None
  with pytest.raises(TypeError):
    s.data.reasoning_gym_options["min_terms"] = 3
  with pytest.raises(TypeError):
    s.rewards.weights["format_approx"] = 1.0


def test_one_slice_is_built_without_a_config():
  mesh = settings.MeshSettings(fsdp=-1, tp=2)
  assert (mesh.fsdp, mesh.tp) == (-1, 2)
  lora = settings.LoraSettings(rank=8, alpha=16.0, targets="q_einsum", seed=0)
  assert lora.scale == 2.0
  with pytest.raises(TypeError):  # keyword-only: a slice is never built by position
    settings.MeshSettings(-1, 2)
