"""runtime/backend.py: CPU-tuned layouts and the LM head's screen only where programs run on a CPU."""

import jax
import jax.numpy as jnp
import pytest

import conftest
from gemma_grpo.config import settings
from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.runtime import backend
from gemma_grpo.seam import jax_mesh


def _program(fn, *shapes) -> str:
  return jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)).as_text()


def _tpu_mesh():
  """A mesh of a v5e-8's devices, as `gemma-grpo plan` builds one on this CPU (no TPU needed)."""
  pytest.importorskip("libtpu", reason="the plan extra (libtpu) is not installed")
  from gemma_grpo.plan import chips  # pylint: disable=g-import-not-at-top
  from gemma_grpo.plan import devices  # pylint: disable=g-import-not-at-top

  return devices.mesh_for(settings.MeshSettings(fsdp=-1, tp=1), devices.for_topology(chips.topology("v5e-8")))


def test_the_target_is_this_process_unless_the_mesh_is_a_slices():
  assert backend.target_platform() == "cpu"
  with jax_mesh.tunix_mesh(conftest.device_mesh(2, 1)):
    assert backend.on_cpu()
  with jax_mesh.tunix_mesh(_tpu_mesh()):
    assert backend.target_platform() == "tpu" and not backend.on_cpu()
  assert backend.on_cpu()


@pytest.mark.parametrize("fn, shapes", [
    (decode_dots.project, ((8, 64), (128, 64))),
    (decode_dots.head_logits, ((8, 64), (512, 64))),
])
def test_decode_products_take_the_cpu_layout_only_for_a_cpu(fn, shapes):
  assert "optimization_barrier" in _program(fn, *shapes)
  with jax_mesh.tunix_mesh(_tpu_mesh()):
    assert "optimization_barrier" not in _program(fn, *shapes)
  assert "optimization_barrier" in _program(fn, *shapes)  # no trace was shared


def test_auto_screens_only_on_a_cpu_with_a_bfloat16_matrix_unit(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("flags\t\t: fpu avx512_bf16 amx_bf16 amx_tile\n")
  assert lm_head_screen.screen_pays_off(str(cpuinfo))
  with jax_mesh.tunix_mesh(_tpu_mesh()):
    assert not lm_head_screen.screen_pays_off(str(cpuinfo))
