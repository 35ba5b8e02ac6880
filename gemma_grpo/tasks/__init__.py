"""Problems and their grading: data sources, prompts, answer extraction, rewards, tools, scores."""
