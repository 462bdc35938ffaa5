"""Learn a model's memory from its own code: `zlayout learn --hf-config PATH`.

The transformers class a config.json names is built on the meta device (no storage, nothing
downloaded) with the attention implementation transformers would train it with, and a few
of its blocks run forward and backward at several token counts under a dispatch mode that
records every storage's allocation and free (`trace`). What it records becomes a model card
(`card`): the parameter tensors, each block's requests per phase as functions of the token
count, the head and loss, and each op's work. The planner reads cards as data
(`zlayout.core.card`, `zlayout.cards`) without torch.

With `zlayout.verify`, the only code that imports torch or transformers.
"""
