"""MEDUSA training: pure losses (losses.py), run building blocks (setup.py), checkpoints, the loop (train.py)."""
