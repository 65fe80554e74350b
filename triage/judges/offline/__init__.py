"""The judges' evidence floor: what strings alone tell, no model (text, declines, grounding,
contradictions, containment, a check run's evidence). It imports neither the model floor nor a judge."""
