"""Config files, command-line overrides and validation."""

import json
import pathlib
import subprocess
import sys

import pytest

from gemma_grpo import config as config_lib
from gemma_grpo import errors

REPO = pathlib.Path(__file__).resolve().parent.parent
# Every file a user can pass to --config.
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.py")
                 if p.name != "__init__.py")


@pytest.fixture
def tiny():
  return config_lib.load("configs/tiny.py")


@pytest.mark.parametrize("path", CONFIGS)
def test_shipped_configs_load_and_validate(path):
  c = config_lib.load(path)
  config_lib.validate(c, num_devices=1)


def test_gemma3_1b_holds_reference_hyperparameters():
  c = config_lib.load("configs/gemma3_1b.py")
  assert c.model.source == "hf:google/gemma-3-1b-it"
  assert (c.lora.rank, c.lora.alpha) == (32, 32.0)
  assert (c.optim.peak_lr, c.optim.warmup_fraction, c.optim.max_grad_norm) == (3e-6, 0.1, 0.1)
  assert (c.optim.weight_decay, c.optim.b1, c.optim.b2) == (0.1, 0.9, 0.99)
  assert c.train.max_steps == 100
  g = c.grpo
  assert (g.num_generations, g.num_iterations, g.beta, g.epsilon) == (2, 1, 0.08, 0.2)
  r = c.rollout
  assert (r.temperature, r.top_p, r.top_k) == (0.9, 1.0, 50)
  assert (r.max_prompt_length, r.max_new_tokens, r.kv_cache_size) == (256, 512, 1024)
  assert c.log.flush_every_steps == 10
  assert c.data.shuffle_seed == 42


@pytest.mark.parametrize("arg, key, expected", [
    ("--config.grpo.beta=0.04", "grpo.beta", 0.04),
    ("--config.grpo.beta=0", "grpo.beta", 0.0),  # an int where a float is due
    ("--config.train.max_steps=7", "train.max_steps", 7),
    ("--config.model.source=hf:google/gemma-3-1b-it", "model.source", "hf:google/gemma-3-1b-it"),
    ("--config.grpo.dynamic_sampling=true", "grpo.dynamic_sampling", True),
    ("--config.grpo.dynamic_sampling=0", "grpo.dynamic_sampling", False),
    ("--config.rewards.weights.format_approx=0.25", "rewards.weights.format_approx", 0.25),
])
def test_override_converts_to_the_field_type(tiny, arg, key, expected):
  assert config_lib.apply_overrides(tiny, [arg]) == []
  value = tiny
  for part in key.split("."):
    value = value[part]
  assert value == expected and type(value) is type(expected)


def test_override_accepts_space_separated_value_and_returns_other_args(tiny):
  rest = config_lib.apply_overrides(tiny, ["--config.train.max_steps", "9", "--other"])
  assert tiny.train.max_steps == 9 and rest == ["--other"]


@pytest.mark.parametrize("arg, message", [
    ("--config.grpo.betta=1", "unknown key 'betta'"),
    ("--config.nope.x=1", "no section 'nope'"),
    ("--config.train.max_steps=ten", "expected a int"),
    ("--config.grpo.beta=high", "expected a float"),
    ("--config.grpo.dynamic_sampling=maybe", "expected true or false"),
    ("--config.grpo=1", "is a section"),
    ("--config.train.max_steps", "missing value"),
])
def test_override_errors_name_the_key(tiny, arg, message):
  with pytest.raises(errors.UserError, match=message):
    config_lib.apply_overrides(tiny, [arg])


def _invalid(c, device_count=1):
  with pytest.raises(errors.UserError) as e:
    config_lib.validate(c, num_devices=device_count)
  return str(e.value).splitlines()


