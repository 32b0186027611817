"""Floor 2, images to batches: decoding (`images`), datasets made with their transform
(`datasets`), the transforms and `create_transform`, MixUp/CutMix (`mixup`), loaders, and the
in-memory batch pipeline (`batch_pipeline`, with its RandAugment on whole batches,
`batch_randaugment`). Knows models only by their `Preprocess`."""

import os

# albumentations asks PyPI for its latest version at every import (up to 2 s, and a warning
# line on every command when offline or outdated) unless this is set: a library's import
# should not reach the network. A value the user set stays.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
