"""Training beside the model: our loop against mmengine's Runner (``loop``), the train set's start-up and the
data scan at COCO train2017 scale (``startup``, ``data_scan``), and a config's training step compiled against
eager (``compile_step``)."""