@pytest.mark.parametrize("field, value, needle", [
    ("grpo.num_generations", 1, "grpo.num_generations=1"),
    ("grpo.algorithm", "ppo", "grpo.algorithm='ppo'"),
    ("grpo.beta", -0.1, "grpo.beta=-0.1"),
    ("grpo.epsilon", 1.5, "grpo.epsilon=1.5"),
    ("rollout.kv_cache_size", 100, "rollout.kv_cache_size=100"),
    ("rollout.temperature", 0.0, "rollout.temperature=0.0"),
    ("rollout.top_p", 0.0, "rollout.top_p=0.0"),
    ("rollout.engine", "vllm", "rollout.engine='vllm'"),
    ("rollout.decode_dtype", "int4", "rollout.decode_dtype='int4': must be one of float32, bfloat16"),
    ("model.matmul_dtype", "fp8", "model.matmul_dtype='fp8': use one of float32, bfloat16"),
    ("rollout.screen_lm_head", "yes", "rollout.screen_lm_head='yes': must be one of auto, on, off"),
    ("optim.warmup_fraction", 1.0, "optim.warmup_fraction=1.0"),
    ("optim.peak_lr", 0.0, "optim.peak_lr=0.0"),
    ("train.micro_batch_size", 3, "train.micro_batch_size=3"),
    ("train.max_steps", 0, "train.max_steps=0"),
    ("lora.rank", 0, "lora.rank=0"),
    ("lora.targets", "embedder", "lora.targets='embedder' matches no module"),
    ("lora.targets", "(", "is not a regex"),
    ("model.dtype", "float16", "model.dtype='float16'"),
    ("eval.num_examples", 99, "eval.num_examples=99"),
    ("ckpt.keep", 0, "ckpt.keep=0"),
    ("grpo.tis_cap", -1.0, "grpo.tis_cap=-1.0: must be 0 (off) or >= 1; 2.0 is typical"),
    ("grpo.tis_cap", 0.5, "grpo.tis_cap=0.5: must be 0 (off) or >= 1"),
])
def test_validation_names_field_value_and_fix(tiny, field, value, needle):
  section, key = field.split(".")
  with tiny[section].unlocked():
    tiny[section][key] = value
  lines = _invalid(tiny)
  assert any(needle in line for line in lines), lines


@pytest.mark.parametrize("overrides, needle", [
    (dict(slots=-1), "rollout.slots=-1: must be >= 0 (0 = lockstep decoding)"),
    # tiny: train.batch_size 2 x grpo.num_generations 2 completions a step.
    (dict(slots=5), "rollout.slots=5: must be <= the step's completions, train.batch_size x"
                    " grpo.num_generations = 4; set --config.rollout.slots=4 or lower"),
    (dict(slots=2, engine="tunix"), "rollout.slots=2 needs rollout.engine='grouped'"),
    (dict(slots=2, tools="calculator"),
     "rollout.slots=2 cannot run rollout.tools='calculator' yet; set --config.rollout.slots=0"),
])
def test_continuous_batching_slots_are_checked_in_one_line_naming_the_fix(tiny, overrides,
                                                                          needle):
  tiny.rollout.slots = 4
  config_lib.validate(tiny, num_devices=1)  # as many slots as completions is fine
  tiny.rollout.update(overrides)
  lines = _invalid(tiny)
  assert any(needle in line for line in lines), lines


@pytest.mark.parametrize("overrides, needle", [
    (dict(rollout=dict(max_staleness=-1)), "rollout.max_staleness=-1: must be >= 0"),
    (dict(rollout=dict(max_staleness=1, slots=0)),
     "rollout.max_staleness=1 runs ahead in carried slots: set --config.rollout.slots"),
    (dict(grpo=dict(num_iterations=2)),
     "rollout.max_staleness=1 needs one update per batch (grpo.num_iterations=1,"
     " train.mini_batch_size=0); set --config.rollout.max_staleness=0"),
    (dict(train=dict(mini_batch_size=1)), "rollout.max_staleness=1 needs one update per batch"),
    (dict(grpo=dict(dynamic_sampling=True)),
     "rollout.max_staleness=1 cannot refill groups (grpo.dynamic_sampling);"
     " set --config.grpo.dynamic_sampling=False"),
])
def test_running_ahead_is_checked_in_one_line_naming_the_fix(tiny, overrides, needle):
  tiny.rollout.update(dict(slots=3, max_staleness=1))
  config_lib.validate(tiny, num_devices=1)
  for section, values in overrides.items():
    tiny[section].update(values)
  lines = _invalid(tiny)
  assert any(needle in line for line in lines), lines


@pytest.mark.parametrize("overrides, devices, needle", [
    (dict(rollout=dict(max_staleness=0)), 8,
     "mesh.rollout_devices=4 decodes the next batch while the update runs, which needs"
     " rollout.max_staleness >= 1; set --config.rollout.max_staleness=1"),
    (dict(mesh=dict(fsdp=4)), 8,
     "mesh.rollout_devices=4: each group fills fsdp with its own devices; set --config.mesh.fsdp=-1"),
    ({}, 4, "mesh.rollout_devices=4: must be between 1 and 3 of the 4 devices (the rest run the update)"),
    ({}, 1, "mesh.rollout_devices=4: a split needs at least 2 devices; there is 1:"
            " set --config.mesh.rollout_devices=0"),
    (dict(mesh=dict(tp=2, rollout_devices=3)), 8,
     "mesh.rollout_devices=3: each group (3 and 5 devices) must be a multiple of mesh.tp=2;"
     " choose a multiple of 2"),
    (dict(mesh=dict(rollout_devices=-1)), 8,
     "mesh.rollout_devices=-1: must be >= 0 (0 = one mesh for every program)"),
])
def test_a_rollout_group_of_its_own_is_checked_in_one_line_naming_the_fix(tiny, overrides, devices,
                                                                         needle):
  tiny.rollout.update(dict(slots=3, max_staleness=1))
  tiny.mesh.rollout_devices = 4
  config_lib.validate(tiny, num_devices=8)
  for section, values in overrides.items():
    tiny[section].update(values)
  lines = _invalid(tiny, device_count=devices)
  assert any(needle in line for line in lines), lines


