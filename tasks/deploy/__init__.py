"""Deployment: what happens to a trained model after training.

``checkpoints`` reads training checkpoints (ours and mm's format) and the config they carry; ``export`` writes the
backbone or the whole model; ``inference`` predicts on images as mm's inferencers do; ``submission`` writes the
test-server files.
"""
