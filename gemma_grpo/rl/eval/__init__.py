"""Evaluation in one place: problems, generation, scoring, reports, and the in-training eval."""
