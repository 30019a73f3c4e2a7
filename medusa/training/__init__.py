"""MEDUSA training: the loop (loop.py) over medusa1.py / medusa2.py, pure losses (losses.py), shared run
building blocks (setup.py), MEDUSA-2's backbone setup and merge (backbone.py), schedules, checkpoints."""
