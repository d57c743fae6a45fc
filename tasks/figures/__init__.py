"""Figures: ``attention`` draws super tokens and attention maps from the model's own forward pass;
``predictions`` draws a model's predictions over the images.
"""
