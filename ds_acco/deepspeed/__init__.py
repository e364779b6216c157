"""Layer 4, the DeepSpeed front end: ``ds_acco.initialize`` and the engines it builds.

Owns the reading of a DeepSpeed config's ``"acco"`` block and the checks of the rest of the file, the ZeRO-1 engine
whose steps run as ACCO rounds, the stage-0 engine that trains Streaming DiLoCo replicas, their checkpoints (DeepSpeed's
layout plus ds_acco's files, verified, with elastic re-partitioning), the HF Trainer hook and the clean-up of
DeepSpeed's shared-memory segments.

May import: layers 0-3, torch and deepspeed; it is the only package that imports deepspeed. Never ``ds_acco.fsdp`` or
``ds_acco.plain``.
"""
