"""Calibration: how far the job's verdicts agree with people's labels (`calibrate`, `queue`, `eval`)."""
