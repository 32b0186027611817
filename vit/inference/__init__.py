"""Floor 4, using a trained model: evaluation, test-time augmentation, precision, the embedding
engine, kNN and linear probes, and the predict job (the work of `python -m vit.predict`)."""
