"""Example training scripts (GPT-2 on Shakespeare through DeepSpeed, FSDP2 and plain PyTorch).

Not part of the installed package; ``launchers/`` run them from a checkout. May import
``ds_acco``, never ``benchmarks``.
"""
