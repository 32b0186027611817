"""Floor 6, what the command lines share: flags and their one-line errors (`flags`), and the
model argument of every command, with its wording (`model_argument`). Only the command lines
(`vit.train`, `vit.evaluate`, `vit.predict`, `vit.export`, `vit.benchmark`) import it."""