def test_tools_need_the_grouped_engine(tiny):
  tiny.rollout.engine = "tunix"
  config_lib.validate(tiny, num_devices=1)  # no tools: Tunix's sampler is fine
  tiny.rollout.tools = "calculator"
  assert any("rollout.tools='calculator' needs rollout.engine='grouped'" in line for line in _invalid(tiny))


@pytest.mark.parametrize("field, value, needle", [
    ("rollout.max_tool_calls", -2, "rollout.max_tool_calls=-2: must be >= 1"),
    ("rollout.tool_time_limit", 0.0, "rollout.tool_time_limit=0.0: must be > 0 seconds"),
    ("model.random.num_layers", 0, "model.random.num_layers=0: must be >= 1"),
    ("model.random.vocab_size", 1000, "model.random.vocab_size=1000: must be >= 262144"),
    ("grpo.max_resample_rounds", -1, "grpo.max_resample_rounds=-1: must be >= 0"),
    ("data.shuffle_seed", -1, "data.shuffle_seed=-1: must be >= 0"),
    ("rollout.seed", -3, "rollout.seed=-3: must be >= 0"),
    ("mesh.tp", 0, "mesh.tp=0: use a positive size or -1"),
])
@pytest.mark.parametrize("tools", ["", "calculator"])
def test_a_range_is_checked_whether_or_not_its_feature_is_on(tiny, field, value, needle, tools):
  """Tools, a random model, dynamic sampling and the mesh (without devices)."""
  tiny.rollout.tools = tools
  *sections, key = field.split(".")
  node = tiny
  for section in sections:
    node = node[section]
  node[key] = value
  [line] = _invalid(tiny, device_count=None)
  assert line.startswith(needle), line


def _number_keys(node, prefix=""):
  for key in node.keys():
    value = node[key]
    if hasattr(value, "keys"):
      yield from _number_keys(value, f"{prefix}{key}.")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      yield f"{prefix}{key}"


# rewards.weights are open (a negative weight penalises); their checks are
# gemma_grpo.tasks.rewards'.
_NUMBER_KEYS = [k for k in _number_keys(config_lib.defaults()) if not k.startswith("rewards.")]


@pytest.mark.parametrize("field", _NUMBER_KEYS)
def test_every_number_key_has_a_range(tiny, field):
  """A value far below any sensible one fails, on a line that names the key."""
  *sections, key = field.split(".")
  node = tiny
  for section in sections:
    node = node[section]
  node[key] = type(node[key])(-1000)
  lines = _invalid(tiny, device_count=None)
  assert any(line.startswith((f"{field}=", f"{field}:")) for line in lines), lines


def test_bfloat16_decoding_needs_the_grouped_engine(tiny):
  tiny.rollout.decode_dtype = "bfloat16"
  config_lib.validate(tiny, num_devices=1)
  tiny.rollout.engine = "tunix"
  assert any("needs rollout.engine='grouped'" in line for line in _invalid(tiny))


@pytest.mark.parametrize("engine", ["grouped", "tunix"])
def test_tis_is_valid_with_either_engine(tiny, engine):
  # Tunix's sampler returns the drawn tokens' log-probs too (return_logprobs).
  tiny.grpo.tis_cap, tiny.rollout.engine = 2.0, engine
  config_lib.validate(tiny, num_devices=1)


def test_tis_is_off_by_default_and_on_in_the_accelerator_config():
  assert config_lib.load("configs/tiny.py").grpo.tis_cap == 0.0
  c = config_lib.load("configs/gemma3_1b.py")
  assert (c.grpo.tis_cap, c.rollout.decode_dtype) == (2.0, "bfloat16")


def test_validation_reports_every_problem_at_once(tiny):
  tiny.grpo.num_generations = 1
  tiny.train.max_steps = 0
  assert len(_invalid(tiny)) == 2


