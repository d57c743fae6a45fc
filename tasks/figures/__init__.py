"""Figures: ``attention_run`` records the attention a backbone computes in its own forward pass on prepared
images and draws it as ``pictures`` gives the family's record kind, on ``attention``'s panels; ``curves`` draws
training curves from the CSV logs; ``predictions`` draws a model's predictions over the images.
"""
