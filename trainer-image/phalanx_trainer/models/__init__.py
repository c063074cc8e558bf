"""Models the trainer ships (a GPT-style transformer and an MLP) and the `module:function` hook."""

from phalanx_trainer.models.registry import build_model, load_object, model_flops_per_token, parallelize_plan

__all__ = ["build_model", "load_object", "model_flops_per_token", "parallelize_plan"]