def test_dapo_requires_no_kl(tiny):
  tiny.grpo.algorithm = "dapo"
  assert any("DAPO has no KL term" in line for line in _invalid(tiny))
  tiny.grpo.beta = 0.0
  config_lib.validate(tiny, num_devices=1)


@pytest.mark.parametrize("fsdp, tp, devices, expected", [
    (-1, 1, 8, (8, 1)),
    (4, -1, 8, (4, 2)),
    (2, 4, 8, (2, 4)),
    (-1, 2, 4, (2, 2)),
    (1, 1, 1, (1, 1)),
])
def test_mesh_shape_resolves_minus_one(tiny, fsdp, tp, devices, expected):
  tiny.mesh.fsdp, tiny.mesh.tp = fsdp, tp
  assert config_lib.mesh_shape(tiny.mesh, devices) == expected


@pytest.mark.parametrize("fsdp, tp, devices", [(3, 1, 8), (-1, 3, 8), (-1, -1, 8), (0, 1, 8), (4, 4, 8)])
def test_mesh_that_cannot_fill_the_devices_is_rejected(tiny, fsdp, tp, devices):
  tiny.mesh.fsdp, tiny.mesh.tp = fsdp, tp
  assert any(line.startswith("mesh.") for line in _invalid(tiny, devices))


def test_saved_config_round_trips(tiny, tmp_path):
  tiny.grpo.beta = 0.5
  tiny.rewards.weights.format_exact = 2.0
  config_lib.save(tiny, tmp_path / "config.json")
  again = config_lib.load_saved(tmp_path / "config.json")
  assert again.grpo.beta == 0.5 and again.rewards.weights.format_exact == 2.0
  assert again.rewards.weights.answer_correct is None
  assert again.to_dict() == tiny.to_dict()


# Overrides that touch a plain key, a tuple of tuples, and both open sections
# (a key the config file set, and a key of the user's own).
ROUND_TRIP_OVERRIDES = [
    "--config.grpo.beta=0.5",
    "--config.data.few_shot=(('1 + 1?', 'One and one.', '2'),)",
    "--config.data.reasoning_gym_options.max_value=30",
    "--config.data.reasoning_gym_options.operators=('+', '*')",
    "--config.rewards.weights.format_exact=2.0",
]


@pytest.mark.parametrize("overrides", [[], ROUND_TRIP_OVERRIDES], ids=["as shipped", "overridden"])
@pytest.mark.parametrize("path", CONFIGS)
def test_every_shipped_config_reads_back_as_saved(path, overrides, tmp_path):
  c = config_lib.load(path)
  assert config_lib.apply_overrides(c, list(overrides)) == []
  config_lib.save(c, tmp_path / "config.json")
  again = config_lib.load_saved(tmp_path / "config.json")
  assert again == c
  assert again.to_dict() == c.to_dict()
  config_lib.save(again, tmp_path / "again.json")
  assert (tmp_path / "again.json").read_text() == (tmp_path / "config.json").read_text()


def test_the_first_commands_task_options_read_back():
  # The regression of the first command: every key of an open section was refused.
  c = config_lib.offline_270m()
  assert set(c.data.reasoning_gym_options) >= {"min_terms", "operators"}
  assert len(c.data.reasoning_gym_options) == 6


def test_a_list_in_a_config_file_reads_back_equal(tmp_path):
  (tmp_path / "configs").mkdir()
  mine = tmp_path / "configs" / "mine.py"
  mine.write_text(
      "import ml_collections\n"
      "from gemma_grpo import config\n"
      "def get_config():\n"
      "  c = config.defaults()\n"
      "  c.data.source = 'reasoning_gym:simple_equations'\n"
      "  c.data.reasoning_gym_options = ml_collections.ConfigDict({'operators': ['+', '-']})\n"
      "  c.data.few_shot = [['1 + 1?', 'One and one.', '2']]\n"
      "  return c\n")
  c = config_lib.load(str(mine))
  assert c.data.reasoning_gym_options.operators == ("+", "-")
  assert c.data.few_shot == (("1 + 1?", "One and one.", "2"),)
  config_lib.save(c, tmp_path / "config.json")
  assert config_lib.load_saved(tmp_path / "config.json") == c


def test_an_open_section_takes_a_new_key_from_the_command_line(tiny):
  config_lib.apply_overrides(tiny, ["--config.data.reasoning_gym_options.min_value=3",
                                    "--config.data.reasoning_gym_options.operators=['+']",
                                    "--config.data.reasoning_gym_options.name=easy"])
  assert dict(tiny.data.reasoning_gym_options) == {"min_value": 3, "operators": ("+",), "name": "easy"}
  with pytest.raises(errors.UserError, match="unknown key 'gamma'"):
    config_lib.apply_overrides(tiny, ["--config.grpo.gamma=1"])


