"""The defaults, kept for config files that begin `from configs import base`; new ones use gemma_grpo.config.defaults()."""

from gemma_grpo import config


def get_config():
  return config.defaults()
