"""`gemma-grpo plan`: the training step compiled for a TPU or NVIDIA slice, on any machine.

  chips     the slices and their chips' public figures
  devices   the slice's devices as its compiler describes them; the mesh over them
  shapes    the policy and reference as shapes and shardings, built by the trainer's code
  programs  the step's four programs (update, reference, prefill, decode), lowered
  hlo_flops matmul FLOPs with every loop counted as often as it runs
  analysis  one compiled program's memory, FLOPs and time bounds on one device
  planner   the step: compile, judge (fits?), bound its time
  split     a predicted layout: the rollout and the update on disjoint device groups
  report    the plan as text
  command   the CLI
"""
