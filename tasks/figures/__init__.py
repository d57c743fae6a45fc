"""Figures: ``attention`` draws super tokens and attention maps from the model's own forward pass, which
``attention_run`` records on prepared images; ``curves`` draws training curves from the CSV logs;
``predictions`` draws a model's predictions over the images.
"""
