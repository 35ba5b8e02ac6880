"""Reading, checking and setting aside checkpoints; the run identity record."""

import logging
import pathlib
import shutil
import sys
import types

import numpy as np
import pytest

from configs import base
from gemma_grpo.runtime import checkpoints
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings


def copy_run(tiny_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run, workdir)
  return workdir


def largest_data_file(step_dir):
  """The biggest array chunk file of a step's LoRA parameters."""
  files = [p for p in (step_dir / "model_params").rglob("*") if p.is_file() and p.parent.name == "d"]
  return max(files, key=lambda p: p.stat().st_size)


def truncate(step_dir):
  path = largest_data_file(step_dir)
  path.write_bytes(path.read_bytes()[:100])


def delete_chunk(step_dir):
  largest_data_file(step_dir).unlink()


def garble_metadata(step_dir):
  (step_dir / "model_params" / "_METADATA").write_text('{"tree_meta')


def empty(step_dir):
  shutil.rmtree(step_dir)
  step_dir.mkdir()


CORRUPTIONS = [truncate, delete_chunk, garble_metadata, empty]


def tiny_config(**lora):
  c = config_lib.load("configs/tiny.py")
  c.lora.update(lora)
  return c


def tiny_settings(**lora) -> settings.Settings:
  return settings.from_config(tiny_config(**lora))


def identity_of(s: settings.Settings, shape=None) -> dict:
  return checkpoints.identity(s.model, s.lora, s.grpo.algorithm, shape)


def test_saved_steps_ignore_partial_and_set_aside_steps(tiny_run, tmp_path):
  workdir = copy_run(tiny_run, tmp_path)
  actor = checkpoints.actor_dir(workdir)
  (actor / "3.orbax-checkpoint-tmp-1234").mkdir()
  (actor / "7.corrupt").mkdir()
  assert checkpoints.saved_steps(workdir) == [1, 2]


def test_read_returns_every_adapter_and_the_step_metadata(tiny_run):
  saved = checkpoints.read(tiny_run, 2)
  r = tiny_config().model.random
  # 2 layers x 6 projections x (A, B)
  assert len(saved.params) == r.num_layers * 6 * 2
  assert "layers/0/attn/q_einsum/w_lora_a" in saved.params
  assert all(np.isfinite(v).all() for v in saved.params.values())
  assert saved.optimizer  # Adam moments and counters
  assert saved.custom_metadata["global_step"] == 2
  assert checkpoints.problem(tiny_run, 2) is None


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_a_damaged_step_is_reported_not_raised(tiny_run, tmp_path, corrupt):
  workdir = copy_run(tiny_run, tmp_path)
  corrupt(checkpoints.actor_dir(workdir) / "2")
  reason = checkpoints.problem(workdir, 2)
  assert reason and "\n" not in reason
  assert checkpoints.problem(workdir, 1) is None


def test_stale_read_callbacks_are_silenced_from_the_first_read(tiny_run, monkeypatch):
  """A failed read's in-flight callbacks post to Orbax's closed event loop,
  sometimes before the read's exception reaches us (CI saw the traceback), so
  the filter must be in place before any read starts, and drop nothing else."""
  passed_on = []
  monkeypatch.setattr(sys, "unraisablehook", passed_on.append)
  checkpoints.read(tiny_run, 2)
  stale = types.SimpleNamespace(exc_value=RuntimeError("Event loop is closed"))
  other = types.SimpleNamespace(exc_value=RuntimeError("something else"))
  sys.unraisablehook(stale)
  sys.unraisablehook(other)
  assert passed_on == [other]


