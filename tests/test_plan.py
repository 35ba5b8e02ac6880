"""`gemma-grpo plan`: a tiny config planned for a real TPU slice, and the ways it refuses.

Also `--rollout-devices` (plan/split.py): the same slice split into a rollout
group and an update group, predicted beside the shared layout.
"""

import json
import math

import pytest

from conftest import REPO  # pylint: disable=g-importing-member
from conftest import run_cli  # pylint: disable=g-importing-member

pytest.importorskip("libtpu", reason="the plan extra (libtpu) is not installed")


def plan(tmp_path, *args, timeout=600):
  out = tmp_path / "plan.json"
  result = run_cli(["plan", "--config", "configs/tiny.py", "--json", str(out), *args],
                   timeout=timeout, check=False)
  return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def tiny_on_v5e_8(tmp_path_factory):
  return plan(tmp_path_factory.mktemp("plan"), "--topology", "v5e-8",
              "--config.train.batch_size=4")


@pytest.fixture(scope="module")
def tiny_on_v5e_8_split(tmp_path_factory):
  return plan(tmp_path_factory.mktemp("plan"), "--topology", "v5e-8",
              "--config.train.batch_size=4", "--rollout-devices", "4")


def test_a_tiny_config_fits_on_a_v5e_8_and_says_so(tiny_on_v5e_8):
  result, values = tiny_on_v5e_8
  assert result.returncode == 0, result.stderr[-2000:]
  assert "verdict: fits on v5e-8" in result.stdout
  assert values["fits"] is True and values["devices"] == 8
  assert values["mesh"] == {"fsdp": 8, "tp": 1}
  assert set(values["programs"]) == {"update", "reference", "prefill", "decode"}
  for name, program in values["programs"].items():
    assert 0 < program["peak_bytes_per_device"] <= values["hbm_bytes_per_device"], name
    assert program["flops_per_device"] > 0 and program["seconds_lower_bound"] > 0, name
  assert values["step_seconds_lower_bound"] > 0 and 0 < values["mfu_bound"] <= 1


def test_the_plan_json_is_what_the_benchmark_tables_read(tiny_on_v5e_8, tmp_path):
  # bench/tables.py renders README's plan table from the committed JSON files.
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(REPO / "bench"))
  import tables  # pylint: disable=g-import-not-at-top

  _, values = tiny_on_v5e_8
  (tmp_path / "1b_v5e-8.json").write_text(json.dumps(values))
  row = tables.plan(tmp_path).splitlines()[-1]
  assert row.startswith("| Gemma-3 1B | v5e-8 | 8 x 1 | yes | "), row
  assert f"{values['step_seconds_lower_bound']:.2f} s" in row


def test_the_updates_flops_are_the_models_arithmetic_not_one_chunks(tiny_on_v5e_8):
  """Summed over devices, within what the model's size and tokens give by hand.

  configs/tiny.py: 2 layers, width 64, MLP 128, 4 query heads and 1 kv head of
  16; 8 completions of 16 tokens after 192-token prompts (2 per group, each
  prompt run once). The LM head runs on the 16 completion positions only, over
  the 262,144-entry vocabulary, in a scan of 16 chunks: counting that scan's
  body once would leave out 15/16 of the head, the bulk of this model's work.
  """
  _, values = tiny_on_v5e_8
  d, f, v, layers, heads, kv, dh = 64, 128, 262144, 2, 4, 1, 16
  projections = layers * (d * heads * dh * 2 + d * 2 * kv * dh + 3 * d * f)
  prompt_tokens, completion_tokens = 4 * 192, 8 * 16
  tokens = prompt_tokens + completion_tokens
  head = 2 * d * v * completion_tokens  # forward logits
  # Forward, plus backward to the activations (frozen weights: no weight
  # gradients), the feed-forward recomputed, the head's expected embedding.
  low = 2 * projections * tokens * 2 + 2 * head
  high = 2 * projections * tokens * 4 + 3 * head + 4 * layers * tokens**2 * heads * dh * 3
  summed = values["programs"]["update"]["flops_per_device"] * values["devices"]
  assert low <= summed <= high, (low, summed, high)
  # The compiler's own count sees one vocabulary chunk of sixteen.
  compiler = values["programs"]["update"]["compiler_flops_per_device"] * values["devices"]
  assert compiler < summed / 4


def group_seconds(group: dict) -> float:
  """A group's step bound from its programs' bounds and calls, as the JSON gives them."""
  return sum(p["seconds_lower_bound"] * p["calls_per_step"] for p in group["programs"].values())


