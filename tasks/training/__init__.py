"""Training: the Lightning module around an mm detector / segmentor and everything that runs the loop.

``module`` (``MMTaskModule``: steps, optimisers, the non-finite-loss decision) with its ``detection`` and
``segmentation`` subclasses; ``trainer`` builds the ``lightning.Trainer`` from the config; ``optim`` (mm's
optimizers and schedules), ``nonfinite``, ``callbacks`` (RNG states, BN buffers, finite weights), ``restart``
(preemption, requeue, elastic restarts), ``progress``, ``trackers`` and ``checkpoint_io`` (atomic writes) are the
parts it is made of.
"""