def test_orphaned_tensorstore_read_errors_are_not_logged_from_the_first_read(tiny_run, tmp_path):
  """The other failed reads of a damaged checkpoint surface as asyncio's
  "Task exception was never retrieved", with a traceback (CI saw one in a
  run's stderr); those are dropped, every other asyncio error is kept."""
  import asyncio  # pylint: disable=g-import-not-at-top

  workdir = copy_run(tiny_run, tmp_path)
  corrupt = CORRUPTIONS[0]
  corrupt(checkpoints.actor_dir(workdir) / "2")
  with pytest.raises(Exception) as damaged:  # the error the other reads get too
    checkpoints.read(workdir, 2)

  logged = []
  handler = logging.Handler()
  handler.emit = logged.append
  logger = logging.getLogger("asyncio")
  logger.addHandler(handler)
  loop = asyncio.new_event_loop()
  try:
    for exc in (damaged.value, ValueError("a bug of our own")):
      loop.call_exception_handler({"message": "Task exception was never retrieved", "exception": exc})
    loop.call_exception_handler({"message": "Unclosed client session", "exception": damaged.value})
  finally:
    loop.close()
    logger.removeHandler(handler)
  assert [(r.getMessage().splitlines()[0], str(r.exc_info[1])) for r in logged] == [
      ("Task exception was never retrieved", "a bug of our own"),
      ("Unclosed client session", str(damaged.value)),
  ]


def test_a_damaged_latest_step_is_moved_aside_and_the_previous_used(tiny_run, tmp_path, caplog):
  workdir = copy_run(tiny_run, tmp_path)
  actor = checkpoints.actor_dir(workdir)
  truncate(actor / "2")
  files_before = sorted(p.relative_to(actor / "2") for p in (actor / "2").rglob("*"))
  with caplog.at_level(logging.WARNING):
    assert checkpoints.set_aside_unreadable(workdir).step == 1
  assert checkpoints.saved_steps(workdir) == [1]
  # Set aside, never deleted.
  assert sorted(p.relative_to(actor / "2.corrupt") for p in (actor / "2.corrupt").rglob("*")) == files_before
  assert any("step 2 is unreadable" in r.getMessage() and "resuming from step 1" in r.getMessage()
             for r in caplog.records)


def test_setting_aside_never_overwrites_an_earlier_corrupt_copy(tiny_run, tmp_path):
  workdir = copy_run(tiny_run, tmp_path)
  actor = checkpoints.actor_dir(workdir)
  (actor / "2.corrupt").mkdir()
  garble_metadata(actor / "2")
  assert checkpoints.set_aside_unreadable(workdir).step == 1
  assert (actor / "2.corrupt").is_dir() and (actor / "2.corrupt1" / "model_params").is_dir()


def test_without_move_nothing_is_renamed(tiny_run, tmp_path):
  workdir = copy_run(tiny_run, tmp_path)
  truncate(checkpoints.actor_dir(workdir) / "2")
  assert checkpoints.set_aside_unreadable(workdir, move=False).step == 1
  assert checkpoints.saved_steps(workdir) == [1, 2]


def test_when_no_step_is_readable_nothing_moves_and_the_user_is_told(tiny_run, tmp_path):
  workdir = copy_run(tiny_run, tmp_path)
  for step in (1, 2):
    garble_metadata(checkpoints.actor_dir(workdir) / str(step))
  with pytest.raises(errors.UserError, match=r"no checkpoint can be read \(step 2: JSONDecodeError"):
    checkpoints.set_aside_unreadable(workdir)
  assert checkpoints.saved_steps(workdir) == [1, 2]


def test_an_empty_workdir_has_nothing_to_resume(tmp_path):
  assert checkpoints.set_aside_unreadable(tmp_path / "new") is None


# --- run identity ------------------------------------------------------------


def test_identity_names_config_fields_so_a_mismatch_gives_the_override():
  ident = identity_of(tiny_settings(), {"num_layers": 2})
  assert ident["lora.rank"] == 4 and ident["grpo.algorithm"] == "grpo"
  assert ident["model.random.seed"] == 0  # random weights are part of the model
  assert ident["model shape num_layers"] == 2
  assert "model.random.seed" not in identity_of(settings.from_config(base.get_config()))


def test_run_json_round_trips_and_matching_config_passes(tmp_path, tiny_run):
  workdir = copy_run(tiny_run, tmp_path)
  ident = identity_of(tiny_settings(), {"num_layers": 2})
  checkpoints.write_identity(workdir, ident)
  assert checkpoints.saved_identity(workdir) == ident
  checkpoints.check_identity(workdir, ident)
  checkpoints.check_identity(workdir, identity_of(tiny_settings()))  # shape not known yet


