"""Floor 4, using a trained model: evaluation, test-time augmentation, precision, the embedding
engine, kNN and linear probes, and prediction (the work of `python -m vit.predict`)."""
