"""Floor 2, other people's files: reading, loading and saving weights (`weights`), one key map per
foreign layout (`layouts/`), exports to ONNX, transformers and torchvision, each checked by the
library it is for, and the ONNX runtime model."""
