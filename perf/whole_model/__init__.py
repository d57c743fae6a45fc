"""A config's whole detector / segmentor next to the Swin-T config of its task (``tools/benchmark.py
--config``): the models as training builds them (``subject``), the measurement (``bench``) and its table
(``table``)."""