@pytest.mark.parametrize("saved, message", [
    ({"grpo": {"beta": "high"}}, "grpo.beta: 'high' is not a float"),
    ({"grpo": 3}, "grpo: 3 where a section belongs"),
    ({"data": {"reasoning_gym_options": {"min_value": 2}, "nope": 1}}, "data.nope: not a config key"),
])
def test_a_hand_edited_config_json_is_one_line_naming_the_key(tmp_path, saved, message):
  (tmp_path / "config.json").write_text(json.dumps(saved))
  with pytest.raises(errors.UserError, match=message) as refused:
    config_lib.load_saved(tmp_path / "config.json")
  assert "\n" not in str(refused.value)


def test_saved_config_from_another_version_is_reported(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"grpo": {"gamma": 1}}))
  with pytest.raises(errors.UserError, match="grpo.gamma"):
    config_lib.load_saved(tmp_path / "config.json")


def test_missing_config_file_is_a_user_error():
  with pytest.raises(errors.UserError, match="no such file"):
    config_lib.load("configs/nope.py")


def test_a_config_file_lacking_newer_fields_is_one_line_naming_them(tmp_path):
  # A config written for an older version, before rollout.decode_dtype existed.
  (tmp_path / "configs").mkdir()
  old = tmp_path / "configs" / "old.py"
  old.write_text(
      "from gemma_grpo import config\n"
      "def get_config():\n"
      "  c = config.defaults()\n"
      "  with c.unlocked():\n"
      "    del c.rollout['decode_dtype']\n"
      "    del c['sft']\n"
      "  return c\n")
  with pytest.raises(errors.UserError) as refused:
    config_lib.load(str(old))
  message = str(refused.value)
  assert "\n" not in message
  assert f"{old} lacks rollout.decode_dtype, sft, which gemma_grpo.config.defaults() has" in message


def test_an_old_config_beginning_from_configs_import_base_says_how_to_start(tmp_path, monkeypatch):
  # Outside the repo no `configs` package exists; the old first line names the fix.
  monkeypatch.setitem(sys.modules, "configs", None)
  old = tmp_path / "elsewhere" / "mine.py"
  old.parent.mkdir()
  old.write_text("from configs import base\n\ndef get_config():\n  return base.get_config()\n")
  with pytest.raises(errors.UserError, match=r"mine.py:1: ModuleNotFoundError.*config.defaults\(\)"):
    config_lib.load(str(old))


def test_sibling_configs_load_by_path_from_any_directory(tmp_path):
  accuracy = pathlib.Path("configs/gemma3_270m_accuracy.py").resolve()
  # As when installed from a wheel: no finder makes the repo's configs/ importable.
  code = ("import sys; from gemma_grpo import config; "
          "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]; "
          f"c = config.load({str(accuracy)!r}); print(c.data.heldout_unseen_by)")
  run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
  assert run.stdout.strip() == "equation"


@pytest.mark.parametrize("source, kind", [
    ("gsm8k", "hub"),
    ("reasoning_gym:gsm_symbolic", "reasoning_gym"),
    ("reasoning_gym:", "reasoning_gym"),
    ("/data/gsm8k/test.jsonl", "file"),
    ("gs://bucket/train.parquet", "file"),
    ("GSM8K", "file"),
])
def test_data_source_kind(source, kind):
  assert config_lib.data_source_kind(source) == kind


def test_the_offline_270m_settings_are_the_first_commands_config():
  assert config_lib.offline_270m().to_dict() == config_lib.load("configs/gemma3_270m.py").to_dict()
  c = config_lib.offline_270m()
  assert (c.model.source, c.data.source, c.rollout.stop_text) == (
      "gguf:gemma-3-270m", "reasoning_gym:simple_equations", "</answer>")
  config_lib.validate(c, num_devices=1)


def test_the_defaults_are_fresh_on_every_call():
  c = config_lib.defaults()
  c.grpo.beta = 0.5
  assert config_lib.defaults().grpo.beta == 0.08
  assert config_lib.load("configs/base.py").to_dict() == config_lib.defaults().to_dict()


def test_problems_are_reported_section_by_section(tiny):
  tiny.model.dtype = "float16"
  tiny.lora.rank = 0
  tiny.grpo.beta = -1.0
  tiny.ckpt.keep = 0
  sections = [line.split(".")[0] for line in _invalid(tiny)]
  assert sections == ["model", "lora", "grpo", "ckpt"]