SHIPPED = sorted(str(p) for p in pathlib.Path("configs").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", SHIPPED)
def test_every_shipped_configs_identity_reads_back_from_run_json_and_config_json(path, tmp_path):
  c = config_lib.load(path)
  ident = identity_of(settings.from_config(c), {"num_layers": 18})
  checkpoints.write_identity(tmp_path, ident)
  assert checkpoints.saved_identity(tmp_path) == ident
  checkpoints.compare_identity(tmp_path, checkpoints.saved_identity(tmp_path), ident)
  # A work directory from before run.json: the identity comes from its config.json.
  (tmp_path / checkpoints.RUN_FILE).unlink()
  config_lib.save(c, tmp_path / "config.json")
  assert checkpoints.saved_identity(tmp_path) == identity_of(settings.from_config(c))


@pytest.mark.parametrize("change, message", [
    ({"lora.rank": 8}, "lora.rank: 4 there, 8 here); use a new --workdir or resume with --config.lora.rank=4"),
    ({"grpo.algorithm": "dapo"}, "grpo.algorithm: 'grpo' there, 'dapo' here"),
    ({"model.random.seed": 1}, "--config.model.random.seed=0"),
    ({"model shape num_layers": 18}, "model shape num_layers: 2 there, 18 here); use a new --workdir"),
])
def test_a_different_run_is_refused_in_one_line(tiny_run, tmp_path, change, message):
  workdir = copy_run(tiny_run, tmp_path)
  saved = identity_of(tiny_settings(), {"num_layers": 2})
  checkpoints.write_identity(workdir, saved)
  with pytest.raises(errors.UserError) as e:
    checkpoints.check_identity(workdir, {**saved, **change})
  assert message in str(e.value) and "\n" not in str(e.value)


def test_a_workdir_without_run_json_is_checked_against_its_config_json(tiny_run, tmp_path):
  workdir = copy_run(tiny_run, tmp_path)
  (workdir / checkpoints.RUN_FILE).unlink(missing_ok=True)
  with pytest.raises(errors.UserError, match="lora.rank: 4 there, 8 here"):
    checkpoints.check_identity(workdir, identity_of(tiny_settings(rank=8)))


def test_a_workdir_without_checkpoints_accepts_any_config(tmp_path):
  checkpoints.write_identity(tmp_path, identity_of(tiny_settings()))
  checkpoints.check_identity(tmp_path, identity_of(tiny_settings(rank=8)))


def test_a_damaged_run_json_is_reported(tiny_run, tmp_path):
  workdir = copy_run(tiny_run, tmp_path)
  (workdir / checkpoints.RUN_FILE).write_text("{")
  with pytest.raises(errors.UserError, match="run.json: not valid JSON"):
    checkpoints.check_identity(workdir, identity_of(tiny_settings()))


# --- checkpoint against the model it is restored into -------------------------


@pytest.fixture(scope="module")
def tiny_model():
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  c = tiny_settings()
  mesh = mesh_lib.make_mesh(c.mesh)
  return c, mesh, model_loading.build(c.model, mesh)


@pytest.mark.parametrize("lora_change, message", [
    ({}, None),
    ({"rank": 8}, r"is \[.*4\] there, \[.*8\] here"),
    ({"targets": "q_einsum"}, r"adapter\(s\) this config lacks"),
])
def test_checkpoint_must_fit_the_adapters(tiny_run, tiny_model, lora_change, message):
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top

  c, mesh, loaded = tiny_model
  c = tiny_settings(**lora_change)
  actor = lora.apply(loaded.model, c.lora, mesh)
  saved = checkpoints.set_aside_unreadable(tiny_run, move=False)
  assert saved.step == 2
  if message is None:
    checkpoints.check_fits(tiny_run, saved, actor)
  else:
    with pytest.raises(errors.UserError, match=message):
      checkpoints.check_fits(tiny_run, saved, actor)
