"""The demo checkpoint: random weights shaped like ERNIE-4.5-0.3B-PT and its tokenizer, made where no
weights can be had.

Kept import-light: it runs inside the engine's own environment too."""
