"""The run's slot: one object owns a run's evaluation (run_slot.py)."""
