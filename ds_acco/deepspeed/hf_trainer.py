"""The end of an HF ``Trainer.train()`` drains and commits ACCO's rounds, with no change to the script.

Transformers' Trainer builds the DeepSpeed engine inside ``train()`` (through Accelerate, which calls
``deepspeed.initialize``) and never tells it that training ended, so the last round would stay in flight: the learning
rate one commit short and, for a Streaming DiLoCo run, replicas that are not the global model. When
``ds_acco.initialize`` builds an ACCO engine while ``transformers.trainer`` is loaded, it wraps
``Trainer._finalize_training`` (called once after the training loop, before the final metrics, best-model loading and
``on_train_end`` callbacks) so that it first calls :func:`finish_training` on the Trainer's engine. The wrapper is
installed on the class at that moment, which is still inside the ``train()`` call that needs it: the method is looked up
when the loop ends.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

logger = logging.getLogger("ds_acco")


def finish_training(engine: Any) -> None:
    """Commit everything accumulated; a streaming engine's replicas become the global model (every rank)."""
    if getattr(engine, "acco", None) is None:
        return
    engine.finish()
    consolidate = getattr(engine, "consolidate", None)
    if consolidate is not None:
        consolidate()


def install_trainer_hook() -> None:
    """Wrap ``transformers.Trainer._finalize_training`` once, if transformers' Trainer is loaded."""
    module = sys.modules.get("transformers.trainer")
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return
    original = getattr(trainer, "_finalize_training", None)
    if original is None:
        logger.warning("ds_acco: this transformers release has no Trainer._finalize_training; call "
                       "trainer.model_wrapped.finish() after trainer.train() to commit the last round")
        return
    if getattr(original, "_ds_acco_finishes", False):
        return

    @functools.wraps(original)
    def _finalize_training(self, *args, **kwargs):
        finish_training(getattr(self, "model_wrapped", None))
        return original(self, *args, **kwargs)

    _finalize_training._ds_acco_finishes = True
    trainer._finalize_training = _finalize_training
