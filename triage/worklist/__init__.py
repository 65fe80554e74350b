"""The worklist: signatures, evidence, trends, regression cases, review views."""
