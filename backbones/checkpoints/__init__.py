"""Checkpoints: reading, downloading, loading into a backbone, exporting, and atomic file writes."""
