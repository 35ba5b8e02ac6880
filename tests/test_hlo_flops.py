"""Loop-aware matmul FLOPs: a scanned program counts as its unrolled twin."""

import jax
import jax.numpy as jnp
import pytest

from gemma_grpo.plan import hlo_flops

X = jax.ShapeDtypeStruct((64, 96), jnp.float32)
W = jax.ShapeDtypeStruct((96, 96), jnp.float32)
ONE_PRODUCT = 2 * 64 * 96 * 96  # by hand: 2 x rows x width x width


def count(fn, *args):
  return hlo_flops.count(jax.jit(fn).lower(*args).as_text(dialect="hlo"))


def scanned(x, w):
  y, _ = jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=7)
  return y @ w


def unrolled(x, w):
  for _ in range(7):
    x = jnp.tanh(x @ w)
  return x @ w


def test_a_scan_counts_every_iteration_like_its_unrolled_twin():
  scan, flat = count(scanned, X, W), count(unrolled, X, W)
  assert scan.flops == flat.flops == 8 * ONE_PRODUCT
  assert scan.flops_bodies_once == 2 * ONE_PRODUCT  # the body once, plus the product after it
  assert scan.unknown_trip_loops == 0


def test_the_bodies_once_count_is_what_the_compiler_reports():
  compiled = jax.jit(scanned).lower(X, W).compile().cost_analysis()
  assert count(scanned, X, W).flops_bodies_once == pytest.approx(compiled["flops"], rel=0.05)


def test_nested_loops_multiply_and_remat_is_not_double_counted_before_optimisation():
  def nested(x, w):
    def outer(c, _):
      inner, _ = jax.lax.scan(lambda d, _: (d @ w, None), c, None, length=3)
      return inner, None
    y, _ = jax.lax.scan(jax.checkpoint(outer), x, None, length=5)
    return y
  assert count(nested, X, W).flops == 15 * ONE_PRODUCT


def test_a_data_dependent_loop_counts_one_iteration_and_says_so():
  def until_small(x, w):
    return jax.lax.while_loop(lambda c: jnp.abs(c).sum() > 1.0, lambda c: c @ w * 0.5, x)
  result = count(until_small, X, W)
  assert result.flops == ONE_PRODUCT
  assert result.unknown_trip_loops == 1


def test_batched_and_multi_axis_contractions():
  a = jax.ShapeDtypeStruct((4, 8, 16, 32), jnp.float32)
  b = jax.ShapeDtypeStruct((4, 16, 32, 24), jnp.float32)
  result = count(lambda a, b: jnp.einsum("bsij,bijo->bso", a, b), a, b)
  assert result.flops == 2 * (4 * 8 * 24) * (16 * 32)


def test_a_conditional_counts_its_dearer_branch():
  def branchy(x, w):
    return jax.lax.cond(x.sum() > 0, lambda: x @ w @ w, lambda: x)
  assert count(branchy, X, W).flops == 2 * ONE_PRODUCT
