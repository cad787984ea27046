"""Learned drafter modules: Medusa and EAGLE heads trained from the target alone (self-distillation), and
the multi-token-prediction block a model ships with (mtp.py, read from its GGUF).

`medusa.py` and `eagle.py` hold the modules and their file format (MLX only, imported by drafters/);
`train.py` and `eagle_train.py` record the target's own answers and fit the heads (imported by the CLI).
"""
