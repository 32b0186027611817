"""Floor 2, images to batches: decoding (`images`), datasets made with their transform
(`datasets`), the transforms and `create_transform`, MixUp/CutMix (`mixup`), loaders, and the
in-memory batch pipeline (`batch_pipeline`, with its RandAugment on whole batches,
`batch_randaugment`). Knows models only by their `Preprocess`."""
