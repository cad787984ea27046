"""Learned drafter modules trained from the target alone (self-distillation): Medusa heads.

`medusa.py` holds the module and its file format (MLX only, imported by drafters/medusa.py);
`train.py` records the target's own answers and fits the heads (imported by the CLI).
"""
