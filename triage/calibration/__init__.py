"""Measuring the verdicts against people: the review queue, calibration and the evaluation set."""
