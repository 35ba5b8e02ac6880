"""Imported by the fork server of tests/forked_cli.py: parses the offline Gemma
tokenizer once, before any run is forked.

Every forked run then finds it in tokenizer.load's cache instead of spending
about a second parsing its 262,144 pieces (docs/results/suite_time.txt,
stop 56). Converting the offline model here, when it is missing, is what the
first run would do anyway, under the same lock.
"""

from gemma_grpo import config
from gemma_grpo.config import settings
from gemma_grpo.model import model_loading
from gemma_grpo.model import tokenizer

tokenizer.load(model_loading.offline_270m_dir(settings.from_config(config.defaults()).model))
