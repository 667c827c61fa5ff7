"""What the evaluate and knockout stages compute from a trained run: the task metric (metrics), the
degeneracy checks (output_checks), and the run's own files as they read them (run_files:
config.json's settings, JSON records, model.pt, each checked)."""
