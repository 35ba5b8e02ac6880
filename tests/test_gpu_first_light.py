"""bench/gpu: the GPU call's checks hold on this CPU, and its figures meet the plan's."""

import json
import pathlib
import re
import sys

import pytest

from conftest import REPO
from conftest import run_python

sys.path.insert(0, str(REPO / "bench" / "gpu"))
sys.path.insert(0, str(REPO / "bench"))

import first_light  # pylint: disable=g-import-not-at-top,wrong-import-position
import tables  # pylint: disable=g-import-not-at-top,wrong-import-position


def run_part(part: str, tmp_path, *args) -> dict:
  """`first_light.py --part PART` as the GPU call runs it: a process of its own, one device."""
  result = tmp_path / "result.json"
  code = (f"import sys; sys.argv = ['first_light.py', '--part', {part!r}, '--work', {str(tmp_path)!r},"
          f" '--result', {str(result)!r}, *{list(args)!r}]\n"
          f"sys.path.insert(0, {str(REPO / 'bench' / 'gpu')!r})\n"
          "import first_light; first_light.main()\n")
  run_python(code, cwd=tmp_path)
  return json.loads(result.read_text())


@pytest.mark.slow
def test_the_pinned_stack_computes_the_committed_cpu_reference(tmp_path):
  # bench/gpu/cpu_reference.json was written by jax 0.11.2 (the GPU machine's
  # version) on a CPU; the GPU's loss, log-probs and gradient are held to it.
  result = run_part("loss", tmp_path)
  assert result["ok"], result["rel_diff"]
  assert result["values"]["grad_norm"] > 0 and result["values"]["kl"] > 0


@pytest.mark.torch
@pytest.mark.slow
def test_our_forward_equals_transformers_on_the_random_checkpoint(tmp_path):
  result = run_part("forward", tmp_path, "--shapes", "tiny")
  assert result["ok"], result
  assert result["max_abs_logit"] > 1.0  # weights large enough to show a mistake


@pytest.mark.parametrize("kind, chip", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("cpu", None), ("NVIDIA A100-SXM4-80GB", None),
])
def test_the_device_kind_names_the_planned_chip(kind, chip):
  assert first_light.chip_of(kind) == chip


@pytest.mark.parametrize("chip", ["h100", "h200"])
def test_every_chip_has_a_committed_plan_for_the_1b_config(chip):
  plan = first_light.predicted(chip, first_light.PROMPTS)
  assert plan["fits"] and plan["decode_s_per_token"] > 0 and plan["update_flops"] > 0
  big = first_light._planned_big_batch(chip)  # pylint: disable=protected-access
  assert big and big > first_light.PROMPTS
  assert first_light.predicted(chip, big)["peak_device_bytes"] > plan["peak_device_bytes"]


def test_measured_figures_sit_beside_the_prediction_with_their_ratio():
  rows = first_light.beside({"update_s": 0.3, "decode_s_per_token": 0.002},
                            {"update_s": 0.03, "decode_s_per_token": 0.0005})
  assert [(r["figure"], round(r["ratio"], 6)) for r in rows] == [("decode_s_per_token", 4.0), ("update_s", 10.0)]
  assert first_light.beside({"step_s": 1.0}, None)[0]["ratio"] is None


def test_benchmarks_table_reads_a_gpu_runs_json(tmp_path, monkeypatch):
  run = {"smoke": False, "date": "2027-01-01", "stack": {
      "device_kind": "NVIDIA H100 80GB HBM3", "versions": {"jax": "0.11.2", "flax": "0.12.12",
                                                          "torch": "2.11.0", "transformers": "5.17.0"}},
         "forward_1b": {"highest": {"max_rel_diff": 2e-6, "argmax_agree": 1.0},
                        "default": {"max_rel_diff": 3e-3, "argmax_agree": 1.0}},
         "loss": {"rel_diff": {"loss": 1e-6, "logps": 2e-6}},
         "train": {"tis": {"ratio_mean": 1.001, "ratio_min": 0.9, "ratio_max": 1.2}},
         "measured_vs_predicted": {"4": first_light.beside({"update_s": 0.06}, {"update_s": 0.03})}}
  (tmp_path / "2027-01-01").mkdir()
  (tmp_path / "2027-01-01" / "first_light.json").write_text(json.dumps(run))
  (tmp_path / "rehearsal").mkdir()
  (tmp_path / "rehearsal" / "first_light.json").write_text(json.dumps({"smoke": True}))
  monkeypatch.setattr(tables, "REPO", tmp_path)  # links are made relative to the repository
  text = tables.gpu(tmp_path)
  assert text.startswith("NVIDIA H100 80GB HBM3, 2027-01-01: jax 0.11.2")
  assert "| forward vs transformers, 1b shapes, float32 | max diff 2.0e-06" in text
  assert "| 4 | update_s | 0.060 s | 0.030 s | 2.0 |" in text
  assert "mean 1.0010, min 0.900, max 1.200" in text


def test_the_carried_wheels_are_the_versions_the_project_resolves():
  pyproject = (REPO / "pyproject.toml").read_text()
  wheels = [line for line in (REPO / "bench" / "gpu" / "wheels.txt").read_text().splitlines()
            if line and not line.startswith("#")]
  for wheel in wheels:
    name, version = wheel.split("==")
    pinned = re.search(rf'"{re.escape(name)}==([\w.]+)"', pyproject, re.I)  # pinned at both ends
    if pinned:
      assert pinned[1] == version, wheel
  assert any(w.startswith("google-tunix==") for w in wheels) and any(w.startswith("flax==0.12.1") for w in wheels)


def test_the_rehearsal_ran_the_whole_call_and_stayed_small():
  log = (REPO / "docs" / "results" / "gpu" / "rehearsal" / "first_light.txt").read_text()
  assert "no part failed" in log
  travelled = float(re.search(r"travels: .* = ([\d.]+) MiB of 64 MiB", log)[1])
  assert travelled < 48
  result = json.loads((REPO / "docs" / "results" / "gpu" / "rehearsal" / "first_light.json").read_text())
  assert result["smoke"] and result["stack"]["versions"]["jax"] == "0.11.2"
  assert pathlib.Path(REPO / "bench" / "gpu" / "run.sh").exists()