def test_the_split_bound_is_the_slower_group_plus_the_adapter_transfer(tiny_on_v5e_8_split):
  result, values = tiny_on_v5e_8_split
  assert result.returncode == 0, result.stderr[-2000:]
  split = values["split"]
  assert split["runs_in_trainer"] is True and "staleness 1" in split["assumes"]
  assert "HBM bandwidth" in split["transfer_assumption"]
  rollout, update = split["rollout"], split["update"]
  assert (rollout["devices"], update["devices"]) == (4, 4)
  assert rollout["mesh"] == update["mesh"] == {"fsdp": 4, "tp": 1}  # tp kept, fsdp the rest
  assert set(rollout["programs"]) == {"prefill", "decode"}
  assert set(update["programs"]) == {"update", "reference"}
  assert split["fits"] and rollout["fits"] and update["fits"]
  # The rollout group holds no optimizer state.
  assert rollout["resident_bytes_per_device"] < update["resident_bytes_per_device"]
  # configs/tiny.py's adapters by hand: rank 4 on each projection of 2 layers
  # (width 64, 4 query heads and 1 kv head of 16, MLP 128), A and B in float32:
  # q 4*(64 + 4*16), kv 4*(64 + 2*16), out 4*(4*16 + 64), gate/up/down 4*(64 + 128).
  per_layer = 4 * (64 + 64) + 4 * (64 + 32) + 4 * (64 + 64) + 3 * 4 * (64 + 128)
  assert split["adapter_bytes"] == 2 * per_layer * 4
  share = max(split["adapter_bytes_per_device"].values())
  assert split["adapter_bytes"] / 4 <= share <= split["adapter_bytes"]
  transfer = share / values["hbm_bandwidth_per_device"]
  assert math.isclose(split["transfer_seconds_lower_bound"], transfer)
  expected = max(group_seconds(rollout), group_seconds(update)) + transfer
  assert math.isclose(split["step_seconds_lower_bound"], expected)
  assert math.isclose(split["shared_step_seconds_lower_bound"], values["step_seconds_lower_bound"])
  assert math.isclose(split["ratio_to_shared"], expected / values["step_seconds_lower_bound"])
  assert ("a prediction of the trainer's --config.mesh.rollout_devices=4"
          " --config.rollout.max_staleness=1") in result.stdout
  assert f"split / shared = {expected / values['step_seconds_lower_bound']:.2f}" in result.stdout


def _without_timings(text: str) -> str:
  return "\n".join(line for line in text.splitlines()
                   if "compiled in" not in line and "built from shapes" not in line)


def test_without_the_flag_the_plan_is_unchanged(tiny_on_v5e_8, tiny_on_v5e_8_split):
  (plain, plain_values), (split, split_values) = tiny_on_v5e_8, tiny_on_v5e_8_split
  assert "split" not in plain_values and "split" not in plain.stdout
  # The flag adds its section after the shared plan, which it leaves as it was.
  assert _without_timings(split.stdout).startswith(_without_timings(plain.stdout))
  for values in (plain_values, split_values):
    for program in values["programs"].values():
      del program["compile_seconds"]
  del split_values["split"]
  assert split_values == plain_values


def test_a_config_that_cannot_fit_exits_2_naming_the_program(tmp_path):
  result, values = plan(tmp_path, "--topology", "v5e-1", "--config.train.batch_size=256",
                        "--config.rollout.max_new_tokens=8192", "--config.rollout.kv_cache_size=8448")
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "does not fit on v5e-1" in errors[0], result.stderr[-2000:]
  assert any(name in errors[0] for name in ("update", "reference", "prefill", "decode"))
  assert "Traceback" not in result.stderr
  assert values["fits"] is False


@pytest.mark.parametrize("args, message", [
    (["--topology", "v9z-8"], "--topology v9z-8: unknown"),
    (["--topology", "cpu"], "--topology cpu: give --cpu-flops and --cpu-bandwidth"),
    (["--topology", "v5e-8", "--config.mesh.fsdp=3"], "mesh.fsdp=3"),
    (["--topology", "v5e-1", "--config.rollout.engine=tunix"], "rollout.engine"),
    # configs/tiny.py has 4 query heads: tp=8 cannot split them, as training would find.
    (["--topology", "v5e-8", "--config.mesh.tp=8"], "cannot be split over mesh"),
    (["--topology", "v5e-8", "--rollout-devices", "8"], "--rollout-devices 8: must be between 1 and 7"),
    (["--topology", "v5e-8", "--config.mesh.tp=2", "--rollout-devices", "3"],
     "--rollout-devices 3: each group (3 and 5 devices) must be a multiple of mesh.tp=2"),
    (["--topology", "cpu", "--cpu-flops", "1e12", "--cpu-bandwidth", "1e10", "--rollout-devices", "1"],
     "--rollout-devices 1: a split needs at least 2 devices"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
  result, _ = plan(tmp_path, *args, timeout=300)
  assert result.returncode == 2
  assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]


def test_topology_names_cover_the_slices_users_rent():
  from gemma_grpo.plan import chips  # pylint: disable=g-import-not-at-top

  for name in ("v4-8", "v5e-8", "v5litepod-8", "v5e-1", "v5p-8", "v6e-8", "v5e-16", "h100-8", "h200-1"):
    t = chips.topology(name)
    assert t.chip.hbm_bytes > 0 and t.chip.peak_flops > 0 and t.chip.hbm_bandwidth > 0
  assert chips.topology("v5litepod-8") == chips.topology("v5e-8")
  assert math.isclose(chips.topology("v5e-8").chip.hbm_bytes, 16 * 2**30)


def test_without_the_compiler_it_says_what_to_install(monkeypatch):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  from gemma_grpo import errors  # pylint: disable=g-import-not-at-top
  from gemma_grpo.plan import chips  # pylint: disable=g-import-not-at-top
  from gemma_grpo.plan import devices  # pylint: disable=g-import-not-at-top

  def missing(**unused):
    raise RuntimeError("Unknown backend: 'tpu' requested, but no platforms that are instances of tpu are present")

  monkeypatch.setattr(topologies, "get_topology_desc", missing)
  with pytest.raises(errors.UserError, match=r"install libtpu with pip install .*\[plan\]"):
    devices.for_topology(chips.topology("v5e-8"))
